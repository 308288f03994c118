"""The cluster an e2e test talks to: a local control plane (or an existing one) plus fake GPU nodes.

:class:`Cluster` is what the ``cluster`` fixture yields; this module is also a command to start
the same cluster by hand and poke at it with kubectl::

    python -m webhook.localcluster.cluster up --gpu-nodes 8     # builds binaries if missing, Ctrl-C stops
    export KUBECONFIG=/tmp/gpugate-e2e-.../admin.kubeconfig   # printed by the command
    kubectl get nodes -L nvidia.com/gpu.product

Two ways to get one: :meth:`Cluster.local` starts etcd, kube-apiserver, kube-controller-manager
and kube-scheduler on 127.0.0.1; :meth:`Cluster.attach` uses an existing cluster's kubeconfig
(``GPUGATE_E2E_KUBECONFIG``). Either way nodes made with :meth:`Cluster.add_gpu_node` are served
by a :class:`~webhook.localcluster.fakekubelet.FakeKubelet` in this process.
"""

from __future__ import annotations

import argparse
import itertools
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from webhook.localcluster import binaries, controlplane, interrupts, processes
from webhook.localcluster.fakekubelet import FakeKubelet, NodeSpec

KUBECONFIG_ENV = "GPUGATE_E2E_KUBECONFIG"


class Cluster:
    """A running cluster with fake nodes; build it with :meth:`local` or :meth:`attach`.

    ``kubeconfig`` is an admin kubeconfig path; ``plane`` is the local
    :class:`~webhook.localcluster.controlplane.ControlPlane` (None when attached to an existing cluster).
    """

    def __init__(self, kubeconfig: Path, plane: controlplane.ControlPlane | None = None) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.plane = plane
        self._api = self.api_client()
        self.kubelet = FakeKubelet(self.api_client())  # its own connection pool, used from its threads
        # Unique per cluster object, so two sessions attached to one cluster do not collide.
        self._prefix = "e2e-" + secrets.token_hex(2)
        self._serial = itertools.count(1)

    @classmethod
    def local(cls, found: binaries.Binaries, *, settings: controlplane.Settings | None = None) -> Cluster:
        """Start a control plane on 127.0.0.1 and the fake kubelet; stop both with :meth:`stop`."""
        plane = controlplane.ControlPlane(found, settings=settings).start()
        try:
            return cls(plane.kubeconfig, plane).start()
        except BaseException:
            plane.stop()
            raise

    @classmethod
    def attach(cls, kubeconfig: Path) -> Cluster:
        """Use an existing cluster; only the fake kubelet is started (and stopped) here."""
        return cls(kubeconfig).start()

    def start(self) -> Cluster:
        self.kubelet.start()
        return self

    def stop(self) -> None:
        """Stop the fake kubelet and, for a local cluster, every control-plane process."""
        try:
            self.kubelet.stop()
        finally:
            if self.plane is not None:
                self.plane.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------------------

    def api_client(self) -> client.ApiClient:
        """A fresh ``kubernetes`` ApiClient for this cluster (admin); not the global default one."""
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._api)

    # -- nodes -----------------------------------------------------------------------------

    def add_gpu_node(self, name: str | None = None, *, gpus: int = 8, wait: bool = True, **fields: Any) -> str:
        """Create a fake node served by this process; returns its name.

        ``fields`` are :class:`~webhook.localcluster.fakekubelet.NodeSpec` fields (``product``, ``replicas``,
        ``mig``, ``labels``, ``taints``, ``cpu``...). With ``wait`` (the default) it returns once
        the node is schedulable (the controller manager removed the ``not-ready`` taint).
        """
        kind = "gpu" if gpus > 0 else "cpu"
        spec = NodeSpec(name=name or f"{self._prefix}-{kind}-{next(self._serial)}", gpus=gpus, **fields)
        self.kubelet.add_node(spec, wait_schedulable=wait)
        return spec.name

    def add_cpu_node(self, name: str | None = None, **fields: Any) -> str:
        """A node without GPUs (no GPU labels, no ``nvidia.com/*`` resources)."""
        return self.add_gpu_node(name, gpus=0, **fields)

    def remove_node(self, name: str) -> None:
        self.kubelet.remove_node(name)

    # -- schedulers and diagnostics -----------------------------------------------------------------------

    def start_scheduler(self, scheduler_config: dict[str, Any] | str, **options: Any) -> processes.Process:
        """Another kube-scheduler from a KubeSchedulerConfiguration (local clusters only)."""
        if self.plane is None:
            raise RuntimeError(f"{KUBECONFIG_ENV} points at an existing cluster: its schedulers are its own")
        return self.plane.start_scheduler(scheduler_config, **options)

    def logs_tail(self, lines: int = 25) -> str:
        """The tail of every component's log and the fake kubelet's errors, for a failure message."""
        parts = [self.kubelet.describe()]
        if self.plane is not None:
            parts.append(self.plane.logs_tail(lines))
        return "\n".join(parts)


class Nodes:
    """Nodes for one test (the ``nodes`` fixture); removed, with their pods, when the test ends."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.names: list[str] = []

    def gpu(self, name: str | None = None, **fields: Any) -> str:
        self.names.append(self.cluster.add_gpu_node(name, **fields))
        return self.names[-1]

    def cpu(self, name: str | None = None, **fields: Any) -> str:
        self.names.append(self.cluster.add_cpu_node(name, **fields))
        return self.names[-1]

    def remove_all(self) -> None:
        for name in self.names:
            self.cluster.remove_node(name)
        self.names.clear()


def ensure_binaries(log: Callable[[str], None] = print) -> binaries.Binaries:
    """The cached binaries, building the missing ones first (minutes when cold)."""
    found = binaries.paths()
    if found is None:
        log("The local control plane's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) "
            f"are not built yet: building them from their Go modules into {binaries.cache_root()}, once. "
            "A cold build takes 20-40 minutes on 2 cores (Go >= 1.26 needed); later runs start in seconds.")
        found = binaries.build(log=log, components=binaries.CONTROL_PLANE)
    return found


def up(*, gpu_nodes: int, cpu_nodes: int) -> int:
    """Start a local cluster with fake nodes and keep it until SIGINT/SIGTERM (which, while still
    starting, stops what has started and ends with 130)."""
    found = ensure_binaries()
    try:
        with interrupts.raised(), Cluster.local(found) as cluster:
            for index in range(1, gpu_nodes + 1):
                cluster.add_gpu_node(f"gpu-{index}", wait=False)
            for index in range(1, cpu_nodes + 1):
                cluster.add_cpu_node(f"cpu-{index}", wait=False)
            for name in sorted(cluster.kubelet.node_names):
                cluster.kubelet.wait_schedulable(name)
            assert cluster.plane is not None
            plane = cluster.plane

            def announce() -> None:
                print(f"control plane up at {plane.server}; logs in {plane.logs}")
                print(f"{gpu_nodes} GPU node(s), {cpu_nodes} CPU node(s) ready. In another shell:\n")
                print(f"export KUBECONFIG={cluster.kubeconfig}\n")
                print("Ctrl-C stops everything.", flush=True)

            interrupts.announce_and_wait(announce)
            interrupts.stopping()
            print("stopping...", flush=True)
    except interrupts.Interrupted as stop:
        print(f"{stop} while starting: stopped everything", flush=True)
        return interrupts.EXIT_STATUS
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webhook.localcluster.cluster",
                                     description="A local Kubernetes control plane with fake GPU nodes.")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start, print `export KUBECONFIG=...`, run until Ctrl-C")
    start.add_argument("--gpu-nodes", type=int, default=8, help="8-GPU H100 nodes to create (default 8)")
    start.add_argument("--cpu-nodes", type=int, default=0, help="nodes without GPUs (default 0)")
    args = parser.parse_args(argv)
    return up(gpu_nodes=args.gpu_nodes, cpu_nodes=args.cpu_nodes)


if __name__ == "__main__":
    sys.exit(main())
