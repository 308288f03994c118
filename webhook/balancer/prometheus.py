"""The DCGM utilization edge: one instant query per metric against Prometheus' HTTP API.

``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0..1 ratio) is preferred: ``DCGM_FI_DEV_GPU_UTIL`` reads
~100 % for a GPU running one small kernel all the time and does not exist for MIG instances.
The latter (0..100 %) fills in for nodes without profiling metrics (pre-Volta GPUs). DCGM
exporter names the node in a ``Hostname`` label; its unreleased successor says ``hostname``:
the query groups by both and either is read.
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


class PrometheusError(Exception):
    """Prometheus could not be reached or did not answer a query with a vector."""


@dataclass(frozen=True, slots=True)
class Utilization:
    """Mean GPU activity (0..1) per host name, and which metric each came from."""

    by_host: dict[str, float]
    source: dict[str, str]


def query_text(metric: str, window: str) -> str:
    """Mean over the window, then over the node's GPUs, one series per host label value."""
    return f"avg by (Hostname, hostname) (avg_over_time({metric}[{window}]))"


def parse_vector(answer: Any, *, scale: float) -> dict[str, float]:
    """Host -> value from a Prometheus ``/api/v1/query`` JSON answer; values divided by ``scale``."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise PrometheusError(f"query failed: {error or 'answer is not a success'}")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"expected a vector result, got {data.get('resultType')!r}")
    values: dict[str, float] = {}
    for series in data.get("result") or ():
        labels = series.get("metric") or {}
        host = next((labels[k] for k in HOST_LABELS if labels.get(k)), None)
        try:
            value = float(series["value"][1]) / scale
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if host and math.isfinite(value):
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

    def utilization(self) -> Utilization:
        """Per-host utilization; raises PrometheusError when Prometheus is unusable."""
        preferred = parse_vector(self._query(query_text(PROFILING_METRIC, self._window)), scale=1.0)
        fallback = parse_vector(self._query(query_text(UTIL_METRIC, self._window)), scale=100.0)
        by_host = {**fallback, **preferred}
        source = {host: PROFILING_METRIC if host in preferred else UTIL_METRIC for host in by_host}
        return Utilization(by_host=by_host, source=source)
