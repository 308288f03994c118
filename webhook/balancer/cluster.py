"""The balancer's kubernetes-client edge: list-then-watch informers and the node patch.

Responses are read as raw JSON (``_preload_content=False``) and reduced at once to the small
records of ``state``: building the client's model objects for 150,000 pods would cost minutes
and gigabytes, and their ``to_dict()`` snake_case keys are not Kubernetes JSON anyway.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient
from webhook.balancer.backoff import Backoff

log = logging.getLogger("gpugate.balancer.cluster")

Obj = dict[str, Any]
V = TypeVar("V")


class WatchExpired(Exception):
    """The apiserver no longer has history from our resourceVersion (410 Gone): relist."""


def iter_lines(response: Any) -> Iterator[bytes]:
    """Complete newline-terminated lines of a chunked watch response, as they arrive."""
    rest = b""
    for chunk in response.stream(None, decode_content=False):
        if not chunk:
            continue
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.strip():
                yield line
    if rest.strip():
        yield rest


class Informer(Generic[V]):
    """List then watch one resource, keeping a reduced copy through two callbacks.

    ``reduce`` turns an object into ``(key, value)``; ``on_replace`` receives the whole map after
    each (re)list, ``on_event`` each change (``value`` None for a deletion). After a 410 the
    informer relists; after any other failure it waits a jittered backoff and resumes the
    watch from the last resourceVersion it saw (a relist follows if that is too old too).
    """

    def __init__(self, *, name: str, list_call: Callable[..., Any], reduce: Callable[[Obj], tuple[str, V]],
                 on_replace: Callable[[dict[str, V]], None], on_event: Callable[[str, str, V | None], None],
                 page_size: int, watch_timeout: int, backoff: Backoff,
                 on_error: Callable[[str, BaseException], None], on_relist: Callable[[str], None]) -> None:
        self.name = name
        self._list_call = list_call
        self._reduce = reduce
        self._on_replace = on_replace
        self._on_event = on_event
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._on_error = on_error
        self._on_relist = on_relist
        self.synced = threading.Event()
        self.events = 0
        self._response: Any = None
        self._stop = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; never raises (errors are reported and retried)."""
        self._stop = stop
        rv: str | None = None
        while not stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                rv = self._watch(rv)
                self._backoff.reset()
            except WatchExpired as err:
                log.info("watch expired, relisting", extra={"fields": {"resource": self.name, "reason": str(err)}})
                self._on_relist(self.name)
                rv = None
            except Exception as err:
                if stop.is_set():
                    break
                delay = self._backoff.next()
                self._on_error(f"{self.name}.{'list' if rv is None else 'watch'}", err)
                log.warning("API call failed, backing off",
                            extra={"fields": {"resource": self.name, "error": _short(err),
                                              "retry_in_s": round(delay, 2)}})
                stop.wait(delay)

    def close(self) -> None:
        """Interrupt a blocked watch read (used on shutdown)."""
        response = self._response
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _relist(self) -> str:
        items: dict[str, V] = {}
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size, "_preload_content": False,
                                      "_request_timeout": (10, 60)}
            if token:
                kwargs["_continue"] = token
            response = self._list_call(**kwargs)
            page = json.loads(response.data)
            for obj in page.get("items") or ():
                key, value = self._reduce(obj)
                items[key] = value
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        self._on_replace(items)
        self.synced.set()
        return str(meta.get("resourceVersion") or "")

    def _watch(self, rv: str) -> str:
        response = self._list_call(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                   timeout_seconds=self._watch_timeout, _preload_content=False,
                                   _request_timeout=(10, self._watch_timeout + 30))
        self._response = response
        complete = False
        try:
            for line in iter_lines(response):
                event = json.loads(line)
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(obj.get("message", "410 Gone"))
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", "watch error"))
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype in ("ADDED", "MODIFIED", "DELETED"):
                    key, value = self._reduce(obj)
                    self._on_event(etype, key, None if etype == "DELETED" else value)
                    self.events += 1
                if new_rv:
                    rv = str(new_rv)
                if self._stop.is_set():
                    break
            else:
                complete = True
        finally:
            self._response = None
            # Only a stream read to its end may go back to the pool; anything else is closed,
            # or the next request on that connection would read the rest of this one.
            if complete:
                response.release_conn()
            else:
                response.close()
        return rv


def _short(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"[:300]


class NodeWriter:
    """Patches nodes with the body the kubernetes client sends for a dict: a strategic merge patch."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def patch(self, name: str, body: Obj) -> Obj:
        """Apply ``body``; return the node as stored afterwards (raw JSON). Raises ApiException."""
        response = self._core.patch_node(name, body, _preload_content=False, _request_timeout=(10, 30))
        return kubeclient.raw_json(response)
