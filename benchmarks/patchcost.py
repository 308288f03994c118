"""What one Node label patch costs kube-apiserver, and how much of it is the balancer's doing.

Run by ``benchmarks/balancer_cluster.py --patch-cost N`` once its balancers have stopped (not a
script: the control plane, the nodes and the ServiceAccount are balancer_cluster.py's). Each arm
patches N nodes with 8 writers, as the balancer's pool does, one arm after the other, all in one
run; it prints the API server's CPU milliseconds per patch (its process CPU over the arm, minus
what it burns idle over the same wall time) and the sending process's own CPU per patch.

The arms separate what the sender controls from what the API server does for any sender:

- **who sends the same bytes:** the balancer's own ``NodeWriter`` (kubernetes client, the
  ServiceAccount's token, as the Deployment) against a raw ``http.client`` sending the identical
  request with the same token, the same as the admin (client certificate: no token review, no
  RBAC walk, exempt from priority and fairness), and ``kubectl patch``;
- **what the request asks for:** ``fieldValidation=Ignore`` (the default, Warn, decodes the patch
  and the patched object strictly, handlers/patch.go ``strategicPatchObject`` /
  ``applyPatchToObject``), a JSON merge patch, a metadata-only answer
  (``as=PartialObjectMetadata``), and ``dryRun=All`` (everything but the etcd write and the watch
  events that follow it);
- **what the node carries:** the same node content with managedFields as a kubelet-run GPU node
  leaves them (five managers: kubelet, its status subresource, kube-controller-manager,
  nfd-master, gpu-operator), with one manager owning the same fields, and with none. Why:
  kube-apiserver runs every non-apply write through its field manager
  (``managedfields.FieldManager.UpdateNoErrors``, called from handlers/patch.go), whose
  structured-merge step converts the stored and the patched object to typed values and compares
  them (apimachinery/pkg/util/managedfields/internal/structuredmerge.go ``Update``), whatever the
  patch changed; only an object with no managedFields at all skips it
  (internal/skipnonapplied.go: an update of an untracked object stays untracked).

The arms run in rounds, each round in another order (rotated), and each arm's figure is the median
over the rounds with the lowest and highest beside it: on this shared machine one pass of one arm
moves by several milliseconds with the load, and the nodes drift over the arms (a longer
managedFields entry).
"""

from __future__ import annotations

import copy
import http.client
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks.balancer_scale import cpu_seconds
from webhook.balancer.cluster import NodeWriter
from webhook.kubeclient import api_client
from webhook.localcluster import controlplane

Obj = dict[str, Any]
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON = "application/json"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
PROBE_LABEL = "bench.gpugate.io/probe"
"""What the probe writes: not gpugate's labels, so the balancer's figures are untouched."""
WRITERS = 8  # the balancer's write_concurrency
NODE_SETS = {"kubelet": "", "one manager": "probe-one-", "none": "probe-none-"}
"""The node sets: the run's own nodes (five managers), and copies of them stored under these prefixes."""


@dataclass(frozen=True)
class Arm:
    """One way of sending the label patch, to one set of nodes."""

    name: str
    nodes: str = "kubelet"                 # a key of NODE_SETS
    sender: str = "raw, admin"             # balancer | raw, token | raw, admin | kubectl
    content_type: str = SMP
    accept: str = JSON
    query: str = ""                        # added to ?fieldManager=...


ARMS = (
    Arm("the balancer's NodeWriter (its token)", sender="balancer"),
    Arm("raw HTTP, same request, same token", sender="raw, token"),
    Arm("raw HTTP, same request, as admin"),
    Arm("kubectl patch, as admin", sender="kubectl"),
    Arm("  + fieldValidation=Ignore", query="&fieldValidation=Ignore"),
    Arm("  + JSON merge patch", content_type=MERGE),
    Arm("  + metadata-only answer", accept=METADATA_ONLY),
    Arm("  + dryRun=All (no etcd write, no event)", query="&dryRun=All"),
    Arm("nodes with one manager, as admin", nodes="one manager"),
    Arm("nodes with no managedFields, as admin", nodes="none"),
)


def one_manager(node: Obj) -> Obj:
    """``node`` with its managedFields folded into one Update entry (manager ``kubelet``) owning
    the same fields: as many fields tracked, fewer managers."""
    merged: Obj = {}
    for entry in node["metadata"].get("managedFields") or ():
        _merge_into(merged, entry["fieldsV1"])
    folded = copy.deepcopy(node)
    folded["metadata"]["managedFields"] = [{"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": merged,
                                            "manager": "kubelet", "operation": "Update",
                                            "time": node["metadata"]["creationTimestamp"]}]
    return folded


def no_managers(node: Obj) -> Obj:
    folded = copy.deepcopy(node)
    folded["metadata"].pop("managedFields", None)
    return folded


def _merge_into(into: Obj, fields: Obj) -> None:
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_into(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def renamed(node: Obj, prefix: str) -> Obj:
    """A copy of ``node`` under ``prefix`` + its name, with a uid of its own."""
    copied = copy.deepcopy(node)
    meta = copied["metadata"]
    meta["name"] = prefix + meta["name"]
    meta["uid"] = prefix + meta["uid"][len(prefix):]
    meta["labels"]["kubernetes.io/hostname"] = meta["name"]
    return copied


@dataclass
class Probe:
    """Sends the arms to ``plane``; ``token`` is the balancer's ServiceAccount token."""

    plane: controlplane.ControlPlane
    token: str
    kubeconfig: Path

    @property
    def _port(self) -> int:
        return int(self.plane.server.rsplit(":", 1)[1])

    def run(self, names: dict[str, list[str]], rounds: int = 3,
            arms: tuple[Arm, ...] = ARMS) -> dict[str, list[tuple[float, float]]]:
        """Per arm, per round: (API server CPU ms per patch, sender CPU ms per patch)."""
        idle = self._idle_rate()
        print(f"  patch cost: the API server idles at {idle * 1000:.0f} ms of CPU per second", flush=True)
        costs: dict[str, list[tuple[float, float]]] = {arm.name: [] for arm in arms}
        value = 0
        for round_ in range(rounds):
            shift = round_ * len(arms) // max(rounds, 1)
            for arm in arms[shift:] + arms[:shift]:
                value += 1
                targets = names[arm.nodes]
                time.sleep(2.0)  # the previous arm's watch events delivered
                server_before, wall_before = self._server_cpu(), time.monotonic()
                sender = self._send(arm, targets, str(value))
                time.sleep(2.0)  # this arm's watch events delivered
                server = self._server_cpu() - server_before - idle * (time.monotonic() - wall_before)
                costs[arm.name].append((server * 1000 / len(targets), sender * 1000 / len(targets)))
                print(f"  patch cost, round {round_ + 1}, {arm.name}: {costs[arm.name][-1][0]:.1f} ms of API "
                      f"server CPU, {costs[arm.name][-1][1]:.1f} ms of the sender's, per patch", flush=True)
        return costs

    def _server_cpu(self) -> float:
        return cpu_seconds(next(p.pid for p in self.plane.processes if p.name == "kube-apiserver"))

    def _idle_rate(self, seconds: float = 5.0) -> float:
        before = self._server_cpu()
        time.sleep(seconds)
        return (self._server_cpu() - before) / seconds

    def _send(self, arm: Arm, targets: list[str], value: str) -> float:
        """Patch every target; returns the sender's CPU seconds (this process's, or kubectl's)."""
        body = orjson.dumps({"metadata": {"labels": {PROBE_LABEL: value}}})
        if arm.sender == "kubectl":
            return self._kubectl(targets, body)
        before = time.process_time()
        if arm.sender == "balancer":
            writer = NodeWriter(api_client(self.plane.server, token=self.token, ca_file=str(self.plane.ca.files.cert)))
            patch = orjson.loads(body)
            _in_parallel(targets, lambda: (lambda name: writer.patch(name, patch)))
        else:
            _in_parallel(targets, lambda: self._raw(arm, body))
        return time.process_time() - before

    def _raw(self, arm: Arm, body: bytes) -> Callable[[str], None]:
        """One kept-alive connection's sender of ``arm``'s request, the bytes NodeWriter sends."""
        context = self.plane.admin_ssl_context() if arm.sender == "raw, admin" else \
            ssl.create_default_context(cafile=str(self.plane.ca.files.cert))
        headers = {"Content-Type": arm.content_type, "Accept": arm.accept}
        if arm.sender == "raw, token":
            headers["Authorization"] = f"Bearer {self.token}"
        connection = http.client.HTTPSConnection("127.0.0.1", self._port, context=context)
        query = f"?fieldManager={NodeWriter.FIELD_MANAGER}{arm.query}"

        def send(name: str) -> None:
            connection.request("PATCH", f"/api/v1/nodes/{name}{query}", body, headers)
            answer = connection.getresponse()
            data = answer.read()
            if answer.status != 200:
                raise RuntimeError(f"PATCH node {name} ({arm.name}): {answer.status} {data[:300]!r}")

        return send

    def _kubectl(self, targets: list[str], body: bytes) -> float:
        """``kubectl patch node A B ...``, 8 processes each patching its share over its connection;
        returns their CPU seconds (children's rusage)."""
        before = os.times()
        shares = [targets[i::WRITERS] for i in range(WRITERS)]
        procs = [subprocess.Popen(["kubectl", "--kubeconfig", str(self.kubeconfig), "patch", "node", *share,
                                   "--type", "strategic", "-p", body.decode(),
                                   "--field-manager", NodeWriter.FIELD_MANAGER],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for share in shares if share]
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            if proc.returncode:
                raise RuntimeError(f"kubectl patch exited {proc.returncode}: {err.decode()[-500:]}")
        after = os.times()
        return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def in_threads(count: int, work: Callable[[Callable[[], bool]], None]) -> None:
    """Run ``work(failed)`` on ``count`` threads and wait for all; ``failed()`` turns true once any
    worker has raised, so the others stop early, and the first error is raised here. The one home
    of this pattern for the benchmarks that drive the API server from several connections."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work(lambda: bool(failure))
        except BaseException as err:
            failure.append(err)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failure:
        raise failure[0]


def _in_parallel(targets: list[str], make_sender: Callable[[], Callable[[str], None]]) -> None:
    """Each target once, by WRITERS threads, each with the sender ``make_sender`` gives it."""
    todo: Iterator[str] = iter(targets)
    lock = threading.Lock()

    def work(failed: Callable[[], bool]) -> None:
        send = make_sender()
        while not failed():
            with lock:
                name = next(todo, None)
            if name is None:
                return
            send(name)

    in_threads(WRITERS, work)


def print_costs(costs: dict[str, list[tuple[float, float]]], count: int) -> None:
    rounds = max(len(v) for v in costs.values())
    print(f"\nthe API server's CPU per Node label patch ({count} nodes per arm and round, {rounds} rounds, "
          f"{WRITERS} writers), ms: median [lowest, highest]; and the sender's own CPU per patch")
    print(f"  {'':<44}{'API server':>22}{'sender':>10}")
    for name, figures in costs.items():
        server = sorted(f[0] for f in figures)
        sender = sorted(f[1] for f in figures)
        spread = f"{_median(server):.1f} [{server[0]:.1f}, {server[-1]:.1f}]"
        print(f"  {name:<44}{spread:>22}{_median(sender):>10.1f}")


def _median(values: list[float]) -> float:
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
