"""The scheduler extender's consumer of the watches: ``placementfeed.Feed`` under a lock of its own,
the answers kube-scheduler asks for, and the HTTPS listener that serves them.

Every replica answers from its caches (leader or not). The listener's module is imported only
when it starts: it brings the TLS machinery, whose imports cost a second on a busy node.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from webhook.balancer import placementfeed
from webhook.balancer.metrics import Metrics
from webhook.balancer.settings import ExtenderServing, parse_bind
from webhook.kube.gpunode import NodeInfo
from webhook.kube.nodedevices import NodeDevices
from webhook.placement.devices import DevicePolicy
from webhook.placement.extender import ExtenderSettings, ExtenderState
from webhook.placement.shapes import ShapeMix, mix_entries

log = logging.getLogger("gpugate.balancer")

EXTENDER_RETRY_SECONDS = 5.0
"""Wait between attempts to start the extender's listener (certificate not mounted yet, port taken)."""


class ExtenderCache:
    """The extender's view of the cluster; every method is thread-safe (one lock, never held with another)."""

    def __init__(self, settings: ExtenderServing, metrics: Metrics, *, mix: ShapeMix | None,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.feed = placementfeed.Feed(ExtenderState(ExtenderSettings(
            device_policy=cast(DevicePolicy, settings.device_policy), assume_ttl=settings.assume_ttl, mix=mix)))
        self.server: Any = None
        """The ``extenderserver.ExtenderServer`` once it listens."""
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        metrics.extender_serving.set(0)

    # ---- the watches' changes (informer threads) -------------------------------------------------
    def replace_nodes(self, infos: Mapping[str, NodeInfo]) -> None:
        with self._lock:
            self.feed.replace_nodes(infos)

    def node(self, name: str, info: NodeInfo | None) -> None:
        with self._lock:
            self.feed.node(name, info)

    def replace_pods(self, records: Mapping[str, placementfeed.FeedPod]) -> None:
        with self._lock:
            self.feed.replace_pods(records)

    def pod(self, key: str, record: placementfeed.FeedPod | None) -> None:
        with self._lock:
            self.feed.pod(key, record)

    def dra(self, devices: Mapping[str, NodeDevices | None]) -> None:
        with self._lock:
            for name, found in devices.items():
                self.feed.dra(name, found)

    # ---- answers -------------------------------------------------------------------------------
    def mix(self) -> list[dict[str, Any]]:
        """The pod-shape mix the extender measures with (configured or learned), in the YAML form
        ``--extender-mix`` reads."""
        with self._lock:
            mix = self.feed.state.fragmenter.mix
        return mix_entries(mix)

    def type_pressure(self) -> dict[str, float]:
        with self._lock:
            return self.feed.state.type_pressure()

    def answer(self, args: Any) -> list[Any]:
        """kube-scheduler's prioritize: a HostPriorityList from the caches (every replica answers)."""
        with self._lock:
            try:
                return cast(list[Any], self.feed.prioritize(args, now=self._clock()))
            except placementfeed.ArgsError as err:
                from webhook.balancer.extenderserver import BadRequest
                raise BadRequest(str(err)) from err
            finally:
                self._metrics.extender_assumed.set(self.feed.state.assumed)

    # ---- the listener --------------------------------------------------------------------------
    def serve(self, stop: threading.Event, ready: Callable[[], bool]) -> None:
        """Start the HTTPS listener, retrying until the certificate is there (the Secret may come later).

        The labels and the inventory go on meanwhile; ``gpugate_balancer_extender_serving`` says 0.
        """
        from webhook.balancer.extenderserver import ExtenderServer

        e = self.settings
        host, port = parse_bind(e.bind, what="extender.bind")
        reported = ""
        while not stop.is_set():
            try:
                self.server = ExtenderServer(host, port, path=e.path, certfile=Path(e.cert_file),
                                             keyfile=Path(e.key_file), answer=self.answer,
                                             ready=ready, metrics=self._metrics).start()
            except (OSError, ssl.SSLError) as err:
                problem = f"{type(err).__name__}: {err}"
                if problem != reported:
                    log.error("scheduler extender not served; retrying", extra={"fields": {
                        "bind": e.bind, "cert_file": e.cert_file, "error": problem}})
                    reported = problem
                stop.wait(EXTENDER_RETRY_SECONDS)
                continue
            self._metrics.extender_serving.set(1)
            log.info("scheduler extender serving", extra={"fields": {
                "bind": e.bind, "port": self.server.port, "path": f"{e.path.rstrip('/')}/prioritize",
                "pod_mix": e.mix_file or "learned from the last pods created"}})
            return

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self._metrics.extender_serving.set(0)
