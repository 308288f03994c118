"""Accounting and idle reclaim plugged into one balancer replica (``usage.enabled``).

The controller builds one :class:`UsageWiring` and starts its threads with its own: the usage pod
informer on every replica (a standby's view is warm and exported too: the rules take the ``max``
over replicas), the reclaimer's loop on every replica, which looks only while its replica leads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from webhook.balancer.idlereclaim import IdleMetrics, IdleReclaimer
from webhook.balancer.labeller import Labeller
from webhook.balancer.podactions import PodActions
from webhook.balancer.prometheus import PrometheusClient
from webhook.balancer.settings import BalancerSettings
from webhook.balancer.usagesource import UsagePods, UsageSource
from webhook.policy.store import PolicyStore


class UsageWiring:
    """The usage pod informer, the accounting collector and the idle reclaimer of one replica."""

    def __init__(self, settings: BalancerSettings, *, api: Callable[[], client.ApiClient],
                 informer_args: dict[str, Any], field_selector: str, labeller: Labeller, registry: CollectorRegistry,
                 prometheus: PrometheusClient | None, leading: Callable[[], bool], ready: Callable[[], bool],
                 now: Callable[[], float] = time.time) -> None:
        usage = settings.usage
        self.pods = UsagePods(client.CoreV1Api(api()).list_pod_for_all_namespaces, informer_args=informer_args,
                              field_selector=field_selector)
        self.source = UsageSource(labeller, self.pods, ready=ready)
        registry.register(self.source)
        self.policies = PolicyStore(Path(usage.policies), allow_empty=True) if usage.policies else None
        self.reclaimer = IdleReclaimer(
            self.source, PodActions(api(), identity=settings.lease.identity, clock=now), usage,
            prometheus=prometheus, policies=self.policies, leading=leading,
            ready=lambda: ready() and self.pods.synced, dry_run=settings.dry_run, metrics=IdleMetrics(registry),
            now=now)

    def threads(self, stop: threading.Event) -> list[threading.Thread]:
        return [threading.Thread(target=self.pods.informer.run, args=(stop,), name="informer-usage-pods", daemon=True),
                threading.Thread(target=self.reclaimer.run, args=(stop,), name="idle-reclaim", daemon=True)]

    def close(self) -> None:
        self.pods.informer.close()
