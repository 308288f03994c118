"""The edges of the canary analysis: the cluster's canary nodes, Prometheus queries, the watch loop.

The decisions are ``webhook.stack.canary`` (pure); this module only reads (the GPU nodes through
``status.fetch_cluster``, Prometheus' HTTP API ``/api/v1/query``) and waits.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from webhook.errors import GpugateError
from webhook.kubetarget import Target
from webhook.names import DRIVER_UPGRADE_STATE_LABEL
from webhook.stack import manifests
from webhook.stack import status as stack_status
from webhook.stack.canary import (
    ANALYSIS_FILE,
    NO_STATE,
    Analysis,
    CanaryObservation,
    CanaryVerdict,
    Gate,
    NodeUpgrade,
    Sample,
    Watch,
    gate,
    judge,
    parse_analysis,
)
from webhook.stack.compat import Check
from webhook.stack.model import Stack

DRIVER_VERSION_LABEL = "nvidia.com/cuda.driver-version.full"
"""What GPU Feature Discovery labels a node with once a driver is loaded."""
PROMETHEUS_TIMEOUT_SECONDS = 10


def load_analysis(root: Path, stack: Stack, *, pool: str | None, path: Path | None = None) -> Analysis:
    """``canary.yaml`` beside stack.yaml (or ``path``); without one, the pool alone, no conditions."""
    file = path or root / ANALYSIS_FILE
    pools = [p.name for p in stack.pools]
    if file.is_file():
        analysis = parse_analysis(file.read_text(encoding="utf-8"), pools=pools, source=str(file))
        if pool is not None and pool != analysis.pool:
            raise GpugateError(f"--pool {pool} but {file} analyses pool {analysis.pool}")
        return analysis
    if path is not None:
        raise GpugateError(f"{path} not found")
    name = pool or next((p.name for p in stack.pools if not p.default), None)
    if name is None or name not in pools:
        raise GpugateError(f"no canary pool: pass --pool (pools: {', '.join(pools)})")
    return Analysis(pool=name)


def node_upgrades(stack: Stack, pool: str, nodes: list[Mapping[str, Any]]) -> list[NodeUpgrade]:
    """The nodes of ``pool`` (by the operator's owner label, as ``stack status`` counts them)."""
    found = []
    for node in nodes:
        if stack_status.pool_of(node, stack) != pool:
            continue
        labels = (node.get("metadata") or {}).get("labels") or {}
        found.append(NodeUpgrade(name=str(node["metadata"]["name"]),
                                 state=labels.get(DRIVER_UPGRADE_STATE_LABEL) or NO_STATE,
                                 driver=labels.get(DRIVER_VERSION_LABEL)))
    return found


def cluster_gate(stack: Stack, pool: str, server: Target | str | None) -> Gate:
    """The promotion gate for ``pool`` at the driver Git pins for it, read from the cluster."""
    driver = next((p.driver for p in stack.pools if p.name == pool), None)
    if driver is None:
        raise GpugateError(f"pool {pool} is not in {manifests.STACK_FILE}")
    raw = stack_status.fetch_cluster(server)
    return gate(pool, driver, node_upgrades(stack, pool, raw["nodes"]))


def query(url: str, promql: str) -> tuple[Sample, ...]:
    """The samples of an instant query (vector or scalar); a failed query is an error, not 'no data'."""
    address = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(address, timeout=PROMETHEUS_TIMEOUT_SECONDS) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        # Prometheus answers a bad query with 400 (422 for an evaluation error) and its reason in the
        # JSON body: that is a refusal to report, not a Prometheus that did not answer.
        try:
            body = json.loads(err.read())
        except (OSError, json.JSONDecodeError):
            raise GpugateError(f"Prometheus at {url} answered {promql!r} with HTTP {err.code}") from err
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
        raise GpugateError(f"Prometheus at {url} did not answer {promql!r}: {err}") from err
    if body.get("status") != "success":
        raise GpugateError(f"Prometheus refused {promql!r}: {body.get('error') or body}")
    data = body.get("data") or {}
    if data.get("resultType") == "scalar":
        return (Sample(float(data["result"][1])),)
    if data.get("resultType") == "vector":
        return tuple(Sample(float(s["value"][1]), series_name(s.get("metric") or {})) for s in data.get("result") or [])
    raise GpugateError(f"Prometheus answered {promql!r} with a {data.get('resultType')}, not a vector or scalar")


def series_name(labels: Mapping[str, str]) -> str:
    """A series' labels as PromQL writes a selector (``__name__`` first, bare), for messages."""
    name = labels.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest else name


def observe(stack: Stack, analysis: Analysis, *, server: Target | str | None, prometheus: str | None,
            now: float) -> CanaryObservation:
    raw = stack_status.fetch_cluster(server)
    url = prometheus or analysis.prometheus_url
    measurements = {c.name: query(url, c.query) for c in analysis.conditions} if url else {}
    return CanaryObservation(at=now, nodes=tuple(node_upgrades(stack, analysis.pool, raw["nodes"])),
                       measurements=measurements)


def watch(stack: Stack, analysis: Analysis, driver: str, *, server: Target | str | None, prometheus: str | None,
          once: bool = False, report: Callable[[CanaryVerdict], None] | None = None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> CanaryVerdict:
    """Observe every ``interval`` until the verdict is promote or rollback (or once, with ``once``)."""
    state = Watch(started=clock())
    while True:
        verdict = judge(analysis, driver, state, observe(stack, analysis, server=server, prometheus=prometheus,
                                                         now=clock()))
        if report is not None:
            report(verdict)
        if verdict.decision != "wait" or once:
            return verdict
        state = verdict.watch
        sleep(analysis.interval_seconds)


def gate_check(stack: Stack, pool: str, server: Target | str | None, *, force: bool) -> Check:
    """The promotion gate as a plan check: read from the cluster, or (``force``) skipped, said loudly."""
    driver = next((p.driver for p in stack.pools if p.name == pool), "?")
    if force:
        return Check(name="canary-gate", subject=pool, ok=True,
                     reason=f"not checked (--force): pool {pool} was not read from the cluster",
                     warning=f"promoted with --force: the canary gate (every node of pool {pool} upgrade-done at "
                             f"driver {driver}) was not checked")
    try:
        verdict = cluster_gate(stack, pool, server)
    except GpugateError as err:
        return Check(name="canary-gate", subject=pool, ok=False,
                     reason=f"cannot read pool {pool} from the cluster ({err}); pass --force to promote unchecked")
    reason = verdict.reason if verdict.ok else f"{verdict.reason} (--force promotes anyway)"
    return Check(name="canary-gate", subject=pool, ok=verdict.ok, reason=reason)
