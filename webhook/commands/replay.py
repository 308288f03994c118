"""``gpugate replay``: measure what a policy does to GPU allocation on a cluster trace."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from webhook.commands.settingsoptions import build, field_option
from webhook.errors import InputError
from webhook.policy import loading
from webhook.replay import arms as arm_table
from webhook.replay.runspec import SHIPPED_DEVICE_POLICY, RunSpec

ALL_ARMS = ",".join(arm_table.DEFAULT)
TIMELINE_ARMS = ",".join(arm_table.TIMELINE_DEFAULT)
SHARING = ("timeslice", "dra", "published")


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,45,47`` or a mix: the seeds in the order given, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise click.BadParameter(f"{part!r} is not a seed or a range like 42-51", param_hint="--seeds")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise click.BadParameter(f"range {part!r} runs backwards", param_hint="--seeds")
        seeds.extend(s for s in range(low, high + 1) if s not in seeds)
    return seeds


def parse_arms(text: str, known: tuple[str, ...]) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in known]
    if unknown or not arms:
        raise click.BadParameter(f"unknown arm(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}",
                                 param_hint="--arms")
    return list(dict.fromkeys(arms))


@click.command("replay")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder of the openb trace (openb_node_list_gpu_node.csv and pod lists). "
                   "Without it, a synthetic cluster and pod list are generated from the first seed.")
@click.option("--pods", "pods_file", type=click.Path(path_type=Path),
              help="Pod list to replay (a path, or a file name inside --trace); default openb_pod_list_default.csv.")
@click.option("--policies", type=click.Path(file_okay=False, path_type=Path), default=Path("policies"),
              show_default=True, help="Policy folder the gpugate arm admits pods with.")
@click.option("--arms", default=None,
              help="Comma-separated arms to run: " + ", ".join(arm_table.NAMES) + " (webhook/replay/arms.py) "
                   f"[default: {ALL_ARMS}; with --timeline: {TIMELINE_ARMS}].")
@field_option(RunSpec, "sharing", "--sharing", type=click.Choice(SHARING), show_default=True,
              help="The sharing world of the kube arms: timeslice (a share is one time-sliced slot on the nodes "
                   "that carry manifests/' time-slicing-4 config, as shipped) or dra (a share is a DRA "
                   "consumable-capacity claim of its fraction of the GPU's memory); published is the FGD "
                   "artifact's model (a share is its size on any GPU: no stock component implements it; "
                   "earlier releases' figures). Reference arms (random, bestfit, fgd) stay in their "
                   "published model.")
@click.option("--seeds", default="42-51", show_default=True, help="Seeds: a range (42-51) or a list (42,43).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("replay-out"),
              show_default=True, help="Folder for summary.json, per-run CSVs and the plot.")
@field_option(RunSpec, "label_lag", "--label-lag", type=click.IntRange(min=1), show_default=True,
              help="Recompute the balancer's node labels every K placements (stale labels in between); "
                   "the extender sees bound pods K placements late too.")
@field_option(RunSpec, "taint_congested", "--taint-congested", is_flag=True,
              help="Model the balancer's optional congested PreferNoSchedule taint.")
@click.option("--device-allocation", "device_policy", type=click.Choice(["distributed", "packed"]),
              default=SHIPPED_DEVICE_POLICY, show_default=True,
              help="How the NVIDIA device plugin picks the GPU for a time-sliced share "
                                      "(packed, its --shared-devices-allocation-policy packed from v0.20.0, config "
                                      "flags.plugin.sharedDevicesAllocationPolicy, is "
                                      "what manifests/gpu-operator's time-slicing-4 sets; distributed is the "
                                      "plugin's own default). The dra world ignores it: the scheduler allocates "
                                      "DRA devices first fit.")
@field_option(RunSpec, "extender_weight", "--extender-weight", type=click.IntRange(min=1), show_default=True,
              help="The extender's weight in the gpugate profile (its 0..10 score counts x weight x 10).")
@field_option(RunSpec, "extender_percentage", "--extender-nodes-percentage", type=click.IntRange(min=0, max=100),
              show_default=True,
              help="percentageOfNodesToScore of the extender's profile (0: kube-scheduler's adaptive default).")
@field_option(RunSpec, "extender_mix", "--extender-mix", type=click.Choice(["history", "window", "trace"]),
              show_default=True, help="The extender's pod-shape mix: learned from pods created, its window starting "
                                      "full (history) or empty (window), or configured from the pod list (trace).")
@field_option(RunSpec, "extender_levels", "--extender-levels", type=click.Choice(["rank", "linear"]),
              show_default=True,
              help="How the extender's keys become 0..10: by rank (served) or rescaled linearly (to compare).")
@field_option(RunSpec, "extender_assume", "--extender-assume/--no-extender-assume", show_default=True,
              help="The extender counts the pods it scored as placed on its best node until it sees them bound.")
@field_option(RunSpec, "tune", "--tune", type=click.FloatRange(min=0.1, max=3.0), show_default=True,
              help="Inflate (or cut) the pod list to this multiple of GPU capacity.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for independent runs (default: the CPUs available).")
@field_option(RunSpec, "mig_mix", "--mig-mix", show_default=False,
              help="Right-sizing arms (whole-gpu, shares-only, rightsized): the share of GPU nodes partitioned, "
                   "per MIG layout, e.g. all-balanced=0.15 (the default) or all-1g.10gb=0.05,all-balanced=0.2; "
                   "layouts all-1g.10gb, all-2g.20gb, all-3g.40gb, all-balanced (docs/rightsizing.md).")
@field_option(RunSpec, "share_replicas", "--share-replicas", type=click.IntRange(min=1, max=64), show_default=True,
              help="shares-only arm: time-sliced slots per GPU on the partitioned nodes.")
@click.option("--synthetic-nodes", type=click.IntRange(min=4), default=120, show_default=True,
              help="Nodes of the synthetic cluster (only without --trace).")
@field_option(RunSpec, "ties", "--ties", type=click.Choice(["random", "list"]), show_default=True,
              help="How the kube-scheduler model breaks equal best totals: random (what kube-scheduler intends, "
                   "and does for nodes an extender scored) or list (v1.37.2 without an extender: the first of "
                   "its scored list, as its heap orders them; docs/placement.md).")
@click.option("--timeline", is_flag=True,
              help="Replay in time: each pod stays its trace life, a pod that fits nowhere waits and is tried "
                   "again as pods leave, and the rebalancer may move pods (docs/rebalance.md).")
@click.option("--load", type=click.FloatRange(min=0.05, max=3.0, min_open=False), default=1.0, show_default=True,
              help="With --timeline: the offered load, the stream's time-averaged GPU demand over capacity "
                   "(its arrivals' spacing is scaled to it).")
def replay(**options: Any) -> None:
    """Replay a GPU cluster trace through gpugate's policies and a kube-scheduler model.

    Prints arm by metric (GPU allocation at 100% and 130% arrived GPU request, fragmentation),
    writes OUT/summary.json, OUT/runs/<arm>-seed<N>.csv and OUT/allocation.png, all at the end:
    Ctrl-C stops at once (exit 130) and leaves OUT as it was. With --timeline: allocation,
    pending GPU demand, waits and moves over time (OUT/timeline.png).
    """
    from webhook.localcluster import interrupts

    template = build(RunSpec, options, arm="", seed=0, policies=None)  # every run's settings but its own
    try:
        with interrupts.raised():
            _replay(template, options)
    except interrupts.Interrupted as stop:
        click.echo(f"\n{stop}: stopped the replay; {options['out']} was not written", err=True)
        raise SystemExit(interrupts.EXIT_STATUS) from None


def _replay(template: RunSpec, options: Mapping[str, Any]) -> None:
    """The runs ``options`` ask for, each ``template`` with its arm, seed and policy folder."""
    from webhook.replay import migcluster, report, runner, trace

    trace_dir, pods_file, policies, out = (options[name] for name in ("trace_dir", "pods_file", "policies", "out"))
    timeline, workers = options["timeline"], options["workers"] or _cpus()
    arm_list = parse_arms(options["arms"] or (TIMELINE_ARMS if timeline else ALL_ARMS), tuple(arm_table.BY_NAME))
    seed_list = parse_seeds(options["seeds"])
    if pods_file is not None and trace_dir is None:
        raise click.UsageError("--pods needs --trace (the node list comes from the trace folder)")
    if trace_dir is not None:
        loaded = trace.load_trace(trace_dir, pods_file)
    else:
        loaded = trace.synthetic(seed_list[0], nodes=options["synthetic_nodes"])
    try:
        migcluster.parse_mix(template.mig_mix)
    except migcluster.MigMixError as err:
        raise click.BadParameter(str(err), param_hint="--mig-mix") from None
    admitting = [arm for arm in arm_list if arm_table.BY_NAME[arm].policies]
    if admitting:
        if not policies.is_dir():
            raise InputError(f"{policies}: no such policy folder (give --policies DIR, or leave out the arms "
                             f"that admit pods: {', '.join(arm_table.POLICY_ARMS)})")
        loading.load_dir(policies)  # refuse a bad folder before starting any run
    specs = [dataclasses.replace(template, arm=arm, seed=seed, policies=str(policies) if arm in admitting else None)
             for arm in arm_list for seed in seed_list]
    sharing, ties = template.sharing, template.ties
    with _staging(out) as staged:
        if timeline:
            _timeline(loaded, specs, trace_dir=trace_dir, load=options["load"], out=staged, shown=out,
                      seeds=seed_list, sharing=sharing, workers=workers)
            _publish(staged, out)
            return
        write_pod_mix(loaded, staged)
        progress = report.Progress(len(specs), sys.stderr)
        results = runner.run_many(loaded, specs, workers=workers, progress=progress)
        for result in results:
            report.write_run_csv(result, staged / "runs")
        data = report.summary(results, workload=loaded.workload, seeds=seed_list, sharing=sharing, ties=ties)
        report.write_summary(data, staged)
        report.plot(results, staged / "allocation.png", title=f"GPU allocation vs arrival: {loaded.workload}")
        _publish(staged, out)
    click.echo(report.table(results, workload=loaded.workload, seeds=seed_list, sharing=sharing, ties=ties))
    sized = report.sizing_table(results)
    if sized:
        click.echo(f"{sized}\n(MIG mix {template.mig_mix}; docs/rightsizing.md)")
    click.echo(f"wrote {out / 'summary.json'}, {out / 'allocation.png'}, {out / POD_MIX_FILE} (the pod list's "
               f"shape mix: gpugate balance --extender-mix) and {len(results)} CSV file(s) in {out / 'runs'}")


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A folder beside ``out`` the replay writes into, removed whatever happens: ``out`` gets the
    results only once every one is written (``_publish``), never half of them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _publish(staged: Path, out: Path) -> None:
    """Move what ``staged`` holds into ``out`` (made if missing), replacing entries of the same name."""
    out.mkdir(parents=True, exist_ok=True)
    for entry in sorted(staged.iterdir()):
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)


def _timeline(loaded: Any, specs: list[Any], *, trace_dir: Path | None, load: float, out: Path, shown: Path,
              seeds: list[int], sharing: str, workers: int) -> None:
    """The --timeline replay: the runs, then the table, the CSVs, summary.json and the plot, written
    into ``out`` (the staging folder) and named as they will be in ``shown``."""
    from webhook.replay import arms as table_of_arms
    from webhook.replay import report, timeline, timelinereport, trace

    wrong = [s.arm for s in specs if table_of_arms.BY_NAME[s.arm].kind != "kube"]
    if wrong or sharing == "dra":
        raise click.UsageError(f"--timeline replays the kube-scheduler arms in the timeslice or published world; "
                               f"not {', '.join(wrong) or '--sharing dra'}")
    default = None
    if not loaded.times and trace_dir is not None:
        default = trace.load_trace(trace_dir)  # the multigpu lists borrow the default list's times
    runs = [timeline.TimelineSpec(run=spec, load=load) for spec in specs]
    progress = report.Progress(len(runs), sys.stderr)
    results = timeline.run_many(loaded, runs, default=default, workers=workers, progress=progress)  # type: ignore[arg-type]
    for result in results:
        timelinereport.write_run_csv(result, out / "runs")
    data = timelinereport.summary(results, workload=loaded.workload, seeds=seeds, sharing=sharing, load=load)
    report.write_summary(data, out)
    timelinereport.plot(results, out / "timeline.png", title=f"{loaded.workload} in time, offered load {load:g}")
    click.echo(timelinereport.table(results, workload=loaded.workload, seeds=seeds, sharing=sharing, load=load))
    click.echo(f"wrote {shown / 'summary.json'}, {shown / 'timeline.png'} and {len(results)} CSV file(s) in "
               f"{shown / 'runs'}")


POD_MIX_FILE = "pod-mix.yaml"


def write_pod_mix(loaded: Any, out: Path) -> Path:
    """Write the pod list's shape mix (what ``--extender-mix trace`` configures) where the balancer
    can read it: replaying a cluster's own history is how an operator gets a mix worth pinning."""
    from webhook.placement.shapes import mix_entries
    from webhook.replay.runner import trace_mix

    mix = trace_mix(loaded.pods)  # the trace's own sizes: what a configured mix in the dra world reads
    out.mkdir(parents=True, exist_ok=True)
    path = out / POD_MIX_FILE
    header = (f"# The typical pod shapes of {loaded.workload} (the most common, covering 95% of its pods),\n"
              f"# for gpugate balance --extender-mix (cpu in millicores; gpuMilli: a share's thousandths).\n")
    path.write_text(header + yaml.safe_dump(mix_entries(mix), sort_keys=False), encoding="utf-8")
    return path


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
