"""The health loop's series on the balancer's registry (``/metrics``), named ``gpugate_balancer_health_*``.

Kept apart from ``metrics.Metrics``: they exist only when ``health.enabled``, and a quarantined
GPU is one series naming its node, GPU, devices, signal and rule, cleared when it returns.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from webhook.balancer.quarantine import Action
from webhook.balancer.quarantineledger import Ledger
from webhook.kube.allocations import DeviceKey


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.quarantined = Gauge(
            "gpugate_balancer_health_quarantined_gpus",
            "1 per GPU out of service: its node, NVML UUID, DRA devices (empty under the device plugin), the "
            "signal and the rule that quarantined it, and the effect its taint carries now.",
            ["node", "gpu", "devices", "signal", "rule", "effect"], registry=registry)
        self.actions = Counter(
            "gpugate_balancer_health_actions",
            "What the health loop did (action=quarantined|relapsed|escalated|validating|validation-failed|blocked|"
            "returned), per signal and rule; mode=dry_run when the balancer runs with --dry-run.",
            ["action", "signal", "rule", "mode"], registry=registry)
        self.signals_up = Gauge(
            "gpugate_balancer_health_signals_up",
            "1 when every DCGM health query of the last pass answered, 0 when one failed (nothing returns then), "
            "-1 when no Prometheus is configured.", registry=registry)
        self.last_pass = Gauge("gpugate_balancer_health_last_pass_timestamp_seconds",
                               "Unix time of the last health pass this replica ran as the writer.", registry=registry)
        self.writes = Counter("gpugate_balancer_health_writes",
                              "API writes of the health loop, by object and result (ok|conflict|error).",
                              ["object", "result"], registry=registry)
        self.signals_up.set(-1)

    def record(self, actions: tuple[Action, ...], *, dry_run: bool) -> None:
        for action in actions:
            q = action.quarantine
            self.actions.labels(action.kind, q.signal if q else "", q.rule if q else "",
                                "dry_run" if dry_run else "write").inc()

    def show(self, ledger: Ledger, devices: Mapping[tuple[str, str], tuple[DeviceKey, ...]]) -> None:
        """One series per quarantined GPU, the returned ones gone."""
        self.quarantined.clear()
        for q in ledger.quarantines:
            names = ",".join(k.device for k in devices.get(q.key, ()))
            self.quarantined.labels(q.node, q.gpu, names, q.signal, q.rule, q.effect).set(1)
