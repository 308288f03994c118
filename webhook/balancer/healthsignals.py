"""Health signals as faults: the PromQL that finds them in DCGM's series, and the API's own (pure).

Each signal becomes :class:`Fault` values naming a node, a physical GPU (its NVML UUID) and
when the fault began. From dcgm-exporter, through Prometheus (metric semantics in
``../shared/reference/gpu-health-and-usage.md`` section 2):

- ``DCGM_FI_DEV_XID_ERRORS`` is a *gauge of the last XID*, not a count: the exporter labels each
  value with ``err_code``, so a new XID is a new series, and a repeat of the same XID is invisible
  (the value does not move). An XID event is therefore a series that appeared within the look-back
  and did not exist just before it; its time is the first sample's, read with ``timestamp()``
  through a subquery (``timestamp`` keeps sample times only when applied to a selector). A
  known time makes the event the same event on every pass and for every leader, so it is never
  counted twice, and one that began before a device returned is not held against it again.
- ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (off in the exporter's default counters) is a counter: the
  events are its increases within the look-back, and their time the last increase's.
- ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` (on by default) is a condition: 1 while remapping has failed.

Series are grouped by node and ``UUID`` before anything else: dcgm-exporter labels a GPU's
series with the pod using it, and its MIG instances with ``GPU_I_ID``; both fold into the
physical GPU, which is what is quarantined. The node's name is in ``Hostname`` (released
exporters) or ``hostname`` (the next one), copied into ``node`` as the utilization query does.

From the API: NVIDIA's DRA driver taints a device ``gpu.nvidia.com/xid=<n>`` or
``gpu.nvidia.com/gpu-lost`` (a condition while the taint is there), and the kubelet's device
manager keeps a device the plugin reports unhealthy in ``capacity`` but not in ``allocatable``
(a condition with no GPU named: the plugin does not say which).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook import names
from webhook.kube import slices


@dataclass(frozen=True, slots=True, order=True)
class Fault:
    """One observed fault of one GPU (``gpu`` empty: some GPU of ``node``, the device plugin's case)."""

    node: str
    """The node's name (dcgm-exporter's host, mapped through the node's host names)."""
    gpu: str
    """The physical GPU's NVML UUID; empty when the fault names none."""
    signal: str
    code: int = 0
    """The XID (``xid``, ``driver-taint``; 0 for the driver's ``gpu-lost``); 0 otherwise."""
    at: float = 0.0
    """Unix seconds the event happened (events only; conditions hold now)."""
    count: int = 1

    def describe(self) -> str:
        """What a person reads in an Event, a log line and ``gpugate health``."""
        if self.signal == "xid":
            return f"XID {self.code}"
        if self.signal == "ecc-dbe":
            return f"{self.count} double-bit ECC error{'s' if self.count != 1 else ''}"
        if self.signal == "row-remap-failure":
            return "row remapping failed"
        if self.signal == "driver-taint":
            return f"DRA driver taint {names.DRA_XID_TAINT_KEY}={self.code}" if self.code else \
                f"DRA driver taint {names.DRA_GPU_LOST_TAINT_KEY}"
        return f"device plugin reports {self.count} unhealthy GPU{'s' if self.count != 1 else ''}"

    def slug(self) -> str:
        """The taint's value: a label value (``xid-79``, ``ecc-dbe``)."""
        return f"{self.signal}-{self.code}" if self.code else self.signal


XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
DBE_METRIC = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE_METRIC = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
GROUP = "node, UUID"
"""What every series is folded into first: the node and the physical GPU."""


def _seconds(value: float) -> str:
    return f"{max(int(math.ceil(value)), 1)}s"


def _host_and_gpu(expression: str) -> str:
    """``expression`` with the host copied into ``node`` (either spelling) and ``uuid`` into ``UUID``."""
    for label in ("Hostname", "hostname"):
        expression = f'label_replace({expression}, "node", "$1", "{label}", "(.+)")'
    return f'label_replace({expression}, "UUID", "$1", "uuid", "(.+)")'


def xid_query(lookback: float, step: float) -> str:
    """Per node, GPU and XID that first appeared within ``lookback``: the first sample's time.

    The subquery's steps are aligned to multiples of ``step``, so a series scraped since the last
    one has no point in it yet: ``or timestamp(...)`` finds it at once, with its latest sample's
    time (a later pass reads the earlier, first one: an XID is never found late for the step).
    """
    selector = f'{XID_METRIC}{{err_code!="0"}}'
    window, resolution = _seconds(lookback), _seconds(step)
    first = _host_and_gpu(f"min_over_time(timestamp({selector})[{window}:{resolution}]) or timestamp({selector})")
    before = _host_and_gpu(f"{selector} offset {window}")
    return (f"min by ({GROUP}, err_code) ({first}) unless on ({GROUP}, err_code) "
            f"count by ({GROUP}, err_code) ({before})")


def dbe_queries(lookback: float, step: float) -> tuple[str, str]:
    """Per node and GPU: double-bit errors counted within ``lookback``, and the last increase's time."""
    window, resolution = _seconds(lookback), _seconds(step)
    rise = f"({DBE_METRIC} - {DBE_METRIC} offset {resolution})"
    counted = _host_and_gpu(f"sum_over_time(clamp_min({rise}, 0)[{window}:{resolution}])")
    latest = _host_and_gpu(f"max_over_time((timestamp({DBE_METRIC}) and {rise} > 0)[{window}:{resolution}])")
    count = f"sum by ({GROUP}) ({counted}) > 0"
    last = f"max by ({GROUP}) ({latest})"
    return count, last


def row_remap_query() -> str:
    return f"max by ({GROUP}) ({_host_and_gpu(ROW_REMAP_FAILURE_METRIC)}) > 0"


def series(answer: Any) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of an instant query's vector, NaN and infinities left out."""
    out = []
    for item in answer or ():
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            out.append((dict(item.get("metric") or {}), value))
    return out


def _node_of(labels: Mapping[str, str], hosts: Mapping[str, str]) -> tuple[str, str] | None:
    host, gpu = labels.get("node", ""), labels.get("UUID", "")
    node = hosts.get(host)
    return None if node is None or not gpu else (node, gpu)


def xid_faults(answer: Any, hosts: Mapping[str, str]) -> list[Fault]:
    """Faults from :func:`xid_query`'s answer; ``hosts`` maps an exporter's host name to its node."""
    out = []
    for labels, first in series(answer):
        found = _node_of(labels, hosts)
        code = labels.get("err_code", "")
        if found and code.isdigit() and int(code):
            out.append(Fault(node=found[0], gpu=found[1], signal="xid", code=int(code), at=first))
    return out


def dbe_faults(counts: Any, lasts: Any, hosts: Mapping[str, str]) -> list[Fault]:
    """Faults from :func:`dbe_queries`' two answers (a GPU needs both: a count and a time)."""
    when = {(labels.get("node"), labels.get("UUID")): value for labels, value in series(lasts)}
    out = []
    for labels, count in series(counts):
        found = _node_of(labels, hosts)
        at = when.get((labels.get("node"), labels.get("UUID")))
        if found and at is not None and count >= 1:
            out.append(Fault(node=found[0], gpu=found[1], signal="ecc-dbe", at=at, count=int(round(count))))
    return out


def row_remap_faults(answer: Any, hosts: Mapping[str, str]) -> list[Fault]:
    out = []
    for labels, _ in series(answer):
        found = _node_of(labels, hosts)
        if found:
            out.append(Fault(node=found[0], gpu=found[1], signal="row-remap-failure"))
    return out


def driver_taint_faults(found: Iterable[slices.Slice]) -> list[Fault]:
    """The NVIDIA DRA driver's health taints, on full GPUs and on MIG devices (named by their parent)."""
    out = set()
    for piece in found:
        if piece.driver != names.DRA_DRIVER or not piece.node:
            continue
        for device in piece.devices:
            gpu = device.parent_uuid or device.uuid
            for taint in device.taints:
                if taint.key == names.DRA_GPU_LOST_TAINT_KEY:
                    out.add(Fault(node=piece.node, gpu=gpu, signal="driver-taint"))
                elif taint.key == names.DRA_XID_TAINT_KEY and taint.value.isdigit():
                    out.add(Fault(node=piece.node, gpu=gpu, signal="driver-taint", code=int(taint.value)))
    return sorted(out)


def plugin_faults(unhealthy: Mapping[str, int]) -> list[Fault]:
    """Per node, the GPUs the device plugin reports unhealthy (capacity minus allocatable)."""
    return [Fault(node=node, gpu="", signal="plugin-unhealthy", count=n) for node, n in sorted(unhealthy.items())
            if n > 0]
