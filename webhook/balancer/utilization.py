"""DCGM utilization for the tiers: a loop polling Prometheus into the ``Labeller``.

Utilization older than ``stale_after`` is dropped and the tiers fall back to allocation alone
(``gpugate_balancer_allocation_only`` 1); Prometheus going away and coming back is logged once each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from webhook.balancer.labeller import Labeller
from webhook.balancer.metrics import Metrics
from webhook.balancer.prometheus import PrometheusClient, PrometheusError
from webhook.balancer.settings import PrometheusSettings

log = logging.getLogger("gpugate.balancer")


def poll(client: PrometheusClient, settings: PrometheusSettings, labeller: Labeller, metrics: Metrics, *,
         clock: Callable[[], float], stop: threading.Event) -> None:
    """Query every ``settings.interval`` until ``stop``; never raises for Prometheus' failures."""
    reported_down = False
    while not stop.is_set():
        try:
            result = client.utilization()
        except PrometheusError as err:
            metrics.prometheus_up.set(0)
            if not reported_down:
                log.warning("Prometheus unreachable: tiers fall back to allocation only once the last "
                            "sample is stale", extra={"fields": {"error": str(err),
                                                                 "stale_after_s": settings.stale_after}})
                reported_down = True
            result = None
        else:
            metrics.prometheus_up.set(1)
            metrics.prometheus_succeeded()
            if reported_down and result is not None:
                log.info("Prometheus reachable again", extra={"fields": {"hosts": len(result.by_host)}})
            reported_down = False
        usable = labeller.utilization(None if result is None else result.by_host, clock())
        metrics.allocation_only.set(0 if usable else 1)
        stop.wait(settings.interval)
