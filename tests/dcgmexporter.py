"""A DCGM exporter endpoint for tests: the text NVIDIA's dcgm-exporter serves, from GPUs we describe.

Nothing here decides what the balancer reads: Prometheus scrapes this page and evaluates the
queries. So the page must be what dcgm-exporter writes, byte for byte in what matters to a
scrape. Sources (NVIDIA/dcgm-exporter at release tag ``4.5.3-4.8.2``):

- ``internal/pkg/rendermetrics/render_metrics.go`` (``gpuMetricsFormat``): per metric a
  ``# HELP <field> <help>`` and a ``# TYPE <field> <type>`` line, then one line per entity with
  the labels in this order: ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, then
  ``GPU_I_PROFILE`` and ``GPU_I_ID`` for a MIG GPU instance, ``Hostname`` (``hostname`` from
  commit d5e5f51 on, not yet released), then the "label" counters (``DCGM_FI_DRIVER_VERSION``)
  and the attributes (the pod's), each set in sorted key order (Go templates range maps sorted).
- ``etc/default-counters.csv``: ``DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).``,
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.`` and
  ``DCGM_FI_DRIVER_VERSION, label, Driver Version``.
- ``etc/default-counters.csv``: ``DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error
  encountered.``: a gauge holding the last XID's code (0: none yet), not a count. ``toMetric`` in
  ``internal/pkg/collector/gpu_collector.go`` gives it the attributes ``err_code`` (the code) and
  ``err_msg`` (``xidErrCodeToText`` in ``internal/pkg/collector/xid_errors.go``), so a new XID
  code is a new series, not a step of the old one.
- ``internal/pkg/collector/gpu_collector.go`` (``toMetric``, ``toString``): ``gpu`` is the GPU's
  index, ``device`` is ``nvidia<index>``, ``UUID`` the parent GPU's UUID (also on its MIG
  instances), ``GPU_I_ID`` the NVML instance id; a double is printed with ``%f`` (``0.420000``),
  an integer with ``%d``; a blank value (a field the entity does not support) writes no line.
- ``internal/pkg/devicemonitoring/device_monitoring.go`` (``monitorAllGPUInstances``), with the
  default ``--devices f`` (``pkg/cmd/app.go``): a GPU in MIG mode is exported as its GPU
  instances only, a GPU without instances as itself. ``DCGM_FI_DEV_GPU_UTIL`` is blank on a GPU
  instance (NVML has no per-instance utilization), so MIG instances have profiling metrics only.
- ``internal/pkg/transformation/const.go`` and ``kubernetes.go``: while a pod holds the device,
  the attributes ``pod``, ``namespace`` and ``container`` name it.
- ``internal/pkg/server/server.go`` (``Metrics``): no Content-Type is set, so Go's net/http
  sniffs ``text/plain; charset=utf-8``.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GR_ENGINE_ACTIVE = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.")
GPU_UTIL = ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).")
XID_ERRORS = ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
DBE_VOLATILE = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.")
ROW_REMAP_FAILURE = ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed")
XID_MESSAGES = {0: "No Error", 13: "Graphics Engine Exception", 43: "GPU stopped processing",
                48: "Double Bit ECC Error", 64: "ECC page retirement or row remapper recording failure",
                74: "NVLINK Error", 79: "GPU has fallen off the bus", 94: "Contained ECC error",
                95: "Uncontained ECC error", 119: "GSP RPC Timeout", 120: "GSP Error"}
"""``xidErrCodeToText`` (``internal/pkg/collector/xid_errors.go``) for the codes tests use."""
DRIVER_VERSION = "580.95.05"
H100 = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True, slots=True, kw_only=True)
class Pod:
    """The pod dcgm-exporter's Kubernetes transformation attributes a device to."""

    name: str
    namespace: str
    container: str = "main"


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One entity dcgm-exporter exports: a whole GPU, or one GPU instance of a GPU in MIG mode."""

    host: str
    gpu: int
    model: str = H100
    mig_profile: str = ""
    """``GPU_I_PROFILE`` (``1g.10gb``); empty for a whole GPU."""
    instance: int = 0
    """``GPU_I_ID``, the NVML GPU instance id (only written with a profile)."""
    host_label: str = "Hostname"
    """``Hostname`` (released exporters) or ``hostname`` (the next one)."""
    pod: Pod | None = None

    @property
    def uuid(self) -> str:
        """A stable UUID per host and GPU index, shaped like NVML's ``GPU-<8-4-4-4-12 hex>``."""
        digest = hashlib.sha256(f"{self.host}/{self.gpu}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.gpu:02X}:00.0"


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """What one device reports now: engine activity (0..1) and, for a whole GPU, GPU_UTIL (0..100)."""

    device: Device
    active: float | None
    """None: no profiling metrics (a pre-Volta GPU: DCGM's DCP fields are blank there)."""
    util: int | None = None
    """None: ``active`` in percent for a whole GPU; never written for a MIG instance."""
    xid: int | None = None
    """``DCGM_FI_DEV_XID_ERRORS``: the last XID code (0: none); None: the field is not exported."""
    dbe: int | None = None
    """``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (off in the exporter's default counters); None: not exported."""
    row_remap_failure: int | None = None
    """``DCGM_FI_DEV_ROW_REMAP_FAILURE``: 1 once remapping failed; None: not exported."""

    @property
    def util_text(self) -> str | None:
        if self.device.mig_profile:
            return None
        if self.util is not None:
            return str(self.util)
        return None if self.active is None else str(round(self.active * 100))


def whole_gpus(host: str, active: Sequence[float | None], **fields: object) -> list[Reading]:
    """A node's whole GPUs with the given activities (GPU_UTIL as the same share in percent)."""
    return [Reading(device=Device(host=host, gpu=i, **fields), active=a) for i, a in enumerate(active)]  # type: ignore[arg-type]


def mig_gpu(host: str, gpu: int, profile: str, active: Sequence[float], **fields: object) -> list[Reading]:
    """One GPU in MIG mode cut into ``len(active)`` instances of ``profile`` (GPU_I_ID 1, 2, ...)."""
    return [Reading(device=Device(host=host, gpu=gpu, mig_profile=profile, instance=1 + i, **fields), active=a)  # type: ignore[arg-type]
            for i, a in enumerate(active)]


def _labels(device: Device, attributes: dict[str, str] | None = None) -> str:
    parts = [f'gpu="{device.gpu}"', f'UUID="{device.uuid}"', f'pci_bus_id="{device.pci_bus_id}"',
             f'device="nvidia{device.gpu}"', f'modelName="{device.model}"']
    if device.mig_profile:
        parts += [f'GPU_I_PROFILE="{device.mig_profile}"', f'GPU_I_ID="{device.instance}"']
    if device.host:
        parts.append(f'{device.host_label}="{device.host}"')
    parts.append(f'DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"')
    attributes = dict(attributes or {})
    if device.pod is not None:
        attributes |= {"container": device.pod.container, "namespace": device.pod.namespace, "pod": device.pod.name}
    parts += [f'{k}="{v}"' for k, v in sorted(attributes.items())]
    return ",".join(parts)


def render(readings: Iterable[Reading]) -> str:
    """The /metrics page for these readings, as dcgm-exporter's gpuMetricsFormat writes it."""
    readings = list(readings)
    out: list[str] = []
    for (name, kind, help_text), lines in (
            (GPU_UTIL, [(_labels(r.device), r.util_text) for r in readings if r.util_text is not None]),
            (GR_ENGINE_ACTIVE, [(_labels(r.device), f"{r.active:f}") for r in readings if r.active is not None]),
            (XID_ERRORS, [(_labels(r.device, _xid_attributes(r.xid)), str(r.xid)) for r in readings
                          if r.xid is not None]),
            (DBE_VOLATILE, [(_labels(r.device), str(r.dbe)) for r in readings if r.dbe is not None]),
            (ROW_REMAP_FAILURE, [(_labels(r.device), str(r.row_remap_failure)) for r in readings
                                 if r.row_remap_failure is not None])):
        if not lines:
            continue
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{labels}}} {value}" for labels, value in lines)
        out.append("")
    return "\n".join(out) + ("\n" if out else "")


def _xid_attributes(code: int) -> dict[str, str]:
    if code not in XID_MESSAGES:
        raise ValueError(f"XID {code}: add its text from dcgm-exporter's xid_errors.go to XID_MESSAGES")
    return {"err_code": str(code), "err_msg": XID_MESSAGES[code]}


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A scrape Prometheus gave up (its timeout on a busy machine) closes the connection under the
        write: not an error of the page, so no traceback on stderr."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class Exporter:
    """Serves :func:`render` of the current readings on ``http://127.0.0.1:<port>/metrics``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._page = b""
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                with exporter._lock:
                    body = exporter._page
                    exporter.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.target = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def show(self, readings: Iterable[Reading]) -> None:
        """Serve these readings from the next scrape on."""
        self.show_text(render(readings))

    def show_text(self, page: str) -> None:
        """Serve this exposition text from the next scrape on (another exporter's page, e.g. the balancer's)."""
        with self._lock:
            self._page = page.encode()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def respelled(readings: Iterable[Reading], host_label: str) -> list[Reading]:
    """The same readings under the other host label spelling (an exporter upgrade in progress)."""
    return [replace(r, device=replace(r.device, host_label=host_label)) for r in readings]
