"""The DCGM utilization edge: one instant query per metric against Prometheus' HTTP API.

``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0..1 ratio) is preferred: ``DCGM_FI_DEV_GPU_UTIL`` reads
~100 % for a GPU running one small kernel all the time and does not exist for MIG instances.
The latter (0..100 %) fills in for nodes without profiling metrics (pre-Volta GPUs).

What one query answers, and why it is shaped so (dcgm-exporter 4.5.3-4.8.2,
``internal/pkg/rendermetrics/render_metrics.go`` and ``internal/pkg/devicemonitoring/device_monitoring.go``):

- The node is named in a ``Hostname`` label; dcgm-exporter's next release says ``hostname``
  (its commit d5e5f51). During an exporter upgrade both spellings report the same GPUs, so both
  are copied into one ``node`` label *before* anything is averaged: a host under both spellings is
  one node whose GPUs are counted once, not two answers of which one overwrites the other.
- With the exporter's default ``--devices f`` a GPU in MIG mode is exported only as its GPU
  instances (one series per ``GPU_I_ID``, the parent's ``UUID`` on each), a whole GPU as itself.
  The activity is averaged per physical GPU first (by ``UUID``), then over the node's GPUs, so
  each GPU weighs the same whether whole or cut: a node with one saturated whole GPU and one
  idle GPU cut in seven 1g slices is half busy, not one eighth. Within one GPU the instances
  weigh the same; for the uniform layouts of the MIG manager's ``all-*`` configurations that is
  exact (a mixed layout would need each profile's slice count, which PromQL cannot read from a label).
- dcgm-exporter adds ``pod``/``namespace``/``container`` while a pod holds the GPU, so a GPU's
  series changes name as pods come and go; grouping by ``UUID`` folds those series back into one GPU.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

PROFILING_METRIC = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
HOST_LABELS = ("Hostname", "hostname")
"""dcgm-exporter's spellings of the node's name: released (``Hostname``) and next (``hostname``)."""
NODE_LABEL = "node"
"""The one label the query answers each host under."""
GPU_LABELS = ("UUID", "uuid")
"""The physical GPU: ``UUID``, or ``uuid`` under dcgm-exporter's ``--use-old-namespace``."""


class PrometheusError(Exception):
    """Prometheus could not be reached or did not answer a query with a vector."""


@dataclass(frozen=True, slots=True)
class Utilization:
    """Mean GPU activity (0..1) per host name, and which metric each came from."""

    by_host: dict[str, float]
    source: dict[str, str]


def host_series(metric: str, window: str) -> str:
    """Each series' mean over the window, with its host copied into ``node`` from either spelling.

    ``label_replace`` only writes when the regex matches a non-empty value, so a series without a
    host label keeps any ``node`` label a relabeling gave it (dcgm-exporter's ``--no-hostname``).
    """
    series = f"avg_over_time({metric}[{window}])"
    for label in HOST_LABELS:
        series = f'label_replace({series}, "{NODE_LABEL}", "$1", "{label}", "(.+)")'
    return series


def query_text(metric: str, window: str) -> str:
    """Mean per physical GPU (its MIG instances and pod-labelled series folded in), then per node."""
    gpu = ", ".join(GPU_LABELS)
    return f"avg by ({NODE_LABEL}) (avg by ({NODE_LABEL}, {gpu}) ({host_series(metric, window)}))"


def result_of(answer: Any) -> list[Any]:
    """The series of a ``/api/v1/query`` JSON answer holding a vector; PrometheusError otherwise."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise PrometheusError(f"query failed: {error or 'answer is not a success'}")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"expected a vector result, got {data.get('resultType')!r}")
    return list(data.get("result") or ())


def parse_vector(answer: Any, *, scale: float) -> dict[str, float]:
    """Host -> value from a Prometheus ``/api/v1/query`` JSON answer to :func:`query_text`.

    Values are divided by ``scale`` and clamped to 0..1; NaN and series without a ``node`` (a GPU
    whose exporter reports no host) are left out. The query aggregates by ``node``, so a host
    answers once; a second series for one host means the answer is not that query's, and is refused
    rather than letting one value overwrite the other.
    """
    values: dict[str, float] = {}
    for series in result_of(answer):
        host = (series.get("metric") or {}).get(NODE_LABEL)
        if not host:
            continue
        if host in values:
            raise PrometheusError(f"host {host!r} answered twice: the answer is not aggregated by {NODE_LABEL}")
        try:
            value = float(series["value"][1]) / scale
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            values[host] = min(max(value, 0.0), 1.0)
    return values


class PrometheusClient:
    """Queries one Prometheus server; proxies from the environment are not used (in-cluster)."""

    def __init__(self, url: str, *, window: str, timeout: float) -> None:
        self._base = url.rstrip("/")
        self._window = window
        self._timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _query(self, promql: str) -> Any:
        target = f"{self._base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with self._opener.open(target, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:  # Prometheus answers 400/422/503 with a JSON error body
            try:
                return json.loads(err.read())
            except ValueError:
                raise PrometheusError(f"{target}: HTTP {err.code}") from err
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise PrometheusError(f"{self._base}: {getattr(err, 'reason', err)}") from err

    def vector(self, promql: str) -> list[Any]:
        """The series of an instant query's vector answer; PrometheusError when there is none."""
        return result_of(self._query(promql))

    def query(self, promql: str) -> Any:
        """Prometheus' JSON answer to one instant query (a failed query's error answer included);
        PrometheusError when Prometheus cannot be reached or answers no JSON."""
        return self._query(promql)

    def utilization(self) -> Utilization:
        """Per-host utilization; raises PrometheusError when Prometheus is unusable."""
        preferred = parse_vector(self._query(query_text(PROFILING_METRIC, self._window)), scale=1.0)
        fallback = parse_vector(self._query(query_text(UTIL_METRIC, self._window)), scale=100.0)
        by_host = {**fallback, **preferred}
        source = {host: PROFILING_METRIC if host in preferred else UTIL_METRIC for host in by_host}
        return Utilization(by_host=by_host, source=source)
