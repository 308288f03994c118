"""Regenerate docs/telemetry-tiers.png and docs/argocd-health-states.png from real runs.

    python -m tools.telemetry_pictures [--out docs] [--only tiers|argocd]

``argocd-health-states.png`` is the text ``argocd app list`` and ``argocd app get -o tree=detailed`` print
at each state of ``tests/e2e/test_argocd_health_states.py`` (run here with
``GPUGATE_PICTURES_DIR``; needs the GitOps binaries), in a terminal's colours.

``telemetry-tiers.png`` needs the e2e binaries and prometheus.
What runs is ``tests/e2e/telemetry_env.py``'s stack on a local control plane: two dcgm-exporter
pages (``tests/dcgmexporter.py``), Debian's Prometheus scraping them, ``gpugate balance
--prometheus`` labelling two fake GPU nodes (8 whole H100s with 2 GPUs requested; 8 H100s in
``all-1g.10gb``, 7 slices requested). Their GPUs' activity follows a ramp up and down; then the
whole-GPU node's exporter stops reporting it while it is saturated, and its tier falls back to
its allocation. The utilization curves are Prometheus' answers to
the balancer's own query (``query_range``, as a Grafana panel asks), the bands are the
``gpugate.io/gpu-load`` labels read from the API server while it ran. matplotlib comes from the
``pictures`` extra (``pip install -e '.[pictures]'``).
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP_SECONDS = 4.0
WHOLE_RAMP = (0.1, 0.45, 0.65, 0.8, 0.95, 0.85, 0.75, 0.55, 0.45, 0.2, 0.95, 0.95)
"""Activity of each whole GPU per step: crosses 0.6 and 0.9 going up, and the hysteresis exits
(0.8, 0.5) going down; saturated again before its exporter stops reporting it."""
MIG_RAMP = (0, 2, 4, 5, 6, 8, 7, 6, 4, 3, 3, 3)
"""GPUs (of 8, each cut in seven 1g instances) whose instances are all saturated, per step."""
NO_DATA_SECONDS = 8.0
TIER_COLORS = {"idle": "#73bf69", "busy": "#fade2a", "congested": "#f2495c"}
GRAFANA_BG, GRAFANA_PANEL, GRAFANA_TEXT, GRAFANA_GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"


@dataclass
class Recording:
    """What the run showed, per node: tier labels over time and Prometheus' utilization series."""

    start: float
    end: float
    nodes: dict[str, str]
    """Node name -> caption."""
    tiers: dict[str, list[tuple[float, str | None]]] = field(default_factory=dict)
    utilization: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    per_gpu: dict[str, list[list[tuple[float, float]]]] = field(default_factory=dict)
    no_data_from: float = 0.0


def record(workdir: Path) -> Recording:
    """Run the scenario on a fresh local control plane; every process is stopped afterwards."""
    from kubernetes import client

    from tests.dcgmexporter import Reading, mig_gpu, whole_gpus
    from tests.e2e.telemetry_env import telemetry
    from tests.e2e.test_balancer_prometheus import gpu_pod
    from webhook.balancer.prometheus import PROFILING_METRIC, host_series, query_text
    from webhook.localcluster import binaries
    from webhook.localcluster.cluster import Cluster, Nodes

    found = binaries.paths()
    if found is None:
        raise SystemExit("the e2e binaries are not built: python -m tests.e2e.binaries build")
    with Cluster.local(found) as cluster:
        nodes = Nodes(cluster)
        core = cluster.core()
        namespace = f"pictures-{secrets.token_hex(3)}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        try:
            whole = nodes.gpu(gpus=8)
            mig = nodes.gpu(gpus=8, mig={"1g.10gb": 56}, mig_config="all-1g.10gb")
            _wait_for_account(core, namespace)
            core.create_namespaced_pod(namespace, gpu_pod("train", whole, "nvidia.com/gpu", 2))
            core.create_namespaced_pod(namespace, gpu_pod("slice", mig, "nvidia.com/mig-1g.10gb", 7))
            with telemetry(cluster, workdir, lease_namespace=namespace) as env:
                rec = Recording(start=time.time(), end=0.0, nodes={
                    whole: "8 whole H100 GPUs, 2 requested (allocation: idle)",
                    mig: "8 H100 GPUs in all-1g.10gb (56 MIG slices), 7 requested (allocation: idle)"})
                rec.tiers = {n: [] for n in rec.nodes}

                def show(step: int | None) -> None:
                    readings: list[Reading] = []
                    if step is not None:
                        readings += whole_gpus(whole, [WHOLE_RAMP[step]] * 8)
                    busy = MIG_RAMP[step if step is not None else -1]
                    readings += [r for g in range(8)
                                 for r in mig_gpu(mig, g, "1g.10gb", [1.0 if g < busy else 0.0] * 7)]
                    env.released.show(readings)

                def watch(seconds: float) -> None:
                    until = time.time() + seconds
                    while time.time() < until:
                        for name in rec.nodes:
                            rec.tiers[name].append((time.time(), env.tier(name)))
                        time.sleep(0.25)

                show(0)
                watch(6.0)  # the first labels
                for step in range(len(WHOLE_RAMP)):
                    show(step)
                    watch(STEP_SECONDS)
                rec.no_data_from = time.time()
                show(None)
                watch(NO_DATA_SECONDS)
                rec.end = time.time()
                for name in rec.nodes:
                    [series] = [s for s in env.prometheus.query_range(
                        query_text(PROFILING_METRIC, "3s"), start=rec.start, end=rec.end, step=0.5)
                        if s["metric"].get("node") == name] or [{"values": []}]
                    rec.utilization[name] = [(float(t), float(v)) for t, v in series["values"]]
                    gpus = env.prometheus.query_range(
                        f'avg by (node, UUID) ({host_series(PROFILING_METRIC, "3s")})',
                        start=rec.start, end=rec.end, step=0.5)
                    rec.per_gpu[name] = [[(float(t), float(v)) for t, v in s["values"]]
                                         for s in gpus if s["metric"].get("node") == name]
        finally:
            nodes.remove_all()
            core.delete_namespace(namespace)
    return rec


def _wait_for_account(core: Any, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def render(rec: Recording, out: Path) -> Path:
    """Grafana's dark time-series look: one panel per node, tier bands behind the curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.lines
    import matplotlib.patches
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from webhook.placement.tiers import TierThresholds

    th = TierThresholds()
    fig, axes = plt.subplots(len(rec.nodes), 1, figsize=(11, 3.4 * len(rec.nodes)), sharex=True,
                             facecolor=GRAFANA_BG)
    for ax, (name, caption) in zip(axes, rec.nodes.items(), strict=True):
        ax.set_facecolor(GRAFANA_PANEL)
        samples = rec.tiers[name]
        for (t0, tier), (t1, _) in zip(samples, samples[1:], strict=False):
            if tier in TIER_COLORS:
                ax.axvspan(t0 - rec.start, t1 - rec.start, ymin=0, ymax=0.06, color=TIER_COLORS[tier], lw=0)
                ax.axvspan(t0 - rec.start, t1 - rec.start, color=TIER_COLORS[tier], alpha=0.10, lw=0)
        for values in rec.per_gpu.get(name, []):
            ax.plot([t - rec.start for t, _ in values], [v for _, v in values], color="#5794f2", alpha=0.25, lw=0.8)
        values = rec.utilization.get(name, [])
        [reads] = ax.plot([t - rec.start for t, _ in values], [v for _, v in values], color="#8ab8ff", lw=2.2,
                label="GPU activity the balancer reads (per GPU, then per node)")
        for level, style, label in ((th.busy_utilization, "--", "busy from"),
                                    (th.congested_utilization, "--", "congested from"),
                                    (th.busy_utilization - th.hysteresis, ":", "leaves busy below"),
                                    (th.congested_utilization - th.hysteresis, ":", "leaves congested below")):
            ax.axhline(level, color="#8e8e8e", ls=style, lw=0.9)
            ax.text(rec.end - rec.start, level, f" {label} {level:.1f}", color="#8e8e8e", fontsize=7, va="bottom")
        ax.axvline(rec.no_data_from - rec.start, color="#b877d9", lw=1)
        if name == next(iter(rec.nodes)):
            ax.text(rec.no_data_from - rec.start, 0.3, " exporter stops\n reporting this node:\n tier from allocation",
                    color="#b877d9", fontsize=8, va="bottom")
        ax.set_ylim(0, 1.08)
        ax.set_title(f"{name}: {caption}", color=GRAFANA_TEXT, fontsize=10, loc="left")
        ax.tick_params(colors=GRAFANA_TEXT, labelsize=8)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.grid(color=GRAFANA_GRID, lw=0.6)
        for spine in ax.spines.values():
            spine.set_color(GRAFANA_GRID)
    handles = [matplotlib.patches.Patch(color=c, label=f"gpugate.io/gpu-load={t}") for t, c in TIER_COLORS.items()]
    faint = matplotlib.lines.Line2D([], [], color="#5794f2", alpha=0.5, lw=0.8, label="one GPU")
    axes[0].legend(handles=[reads, faint, *handles], loc="lower left", fontsize=8, facecolor=GRAFANA_PANEL,
                   edgecolor=GRAFANA_GRID, labelcolor=GRAFANA_TEXT).set_zorder(5)
    axes[-1].set_xlabel("seconds (scrape 0.5 s, balancer window 3 s, poll 0.5 s)", color=GRAFANA_TEXT, fontsize=9)
    fig.suptitle("gpugate balancer: load tiers against DCGM_FI_PROF_GR_ENGINE_ACTIVE, evaluated by Prometheus",
                 color=GRAFANA_TEXT, fontsize=12, x=0.01, ha="left")
    fig.tight_layout()
    target = out / "telemetry-tiers.png"
    fig.savefig(target, dpi=110, facecolor=GRAFANA_BG)
    plt.close(fig)
    return target


HEALTH_COLORS = {"Healthy": "#73bf69", "Degraded": "#f2495c", "Progressing": "#5794f2", "Synced": "#73bf69",
                 "OutOfSync": "#fade2a", "Missing": "#fade2a", "Suspended": "#b877d9"}


def argocd_texts(work: Path) -> list[str]:
    """Run the Argo CD health-states test with GPUGATE_PICTURES_DIR; the CLI text of each state."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/e2e/test_argocd_health_states.py"], cwd=root,
                          env={**os.environ, "GPUGATE_PICTURES_DIR": str(work)}, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the Argo CD health-states test failed (exit {done.returncode})")
    return [p.read_text() for p in sorted(work.glob("*.txt"))]


def render_terminal(texts: list[str], out: Path) -> Path:
    """The texts as a terminal shows them: monospace on black, health and sync words coloured."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [line for text in texts for line in [*text.rstrip().splitlines(), ""]]
    width = max(len(line) for line in lines)
    fig = plt.figure(figsize=(0.08 * width + 0.5, 0.16 * len(lines) + 0.4), facecolor="#0c0c0c")
    words = re.compile("|".join(sorted(HEALTH_COLORS, key=len, reverse=True)))
    for row, line in enumerate(lines):
        y = 1 - (row + 0.8) / (len(lines) + 0.5)
        color = "#f9f9f9" if line.startswith("# ") else "#8ab8ff" if line.startswith("$ ") else "#cccccc"
        fig.text(0.005, y, line, family="monospace", fontsize=9, color=color, va="baseline",
                 weight="bold" if line.startswith("# ") else "normal")
        for match in words.finditer(line):  # overdraw the word in its colour, same place
            fig.text(0.005, y, " " * match.start() + match.group(), family="monospace", fontsize=9,
                     color=HEALTH_COLORS[match.group()], va="baseline")
    target = out / "argocd-health-states.png"
    fig.savefig(target, dpi=100, facecolor="#0c0c0c")
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    parser.add_argument("--only", choices=("tiers", "argocd"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpugate-pictures-") as work:
        if args.only in (None, "tiers"):
            print(render(record(Path(work) / "tiers"), args.out))
        if args.only in (None, "argocd"):
            print(render_terminal(argocd_texts(Path(work) / "argocd"), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
