"""What a webhook costs a pod create through the real API server, next to the floor any webhook pays.

One e2e control plane (tests/e2e: etcd, kube-apiserver v1.36.3 on 127.0.0.1) and six arms, all
live at once, each in its own namespace:

- ``none``: no webhook selects the namespace;
- ``shaped``: no webhook either, but the pod is created with the fields gpugate's mutation sets
  already in it (annotation, requests and limits, toleration, node affinity): what the bigger pod
  alone costs the API server and etcd;
- ``go``: tests/e2e/toolchain/floor-webhook, a minimal webhook in Go (TLS, JSON decode of the
  review and the pod, allow): the floor any webhook pays, with Go's HTTP/2;
- ``go-patch``: the same Go webhook answering /mutate with gpugate's own JSON Patch for this pod
  (``--patch``; the patch is asked of the gpugate arm's server before the rounds): the floor a
  *mutating* webhook pays, whose API server applies the patch and carries the bigger pod through
  validation, the validating call and etcd. gpugate is judged against both floors: the latency goal
  against ``go``, and what is gpugate's own against ``go-patch``;
- ``null``: benchmarks/null_server.py, gpugate's server with a core that allows everything;
- ``gpugate``: ``gpugate serve`` with the starter policies/ (the pod is shaped and validated).

Every webhook arm registers the Mutating- and ValidatingWebhookConfiguration exactly as
``kubectl kustomize manifests/webhook`` renders them, with ``clientConfig`` pointed at the arm's
server by url and the namespaceSelector narrowed to the arm's namespace, so the API server makes
the same two calls per pod for each. Pods: a GPU pod with one gpugate label (``gpugate.io/gpus``)
in an ``ml-*`` namespace. ``--before REV`` adds an arm, ``before``: gpugate at an older git
revision (a temporary worktree). ``--arms`` keeps only some of the optional arms.

Where the time goes is printed twice: as differences of added latency between arms (the patch:
go-patch - go; the bigger pod: shaped - none; gpugate's own: gpugate - go-patch), and as the CPU
kube-apiserver + etcd spend during each serial create (median per arm), which a loaded machine
hardly moves.

How the arms are kept comparable on a shared machine whose load swings: serial creates
are interleaved, one create per arm in turn (none, shaped, go, ..., none, ...), so a slow spell
falls on every arm alike; in the parallel phase each of the ``--parallel`` creators (each on its own
client) moves to the next arm after each create, so the creators are spread over the arms at every
moment; an arm's create rate is then the creators' count over its mean create time (Little's law
for closed-loop creators). An arm's *added*
latency at p50 or p99 is its percentile minus ``none``'s percentile over the same rounds. Its
noise is shown as a 90% bootstrap interval: the serial interleaving steps (one create of every arm)
are resampled whole, the parallel creates per arm. A ratio to the Go floor is *decided* when its
whole interval lies on one side of the goal; otherwise it is printed as "within noise".

    python benchmarks/create_latency.py [--pods 150] [--parallel 8] [--rounds 4] [--before REV]
        [--arms shaped,go-patch,null]
    python benchmarks/create_latency.py --pods 6 --rounds 1      # shortest
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import random
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from benchmarks.admission_load import checkout  # noqa: E402
from tests.e2e import binaries as e2e_binaries  # noqa: E402
from tests.e2e.webhook_fixture import (  # noqa: E402
    GpugateServer,
    Namespaces,
    RenderedWebhooks,
    ServingCerts,
    kustomize,
)
from tests.server.shapedpod import shaped_body, the_pod  # noqa: E402
from webhook.localcluster import binaries, processes  # noqa: E402
from webhook.localcluster.cluster import Cluster  # noqa: E402

ARMS = ("none", "shaped", "go", "go-patch", "null", "gpugate")
REQUIRED = ("none", "go", "gpugate")
"""The baseline, the Go floor and gpugate: every run has them (``--arms`` picks among the rest)."""
GO_ARMS = ("go", "go-patch")
SHAPED_ARMS = ("go-patch", "gpugate", "before")
"""Arms whose created pods carry gpugate's mark (``gpugate.io/policy``), once their webhook is called."""
WEBHOOK_BASE = REPO / "manifests" / "webhook"
LOOPBACK = "127.0.0.1"
Obj = dict[str, Any]


@dataclass
class Arm:
    """One arm: its namespace, and the server behind its webhooks (None for ``none``)."""

    name: str
    namespace: str
    base_url: str | None = None
    port: int | None = None
    serial: list[float] | None = None
    parallel: list[float] | None = None
    pid: int | None = None
    server_cpu: float = 0.0   # CPU seconds of the webhook server (all its processes) over the rounds
    idle_cpu: float = 0.0     # CPU seconds per second the same server spends with no request (its pollers)
    pods: int = 0
    body: Obj | None = None   # the pod this arm creates (None: ``the_pod``, the user's plain GPU pod)
    plane_serial: list[float] | None = None  # CPU seconds of kube-apiserver + etcd during each serial create
    metrics_port: int | None = None           # a gunicorn arm's plaintext /metrics (the TLS port has none)
    failed: dict[int, int] = field(default_factory=dict)   # refused creates per number of creators
    failures: list[str] = field(default_factory=list)
    by_level: dict[int, list[float]] | None = None  # create times per number of concurrent creators

    def __post_init__(self) -> None:
        self.serial, self.parallel, self.plane_serial, self.by_level = [], [], [], {}

    def pod(self, name: str) -> Obj:
        if self.body is None:
            return the_pod(name)
        body = copy.deepcopy(self.body)
        body["metadata"]["name"] = name
        return body


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of ``pid`` and its live descendants (gunicorn's workers), all their threads, from
    /proc's schedstat (nanoseconds: the clock ticks of /proc/PID/stat made a 15 s idle measurement
    uncertain by about 2 ms/s)."""
    if pid is None:
        return 0.0
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    total, frontier = 0.0, [pid]
    while frontier:
        current = frontier.pop()
        total += _process_cpu(current)
        frontier += [child for child, parent in parents.items() if parent == current]
    return total


def _process_cpu(pid: int) -> float:
    """Run time of every thread of ``pid``, in seconds (0 once it is gone)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return 0.0
    return total / 1e9


def idle_rates(arms: list[Arm], seconds: float) -> None:
    """Each server's CPU per second with no request, over ``seconds`` (all arms at once).

    In the interleaved rounds each server idles most of the time (the other arms' creates), so its CPU
    over the rounds holds its pollers' too: at gpugate's default 1 s policy and certificate reload,
    about as much as its reviews on a long loaded run."""
    before = {arm.name: tree_cpu(arm.pid) for arm in arms}
    time.sleep(seconds)
    for arm in arms:
        arm.idle_cpu = (tree_cpu(arm.pid) - before[arm.name]) / seconds


# --- the servers -----------------------------------------------------------------------------

@contextmanager
def subprocess_server(command: list[str], port: int, log: Path, ca: Path, ready_path: str,
                      env: dict[str, str] | None = None, cwd: Path | None = None) -> Iterator[int]:
    """A server started in its own session, ready when ``ready_path`` answers 200, stopped by PID.

    ``cwd``: where it runs; ``python -m`` puts that folder first on the module path, so the before arm
    runs there, or it would import this checkout's code whatever PYTHONPATH says."""
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, **(env or {})}, cwd=cwd)
    try:
        context = ssl.create_default_context(cafile=str(ca))
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited {process.returncode}:\n{processes.tail(log, 30)}")
            try:
                with urllib.request.urlopen(f"https://{LOOPBACK}:{port}{ready_path}", context=context,
                                            timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} never became ready:\n{processes.tail(log, 30)}")
            time.sleep(0.2)
        yield process.pid
    finally:
        processes.Process(command[0], process, (port,), log).stop(grace=30)


def go_stats(arm: Arm, ca: Path) -> dict[str, int]:
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"{arm.base_url}/stats", context=context, timeout=5) as answer:
        return dict(json.loads(answer.read()))


def gunicorn_counts(arm: Arm, ca: Path) -> tuple[float, float, float]:
    """TLS connections accepted (all, and HTTP/2) and reviews answered so far by a gunicorn arm, from its
    plaintext /metrics, or from the TLS port for a revision that served them there (NaN where a
    revision has no such counter)."""
    if arm.metrics_port is not None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        text = opener.open(f"http://127.0.0.1:{arm.metrics_port}/metrics", timeout=5).read().decode()
    else:
        context = ssl.create_default_context(cafile=str(ca))
        with urllib.request.urlopen(f"{arm.base_url}/metrics", context=context, timeout=5) as answer:
            text = answer.read().decode()

    def counter(name: str) -> float:
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else float("nan")

    reviews = sum(float(m.group(1)) for m in re.finditer(r"^gpugate_admissions_total\{.*\} (\S+)$", text, re.MULTILINE))
    return counter("gpugate_connections_accepted_total"), counter("gpugate_http2_connections_total"), reviews



# --- registration ----------------------------------------------------------------------------

def register(api: client.AdmissionregistrationV1Api, rendered: RenderedWebhooks, arm: Arm, ca_pem: bytes) -> None:
    """The rendered pair, named for the arm, pointed at its server, selecting only its namespace."""
    assert arm.base_url is not None
    pointed = rendered.pointed_at(arm.base_url, ca_pem)
    for document, create in ((pointed.mutating, api.create_mutating_webhook_configuration),
                             (pointed.validating, api.create_validating_webhook_configuration)):
        body = copy.deepcopy(document)
        body["metadata"] = {"name": f"bench-{arm.name}"}
        for hook in body["webhooks"]:
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": arm.namespace}}
        create(body)


def unregister(api: client.AdmissionregistrationV1Api, arm: Arm) -> None:
    for delete in (api.delete_mutating_webhook_configuration, api.delete_validating_webhook_configuration):
        try:
            delete(f"bench-{arm.name}")
        except ApiException as error:
            if error.status != 404:
                raise


# --- creating pods ---------------------------------------------------------------------------

def create_one(core: client.CoreV1Api, arm: Arm, name: str) -> float:
    body = arm.pod(name)
    started = time.perf_counter()
    core.create_namespaced_pod(arm.namespace, body, _preload_content=False)
    return time.perf_counter() - started


def gpugate_patch(core: client.CoreV1Api, gpugate: Arm, namespace: str, ca: Path) -> list[Obj]:
    """The JSON Patch gpugate's server answers for the benchmark's pod in ``namespace``: the pod as
    the API server hands it to webhooks (a dry-run create there, where no webhook is registered yet:
    defaults and the built-in admission plugins applied) in a review posted to the arm's /mutate."""
    assert gpugate.base_url is not None
    pod = json.loads(core.create_namespaced_pod(namespace, the_pod("patch-probe"), dry_run="All",
                                                _preload_content=False).data)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "create-latency-patch-probe", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "object": pod, "userInfo": {"username": "create-latency"}, "dryRun": False}}
    request = urllib.request.Request(f"{gpugate.base_url}/mutate", data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as answer:
        response = json.loads(answer.read())["response"]
    if not response.get("allowed") or response.get("patchType") != "JSONPatch":
        raise RuntimeError(f"gpugate did not shape the benchmark's pod: {response}")
    return list(json.loads(base64.b64decode(response["patch"])))


def serial_interleaved(core: client.CoreV1Api, arms: list[Arm], count: int, tag: str,
                       plane_pids: Sequence[int] = ()) -> None:
    """``count`` steps of one create per arm in turn: every arm meets the same spells of load, and
    step i of one arm pairs with step i of the others (the bootstrap resamples whole steps).

    The CPU kube-apiserver and etcd spend from just before each create to just after it goes to the
    arm's ``plane_serial``: with one create in flight that is mostly this create's (what the API
    server does for a webhook's answer, a patch, a bigger pod), plus whatever runs meanwhile (the
    scheduler's look at the previous pod, the controllers), which the median mostly leaves out.
    CPU time, unlike latency, hardly grows when the machine is loaded."""
    for i in range(count):
        for arm in arms:
            assert arm.serial is not None
            before = sum(map(_process_cpu, plane_pids))
            arm.serial.append(create_one(core, arm, f"s-{tag}-{i}"))
            assert arm.plane_serial is not None
            arm.plane_serial.append(sum(map(_process_cpu, plane_pids)) - before)


def parallel_interleaved(cores: list[client.CoreV1Api], arms: list[Arm], count: int, tag: str,
                         main_level: bool = True) -> None:
    """``len(cores)`` creators, each on its own client (its own connections), ``count`` pods per arm
    in all; creator i's j-th create goes to arm (i + j) mod arms, so at every moment the creators
    are spread over the arms and every arm meets the same spells of load."""
    creators = len(cores)
    steps = count * len(arms)
    per = [steps // creators + (1 if i < steps % creators else 0) for i in range(creators)]
    barrier = threading.Barrier(creators)
    lock = threading.Lock()

    def creator(index: int) -> None:
        barrier.wait()
        for j in range(per[index]):
            arm = arms[(index + j) % len(arms)]
            started = time.perf_counter()
            try:
                took = create_one(cores[index], arm, f"p-{tag}-{index}-{j}")
            except ApiException as err:  # a refused create (a webhook's timeout, failing closed) is counted
                took = time.perf_counter() - started
                with lock:
                    arm.failed[creators] = arm.failed.get(creators, 0) + 1
                    arm.failures.append(f"{creators} creators: {err.status} {str(err.body)[:160]}")
            with lock:
                assert arm.parallel is not None and arm.by_level is not None
                if main_level:
                    arm.parallel.append(took)
                arm.by_level.setdefault(creators, []).append(took)

    with ThreadPoolExecutor(creators) as pool:
        list(pool.map(creator, range(creators)))


def clear(core: client.CoreV1Api, namespace: str) -> None:
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod(namespace, limit=1).items:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} were not deleted within 120 s")
        time.sleep(0.2)


def warm(core: client.CoreV1Api, arm: Arm, check: Callable[[Obj], bool] | None) -> Obj:
    """Creates until the API server calls the arm's webhooks (its webhook informer lags a little);
    the first pod that passed ``check``, as the API server answered it."""
    deadline = time.monotonic() + 30
    for i in range(10_000):
        created = json.loads(core.create_namespaced_pod(arm.namespace, arm.pod(f"warm-{i}"),
                                                        _preload_content=False).data)
        if check is None or check(created):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server never called the {arm.name} webhook")
        time.sleep(0.2)
    for _ in range(10):
        create_one(core, arm, f"warm-more-{time.monotonic_ns()}")
    return dict(created)


# --- figures ---------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] * 1000


RESAMPLES = 1000
GOAL_LATENCY, GOAL_RATE = 1.5, 0.85
MEASURES = ("serial +p50", "serial +p99", "parallel +p50", "parallel +p99")


def added(arms: dict[str, Arm], name: str, serial_steps: list[int] | None = None,
          parallel_pick: dict[str, list[int]] | None = None) -> tuple[float, float, float, float]:
    """Added serial p50, p99 and parallel p50, p99 of arm ``name`` over ``none`` (ms), on the given
    resample (step indices for serial, indices per arm for parallel) or on all creates."""
    def serial_of(arm: Arm) -> list[float]:
        assert arm.serial is not None
        return arm.serial if serial_steps is None else [arm.serial[i] for i in serial_steps]

    def parallel_of(arm: Arm) -> list[float]:
        assert arm.parallel is not None
        return arm.parallel if parallel_pick is None else [arm.parallel[i] for i in parallel_pick[arm.name]]

    base, arm = arms["none"], arms[name]
    s_base, s_arm, p_base, p_arm = serial_of(base), serial_of(arm), parallel_of(base), parallel_of(arm)
    return (pct(s_arm, 0.5) - pct(s_base, 0.5), pct(s_arm, 0.99) - pct(s_base, 0.99),
            pct(p_arm, 0.5) - pct(p_base, 0.5), pct(p_arm, 0.99) - pct(p_base, 0.99))


def bootstrap(arms: dict[str, Arm], seed: int = 28) -> dict[str, list[tuple[float, float, float, float]]]:
    """Each arm's added latencies on ``RESAMPLES`` resamples: serial steps drawn whole (paired
    across arms), parallel creates drawn per arm."""
    rng = random.Random(seed)
    steps = len(arms["none"].serial or [])
    out: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in arms if name != "none"}
    for _ in range(RESAMPLES):
        serial_steps = [rng.randrange(steps) for _ in range(steps)]
        pick = {name: [rng.randrange(len(arm.parallel or [])) for _ in range(len(arm.parallel or []))]
                for name, arm in arms.items()}
        for name in out:
            out[name].append(added(arms, name, serial_steps, pick))
    return out


def interval(values: list[float]) -> tuple[float, float]:
    """The 5th and 95th percentiles: a 90% interval."""
    ordered = sorted(values)
    return ordered[int(0.05 * (len(ordered) - 1))], ordered[int(0.95 * (len(ordered) - 1))]


def ratio(mine: float, floor: float) -> float:
    """gpugate's added latency over the floor's; the floor at or under 0 makes any positive cost infinite."""
    if floor <= 0:
        return float("inf") if mine > 0 else 0.0
    return mine / floor


def verdict(low: float, high: float, goal: float, *, at_most: bool) -> str:
    if at_most:
        return "met" if high <= goal else "MISSED" if low > goal else "within noise"
    return "met" if low >= goal else "MISSED" if high < goal else "within noise"


def report(arms: dict[str, Arm], parallel_count: int, notes: list[str], rounds_seconds: float) -> None:
    base = arms["none"]
    assert base.serial is not None and base.parallel is not None
    print(f"\n{'arm':<9}{'serial p50':>11}{'p99':>8}{'+p50':>7}{'+p99':>7}   "
          f"{parallel_count} creators: {'p50':>6}{'p99':>8}{'/s':>7}{'+p50':>7}{'+p99':>7}{'rate/none':>10}")
    print(f"(creates/s with {parallel_count} creators: {parallel_count} / the arm's mean create time, Little's law "
          "for closed-loop creators; the creators' creates are interleaved over the arms)")
    rates: dict[str, float] = {}
    for name, arm in arms.items():
        assert arm.serial is not None and arm.parallel is not None
        # Closed-loop creators (Little's law): the rate N creators reach is N / the mean create time.
        rates[name] = parallel_count / (sum(arm.parallel) / len(arm.parallel))
        a = added(arms, name)
        print(f"{name:<9}{pct(arm.serial, 0.5):>9.1f}ms{pct(arm.serial, 0.99):>6.1f}ms{a[0]:>7.1f}{a[1]:>7.1f}   "
              f"{'':>12}{pct(arm.parallel, 0.5):>6.1f}{pct(arm.parallel, 0.99):>8.1f}{rates[name]:>7.0f}"
              f"{a[2]:>7.1f}{a[3]:>7.1f}{rates[name] / rates['none']:>10.2f}")
    print(f"\n{len(base.serial)} serial creates per arm (interleaved), {len(base.parallel)} parallel; "
          f"added = the arm's percentile minus none's; [90% bootstrap interval, {RESAMPLES} resamples]")
    samples = bootstrap(arms)
    print(f"{'added, ms':<16}" + "".join(f"{name:>22}" for name in samples))
    for index, measure in enumerate(MEASURES):
        cells = []
        for name in samples:
            low, high = interval([sample[index] for sample in samples[name]])
            cells.append(f"{added(arms, name)[index]:>6.1f} [{low:>5.1f}, {high:>5.1f}]")
        print(f"{measure:<16}" + "".join(f"{cell:>22}" for cell in cells))
    print_differences(arms, samples)
    for floor, title in (("go", "the Go floor (allow-only; the goal: added latency <= "
                                f"{GOAL_LATENCY}x, create rate >= {GOAL_RATE}x)"),
                         ("go-patch", "the Go floor answering gpugate's patch (the floor a mutating webhook pays)")):
        if floor in arms and "gpugate" in arms:
            print(f"\ngpugate / {title}:")
            print_ratios(arms, samples, rates, floor, parallel_count)
    print(f"\nCPU of each webhook server per pod created over the {rounds_seconds:.0f} s of rounds, ms; idle: what "
          "the server burns with no request (policy, certificate and inventory pollers, the loops), measured "
          "before the rounds; the last column takes it out:")
    print("and what kube-apiserver + etcd spent during a serial create (see serial_interleaved; median, ms), and "
          "its excess over none's (what the API server does for the arm's webhooks and the pod they leave):")
    print(f"{'arm':<9}{'per pod':>8}{'idle ms/s':>11}{'less idle':>11}{'plane/serial':>14}{'over none':>11}")
    plane_none = pct(base.plane_serial or [0.0], 0.5)
    for name, arm in arms.items():
        pods = max(arm.pods, 1)
        busy = arm.server_cpu - arm.idle_cpu * rounds_seconds
        plane = pct(arm.plane_serial or [0.0], 0.5)
        print(f"{name:<9}{arm.server_cpu * 1000 / pods:>8.2f}{arm.idle_cpu * 1000:>11.1f}{busy * 1000 / pods:>11.2f}"
              f"{plane:>14.2f}{plane - plane_none:>11.2f}")
    for note in notes:
        print(note)


def print_ratios(arms: dict[str, Arm], samples: dict[str, list[tuple[float, float, float, float]]],
                 rates: dict[str, float], floor: str, parallel_count: int) -> None:
    """gpugate's added latencies and create rate over ``floor``'s, each with its bootstrap interval
    (the ratio taken on each resample) and its verdict against the latency goals."""
    base, mine = added(arms, floor), added(arms, "gpugate")
    for index, measure in enumerate(MEASURES):
        ratios = [ratio(g[index], f[index]) for g, f in zip(samples["gpugate"], samples[floor], strict=True)]
        low, high = interval(ratios)
        print(f"  {measure:<15}{ratio(mine[index], base[index]):>6.2f}x  [{low:.2f}, {high:.2f}]  "
              f"{verdict(low, high, GOAL_LATENCY, at_most=True)}")
    rate = rates["gpugate"] / rates[floor]
    print(f"  {'create rate':<15}{rate:>6.2f}x  ({parallel_count} creators)  "
          f"{'met' if rate >= GOAL_RATE else 'MISSED'}")


DIFFERENCES = (("go-patch", "go", "what the API server spends on gpugate's patch (go-patch - go)"),
               ("shaped", None, "what the shaped pod alone costs, no webhook (shaped - none)"),
               ("gpugate", "go-patch", "what gpugate adds over the mutating floor (gpugate - go-patch)"),
               ("gpugate", "null", "what gpugate's core and patch add to its own server (gpugate - null)"))


def print_differences(arms: dict[str, Arm], samples: dict[str, list[tuple[float, float, float, float]]]) -> None:
    """Where the added time goes: one arm's added latency minus another's, on the same resamples."""
    shown = [(a, b, text) for a, b, text in DIFFERENCES if a in samples and (b is None or b in samples)]
    if not shown:
        return
    print("\nwhere it goes, ms [90% bootstrap interval]:")
    print(f"{'':<72}{'serial +p50':>20}{'parallel +p50':>20}")
    for a, b, text in shown:
        cells = []
        zero = [(0.0, 0.0, 0.0, 0.0)] * len(samples[a])
        minus = samples[b] if b is not None else zero
        for index in (0, 2):
            low, high = interval([x[index] - y[index] for x, y in zip(samples[a], minus, strict=True)])
            whole = added(arms, a)[index] - (added(arms, b)[index] if b is not None else 0.0)
            cells.append(f"{whole:>5.1f} [{low:>4.1f}, {high:>4.1f}]")
        print(f"{text:<72}" + "".join(f"{cell:>20}" for cell in cells))


def hostile_phase(core: client.CoreV1Api, arms: dict[str, Arm], seconds: float, ca: Path) -> None:
    """An ordinary creator, interleaved over gpugate and the Go floor, while gpugate's server is under
    ``hostile_load.HostileLoad``; the p50 and p99 of its creates, and the same before the attack."""
    from benchmarks.hostile_load import HostileLoad

    pair = [arms[name] for name in ("go", "gpugate")]
    assert pair[1].port is not None

    def ordinary(tag: str) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {arm.name: [] for arm in pair}
        deadline = time.monotonic() + seconds
        index = 0
        while time.monotonic() < deadline:
            for arm in pair:
                times[arm.name].append(create_one(core, arm, f"h-{tag}-{index}"))
            index += 1
        for arm in pair:
            clear(core, arm.namespace)
        return times

    quiet = ordinary("quiet")
    attack = HostileLoad(pair[1].port, ca).start()
    time.sleep(2.0)
    try:
        under = ordinary("attack")
    finally:
        counts = attack.stop()
    print(f"\nhostile load on gpugate's server for {seconds:.0f} s ({counts}); an ordinary creator, interleaved "
          "over the Go floor's namespace and gpugate's, create latency p50 / p99, ms:")
    for name in ("go", "gpugate"):
        print(f"  {name:<8} quiet {pct(quiet[name], 0.5):6.1f} / {pct(quiet[name], 0.99):6.1f}   "
              f"under attack {pct(under[name], 0.5):6.1f} / {pct(under[name], 0.99):6.1f}   "
              f"({len(under[name])} creates)")


def report_levels(arms: dict[str, Arm], seed: int = 40) -> None:
    """Create rate per number of concurrent creators, each arm against the Go floor, with a 90% interval."""
    if "go" not in arms:
        return
    rng = random.Random(seed)
    print("\ncreate rate by concurrent creators (N / mean create time), and against the Go floor "
          "[90% bootstrap interval]; all arms interleaved in one run:")
    for level in sorted(arms["go"].by_level or {}):
        cells = []
        go = (arms["go"].by_level or {})[level]
        for name, arm in arms.items():
            times = (arm.by_level or {}).get(level, [])
            if not times:
                continue
            rate = level / (sum(times) / len(times))
            samples = []
            for _ in range(RESAMPLES):
                mine = [times[rng.randrange(len(times))] for _ in times]
                floor = [go[rng.randrange(len(go))] for _ in go]
                samples.append((sum(floor) / len(floor)) / (sum(mine) / len(mine)))
            low, high = interval(samples)
            cells.append(f"{name} {rate:.0f}/s {(sum(go) / len(go)) / (sum(times) / len(times)):.2f}x "
                         f"[{low:.2f}, {high:.2f}]")
        print(f"  {level:>4} creators: " + "; ".join(cells))
        refused = {name: (arm.failed or {}).get(level, 0) for name, arm in arms.items()}
        if any(refused.values()):
            print(f"       refused creates (counted in the times above): {refused}")
    for name, arm in arms.items():
        for line in arm.failures[:3]:
            print(f"  {name} refused: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=150, help="pods per arm, per phase, per round")
    parser.add_argument("--parallel", type=lambda text: [int(n) for n in text.split(",")], default=[8],
                        metavar="N,M", help="creators of the parallel phases (the first is reported in full, "
                                            "each with its create rate against the Go floor)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers of null and gpugate")
    parser.add_argument("--idle-seconds", type=float, default=15.0,
                        help="how long each server's CPU with no request is measured before the rounds")
    parser.add_argument("--arms", type=lambda text: tuple(text.split(",")), metavar="A,B",
                        help=f"only these of {', '.join(ARMS)} ({', '.join(REQUIRED)} always run)")
    parser.add_argument("--hostile", type=float, default=0.0, metavar="SECONDS",
                        help="after the rounds, one ordinary creator for SECONDS per arm-pair (gpugate and the Go "
                             "floor, interleaved) while benchmarks/hostile_load.py attacks gpugate's server")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="FLAG",
                        help="one more gpugate serve flag for the gpugate arm (e.g. --serve-arg=--no-http2)")
    parser.add_argument("--before", metavar="REV", help="also run gpugate at this git revision, in the same rounds")
    parser.add_argument("--floor", type=Path, metavar="BINARY",
                        help="the floor webhook binary to run (default: the cached build, built on first use)")
    args = parser.parse_args()
    arm_names = tuple(name for name in ARMS if name in REQUIRED or name in (args.arms or ARMS))
    if args.before:
        arm_names += ("before",)
    found = binaries.paths()
    if found is None:
        raise SystemExit("the e2e control-plane binaries are not built: python -m tests.e2e.binaries build")
    floor = args.floor or e2e_binaries.floor_webhook()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="create-latency-")))
        print("starting the control plane ...", flush=True)
        cluster = Cluster.local(found)
        stack.callback(cluster.stop)
        certs = ServingCerts(tmp / "certs")
        namespaces = Namespaces(cluster)
        arms = {name: Arm(name, namespaces.make(f"ml-bench-{name}")) for name in arm_names}
        stack.callback(namespaces.delete_all)
        for arm in arms.values():
            if arm.name in (*GO_ARMS, "null"):
                arm.port = processes.free_port()
                arm.base_url = f"https://{LOOPBACK}:{arm.port}"

        def start_go(arm: Arm, *extra: str) -> None:
            assert arm.port is not None
            arm.pid = stack.enter_context(subprocess_server(
                [str(floor), "--bind", f"{LOOPBACK}:{arm.port}", "--cert", str(certs.cert), "--key",
                 str(certs.key), *extra], arm.port, tmp / f"{arm.name}.log", certs.ca, "/healthz"))

        start_go(arms["go"])
        if "null" in arms:
            null = arms["null"]
            assert null.port is not None
            null.metrics_port = processes.free_port()
            null.pid = stack.enter_context(subprocess_server(
                [sys.executable, str(REPO / "benchmarks" / "null_server.py"), "--bind", f"{LOOPBACK}:{null.port}",
                 "--cert", str(certs.cert), "--key", str(certs.key), "--workers", str(args.workers),
                 "--metrics-port", str(null.metrics_port)],
                null.port, tmp / "null.log", certs.ca, "/readyz"))
        arms["gpugate"].metrics_port = processes.free_port()
        gpugate = GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca, policies=REPO / "policies",
                                log=tmp / "gpugate.log", workers=args.workers,
                                extra_args=("--metrics-bind", f"127.0.0.1:{arms['gpugate'].metrics_port}",
                                            *args.serve_arg),
                                reload_interval=1.0)  # gpugate serve's default, as the before arm runs
        gpugate.start()
        stack.callback(gpugate.stop)
        arms["gpugate"].base_url, arms["gpugate"].port = gpugate.base_url, gpugate.port
        assert gpugate.process is not None
        arms["gpugate"].pid = gpugate.process.pid
        if args.before:
            code = checkout(args.before, tmp / "before-code")
            stack.callback(subprocess.run, ["git", "-C", str(REPO), "worktree", "remove", "--force", str(code)],
                           capture_output=True)
            before = arms["before"]
            before.port = processes.free_port()
            before.metrics_port = processes.free_port()
            before.base_url = f"https://{LOOPBACK}:{before.port}"
            before.pid = stack.enter_context(subprocess_server(
                [sys.executable, "-m", "webhook.cli", "serve", "--bind", f"{LOOPBACK}:{before.port}", "--cert",
                 str(certs.cert), "--key", str(certs.key), "--policies", str(code / "policies"), "--workers",
                 str(args.workers), "--metrics-bind", f"127.0.0.1:{before.metrics_port}",
                 "--state-dir", str(tmp / "before-state")], before.port, tmp / "before.log", certs.ca, "/readyz",
                env={"PYTHONPATH": str(code)}, cwd=code))
        assert cluster.plane is not None
        plane_pids = [p.pid for p in cluster.plane.processes if p.name in ("etcd", "kube-apiserver")]

        api = client.AdmissionregistrationV1Api(cluster.api_client())
        rendered = RenderedWebhooks.of(kustomize(WEBHOOK_BASE))
        core = cluster.core()
        cores = [client.CoreV1Api(cluster.api_client()) for _ in range(max(args.parallel))]
        shaped = lambda pod: "gpugate.io/policy" in (pod["metadata"].get("annotations") or {})  # noqa: E731
        # gpugate first: its patch and its shaped pod are what go-patch answers and shaped creates.
        register(api, rendered, arms["gpugate"], certs.bundle.ca_cert)
        stack.callback(unregister, api, arms["gpugate"])
        created = warm(core, arms["gpugate"], shaped)
        patch = gpugate_patch(core, arms["gpugate"], arms["none"].namespace, certs.ca)
        if "shaped" in arms:
            arms["shaped"].body = shaped_body(created, patch)
        if "go-patch" in arms:
            patch_file = tmp / "gpugate-patch.json"
            patch_file.write_text(json.dumps(patch))
            start_go(arms["go-patch"], "--patch", str(patch_file))
        for arm in arms.values():
            if arm.base_url is not None and arm.name != "gpugate":
                register(api, rendered, arm, certs.bundle.ca_cert)
                stack.callback(unregister, api, arm)
        for arm in arms.values():
            if arm.name != "gpugate":
                created = warm(core, arm, shaped if arm.name in SHAPED_ARMS else None)
                if arm.name == "shaped" and not shaped(created):
                    raise RuntimeError("the shaped arm's pod lost gpugate's mark on the way in")
            clear(core, arm.namespace)
        go_before = {name: go_stats(arms[name], certs.ca) for name in GO_ARMS if name in arms}

        order = [arms[name] for name in arm_names]
        counts_before = {arm.name: gunicorn_counts(arm, certs.ca) for arm in order
                         if arm.name in ("null", "gpugate", "before")}
        idle_rates(order, args.idle_seconds)
        server_before = {arm.name: tree_cpu(arm.pid) for arm in order}
        plane_before = sum(map(tree_cpu, plane_pids))
        rounds_started = time.monotonic()
        for round_ in range(args.rounds):
            serial_interleaved(core, order, args.pods, f"{round_}", plane_pids)
            for arm in order:
                clear(core, arm.namespace)
            for index, level in enumerate(args.parallel):
                parallel_interleaved(cores[:level], order, max(args.pods, level), f"{round_}-{level}",
                                     main_level=index == 0)
                for current in order:
                    clear(core, current.namespace)
                    current.pods += max(args.pods, level)
            for current in order:
                current.pods += args.pods
            print(f"round {round_ + 1}/{args.rounds} done (serial order {', '.join(a.name for a in order)})",
                  flush=True)
            order = order[1:] + order[:1]
        rounds_seconds = time.monotonic() - rounds_started
        if args.hostile:
            hostile_phase(core, arms, args.hostile, certs.ca)
        for arm in order:
            arm.server_cpu = tree_cpu(arm.pid) - server_before[arm.name]
        plane_cpu = sum(map(tree_cpu, plane_pids)) - plane_before
        notes = [f"\ngpugate's patch for the benchmark's pod (what go-patch answers, what shaped carries): "
                 f"{len(patch)} operations, {len(json.dumps(patch))} bytes: "
                 + ", ".join(f"{op['op']} {op['path']}" for op in patch),
                 "how the API server called each server (during the rounds):"]
        for name in (name for name in GO_ARMS if name in arms):
            go_after = go_stats(arms[name], certs.ca)
            notes.append(f"{name}: {go_after['connections'] - go_before[name]['connections']} connections opened, "
                         "requests " + ", ".join(f"{k} {go_after.get(k, 0) - go_before[name].get(k, 0)}"
                                                 for k in sorted(go_after) if k.startswith("HTTP")))
        for name, (connections, http2, reviews) in counts_before.items():
            after_connections, after_http2, after_reviews = gunicorn_counts(arms[name], certs.ca)
            notes.append(f"{name}: {after_connections - connections:.0f} connections accepted "
                         f"({after_http2 - http2:.0f} of them HTTP/2) for {after_reviews - reviews:.0f} reviews")
        notes.append(f"kube-apiserver + etcd: {1000 * plane_cpu / sum(a.pods for a in arms.values()):.2f} ms "
                     "of CPU per pod created, all arms together")
        report(arms, args.parallel[0], notes, rounds_seconds)
        report_levels(arms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
