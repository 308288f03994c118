"""The cluster's DeviceClasses, kept current in the webhook process (the edge; with API access).

Admission counts a pod's DRA extended-resource names as GPU asks by the classes that serve them
(``kube.units.GpuNames``): ``deviceclass.resource.kubernetes.io/<class>`` for every class, and a
class's ``spec.extendedResourceName``. Those names come and go with DeviceClasses, so each worker
lists them and then watches: any change (or the watch's end) lists them again, which for the
handful of classes a cluster has is simpler than applying events and can never drift. A failure
keeps the last classes read and is retried with backoff.

Fail closed either way: until the first list, and when the API server does not serve
``resource.k8s.io/v1``, the NVIDIA chart's two classes are assumed, and a
``deviceclass.resource.kubernetes.io/<class>`` name of a class not known is judged as a GPU ask
(``kube.units.GpuNames.of``), never let through. Only a class's own ``extendedResourceName`` needs the
list: a cluster admin creates such classes, and the webhook counts the name within a watch event.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient, logs
from webhook.kube import units

_log = logging.getLogger(logs.SERVER_LOGGER)

WATCH_SECONDS = 240
"""How long one watch lasts before it is opened again (the API server caps it anyway)."""
BACKOFF_SECONDS = (0.5, 30.0)
"""First and longest wait after a failed list or watch."""
ABSENT_RECHECK_SECONDS = 60.0
"""Without ``resource.k8s.io/v1`` (404), how often to ask again (an upgraded cluster starts serving it)."""


class DeviceClassWatch:
    """``current()`` is the classes last read; a daemon thread keeps them current."""

    def __init__(self, api: Any) -> None:
        self._api: Any = client.ResourceV1Api(api)  # raw answers (_preload_content=False), not models
        self._current = units.ASSUMED
        self.synced = threading.Event()
        """Set once a list answered (or the API said it serves no DeviceClasses)."""
        self.lists = 0
        self._stop = threading.Event()

    @classmethod
    def start(cls, api: Any) -> DeviceClassWatch:
        watch = cls(api)
        threading.Thread(target=watch.run, name="deviceclasses", daemon=True).start()
        return watch

    def current(self) -> units.DeviceClasses:
        return self._current

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """List, watch until something changes, list again; never raises."""
        delay = BACKOFF_SECONDS[0]
        while not self._stop.is_set():
            try:
                version = self.list_once()
                if version is None:
                    self._stop.wait(ABSENT_RECHECK_SECONDS)
                    continue
                self._watch(version)
                delay = BACKOFF_SECONDS[0]
            except Exception as err:  # the API down, a 403, a class we cannot read: keep the last ones
                logs.log_event(_log, "device classes not read", logging.WARNING, error=kubeclient.failure(err),
                               retry_in_s=delay)
                self._stop.wait(delay)
                delay = min(delay * 2, BACKOFF_SECONDS[1])

    def list_once(self) -> str | None:
        """Read every DeviceClass; the list's resourceVersion, or None when the API serves none (404)."""
        try:
            response = self._api.list_device_class(_preload_content=False, _request_timeout=(2, 10))
        except ApiException as err:
            if err.status == 404:
                self._current = units.ASSUMED
                self.synced.set()
                return None
            raise
        page = orjson.loads(response.data)
        found = units.DeviceClasses.from_documents(page.get("items") or [])
        if found != self._current:
            logs.log_event(_log, "device classes read", classes=[c.name for c in found.classes],
                           extended=[c.extended_resource_name for c in found.classes if c.extended_resource_name])
        self._current = found
        self.lists += 1
        self.synced.set()
        return str((page.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> None:
        """Block until a DeviceClass changes (or the watch ends): the caller lists again."""
        response = self._api.list_device_class(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                               timeout_seconds=WATCH_SECONDS, _preload_content=False,
                                               _request_timeout=(2, WATCH_SECONDS + 30))
        buffer = b""
        try:
            for chunk in response.stream(amt=None, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                if any(line.strip() and orjson.loads(line).get("type") != "BOOKMARK" for line in lines):
                    return
                if self._stop.is_set():
                    return
        finally:
            response.close()
