"""Regenerate docs/usage-idle-panel.png: the dashboard's idle-allocations panel, from a real run.

    python -m tools.usage_pictures [--out docs]

What runs is ``tests/e2e/idle_env.py``'s stack on a local control plane (needs the e2e binaries
and Debian's prometheus): two ``gpugate balance --usage`` replicas as the balancer's
ServiceAccount, Prometheus with the shipped gpugate-usage rules, and a dcgm-exporter page. Four
teams' workloads run on three fake GPU nodes (whole H100s, H100s in ``all-3g.40gb``, H100s
time-sliced four ways); the page reports each pod's GPU activity (a notebook nobody uses, an
inference server without traffic, a training job stuck in its data loader, a busy training job).
The policy reports pods idle for 15 s (2 h by default). Once the leader has found them, the
panel's own query (``manifests/observability/dashboard.json``, panel "Idle GPU allocations found,
by namespace and owner") is asked of Prometheus, and its answer drawn as Grafana draws a
horizontal bar gauge, with ``gpugate usage --idle``'s lines under it. matplotlib comes from the
``pictures`` extra.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GRAFANA_BG, GRAFANA_PANEL, GRAFANA_TEXT, GRAFANA_GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
PANEL_TITLE = "Idle GPU allocations found, by namespace and owner"
AFTER = "15s"
SLOTS = 4
"""Time-slicing replicas of the slots node."""
WORKLOADS = (
    # namespace, deployment, node kind, resource, count per pod, replicas, activity
    ("ml-research", "notebook-alice", "whole", "nvidia.com/gpu", 1, 1, 0.004),
    ("ml-research", "notebook-bob", "whole", "nvidia.com/gpu", 2, 1, 0.01),
    ("ml-inference", "llm-serve", "mig", "nvidia.com/mig-3g.40gb", 1, 2, 0.02),
    ("ml-training", "resnet", "whole", "nvidia.com/gpu", 4, 1, 0.85),
    ("ml-training", "data-stuck", "whole", "nvidia.com/gpu", 1, 1, 0.0),
    ("team-dev", "sandbox", "slots", "nvidia.com/gpu.shared", 1, 3, 0.01),
)


@dataclass
class Recording:
    """What the run showed: the panel's answer and the command's lines."""

    bars: list[tuple[str, float]] = field(default_factory=list)
    idle_lines: str = ""
    expr: str = ""
    ran_at: float = 0.0


def policy(namespaces: list[str]) -> str:
    return f"""apiVersion: gpugate.io/v1alpha1
kind: GPUPolicy
metadata: {{name: idle-report}}
spec:
  match: {{namespaces: {json.dumps(namespaces)}}}
  idle: {{action: report, after: {AFTER}}}
"""


def deployment(name: str, node: str, resource: str, count: int, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                           "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                                           "resources": {"limits": {resource: str(count)}}}]}}}}


def record(workdir: Path) -> Recording:
    """Run the scenario on a fresh local control plane; every process is stopped afterwards."""
    from click.testing import CliRunner
    from kubernetes import client

    from tests.dcgmexporter import Device, Pod, Reading
    from tests.e2e.idle_env import idle_stack
    from tests.e2e.waiting import wait_until
    from tests.manifests.dashboard import targets
    from webhook.cli import main
    from webhook.kube import units
    from webhook.localcluster import binaries
    from webhook.localcluster.cluster import Cluster, Nodes

    found = binaries.paths()
    if found is None:
        raise SystemExit("the e2e binaries are not built: python -m tests.e2e.binaries build")
    suffix = secrets.token_hex(2)
    namespaces = sorted({f"{ns}-{suffix}" for ns, *_ in WORKLOADS})
    with Cluster.local(found) as cluster:
        nodes = Nodes(cluster)
        core, apps = cluster.core(), client.AppsV1Api(cluster.api_client())
        kinds = {"whole": nodes.gpu(gpus=8), "mig": nodes.gpu(gpus=4, mig={"3g.40gb": 8}, mig_config="all-3g.40gb"),
                 "slots": nodes.gpu(gpus=2, replicas=SLOTS)}
        for namespace in namespaces:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
            wait_until(lambda ns=namespace: _has_account(core, ns), timeout=30, what=f"{namespace}'s ServiceAccount")
        with idle_stack(cluster, workdir, policy(namespaces)) as stack:
            for ns, name, kind, resource, count, replicas, _ in WORKLOADS:
                apps.create_namespaced_deployment(f"{ns}-{suffix}", deployment(name, kinds[kind], resource, count,
                                                                               replicas))
            want = sum(w[5] for w in WORKLOADS)
            pods = wait_until(lambda: len(found := _running(core, namespaces)) == want and found, timeout=120,
                              what="every pod running", explain=cluster.logs_tail)
            activity = {(f"{ns}-{suffix}", name): a for ns, name, *_, a in WORKLOADS}
            stack.exporter.show([Reading(device=Device(host=p.spec.node_name, gpu=i, pod=Pod(
                name=p.metadata.name, namespace=p.metadata.namespace)),
                active=activity[(p.metadata.namespace, p.metadata.labels["app"])]) for i, p in enumerate(pods)])
            [panel] = [t for t in targets() if t.title == PANEL_TITLE]
            want_gpus = {name: round(count * replicas * units.gpu_share(resource, replicas=SLOTS), 3)
                         for _, name, _, resource, count, replicas, a in WORKLOADS if a < 0.05}

            def every_idle_pod_found() -> list[dict[str, Any]]:
                got = stack.prometheus.query(panel.expr)
                found = {s["metric"]["owner_name"]: round(float(s["value"][1]), 3) for s in got}
                return got if found == want_gpus else []

            answer = wait_until(every_idle_pod_found, timeout=120, what="every idle pod found", explain=stack.explain)
            rec = Recording(expr=panel.expr, ran_at=time.time())
            rec.bars = [(f"{s['metric']['pod_namespace'].removesuffix('-' + suffix)} "
                         f"{s['metric']['owner_kind']}/{s['metric']['owner_name']}", float(s["value"][1]))
                        for s in answer]
            lines = CliRunner().invoke(main, ["usage", "--prometheus", stack.prometheus.url, "--idle"]).stdout
            rec.idle_lines = lines.replace(f"-{suffix}", "")
        nodes.remove_all()
    return rec


def _has_account(core: Any, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except ApiException:
        return False


def _running(core: Any, namespaces: list[str]) -> list[Any]:
    return sorted((p for ns in namespaces for p in core.list_namespaced_pod(ns).items
                   if p.status.phase == "Running" and p.metadata.deletion_timestamp is None),
                  key=lambda p: (p.metadata.namespace, p.metadata.name))


def render(rec: Recording, out: Path) -> Path:
    """Grafana's dark bar gauge (horizontal, gradient, thresholds green < 0.5 <= orange < 2 <= red)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    bars = sorted(rec.bars, key=lambda b: -b[1])
    lines = rec.idle_lines.rstrip().splitlines()
    text_in, bars_in, title_in = 0.2 * len(lines) + 0.3, 0.62 * len(bars), 0.8
    height = text_in + bars_in + title_in
    fig = plt.figure(figsize=(11, height), facecolor=GRAFANA_BG)
    ax = fig.add_axes((0.02, text_in / height, 0.96, bars_in / height), facecolor=GRAFANA_PANEL)
    ceiling = max(v for _, v in bars) * 1.05
    colors = LinearSegmentedColormap.from_list("gauge", ["#73bf69", "#ff9830", "#f2495c"])
    for row, (label, value) in enumerate(bars):
        y = len(bars) - 1 - row
        ax.barh(y, ceiling, height=0.42, color="#22252b")
        ax.barh(y, value, height=0.42, color=colors(min(value / 2.0, 1.0)))
        ax.text(0, y + 0.3, label, color=GRAFANA_TEXT, fontsize=9, va="bottom")
        ax.text(ceiling, y, f"{value:.2f}", color=colors(min(value / 2.0, 1.0)), fontsize=12, va="center", ha="right",
                weight="bold")
    ax.set_xlim(0, ceiling * 1.001)
    ax.set_ylim(-0.5, len(bars) - 0.1)
    ax.axis("off")
    for i, line in enumerate(lines):
        fig.text(0.02, (0.2 * (len(lines) - i) - 0.05) / height, line, family="monospace", fontsize=8,
                 color="#8ab8ff" if i == 0 else GRAFANA_TEXT)
    fig.text(0.02, 1 - 0.45 / height, PANEL_TITLE, color=GRAFANA_TEXT, fontsize=11)
    fig.text(0.02, 1 - 0.12 / height, f"PromQL: {rec.expr}", color="#8e8e8e", fontsize=7, va="top")
    fig.text(0.02, (0.2 * len(lines) + 0.12) / height, "$ gpugate usage --prometheus URL --idle", family="monospace",
             fontsize=8, color="#8e8e8e")
    out.mkdir(parents=True, exist_ok=True)
    target = out / "usage-idle-panel.png"
    fig.savefig(target, dpi=110, facecolor=GRAFANA_BG)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-pictures-") as work:
        print(render(record(Path(work)), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
