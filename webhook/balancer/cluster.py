"""The balancer's kubernetes-client edge: list-then-watch informers and the node patch.

Responses are read as raw JSON (``_preload_content=False``), decoded with orjson (3 to 5 times
faster than ``json`` on 10 to 50 KB objects) and reduced at once to the small records of
``state``: building the client's model objects for 150,000 pods would cost minutes and
gigabytes, and their ``to_dict()`` snake_case keys are not Kubernetes JSON anyway.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import kubeclient
from webhook.balancer.backoff import Backoff

log = logging.getLogger("gpugate.balancer.cluster")

Obj = dict[str, Any]
V = TypeVar("V")


INITIAL_EVENTS_END = "k8s.io/initial-events-end"
READ_SIZE = 1 << 20
EVENT_PREFIXES = {b'{"type":"ADDED"': "ADDED", b'{"type":"MODIFIED"': "MODIFIED", b'{"type":"DELETED"': "DELETED"}


class WatchExpired(Exception):
    """The apiserver cannot serve our resourceVersion (410 Gone, or 504 too large): relist."""


class StreamingUnsupported(Exception):
    """The apiserver refused, or ignored, ``sendInitialEvents``: list in pages instead."""


def needs_relist(code: int, status: Obj) -> bool:
    """True for a watch answer that a retry from the same resourceVersion can never cure.

    410 Gone: history from that revision is compacted away. 504 "Too large resource version":
    the revision is ahead of what this API server has (an etcd restored from a backup, or a
    lagging apiserver); client-go's reflector relists on both (``isExpiredError``,
    ``isTooLargeResourceVersionError``), whether they come as the HTTP status of the watch
    request or as an ERROR event inside the stream.
    """
    if code == 410:
        return True
    if code != 504:
        return False
    causes = (status.get("details") or {}).get("causes") or ()
    return any(c.get("reason") == "ResourceVersionTooLarge" for c in causes if isinstance(c, dict)) or \
        "too large resource version" in str(status.get("message", "")).lower()


status_of = kubeclient.status_of
"""The Status object an ApiException carries (empty when the body is not one): kubeclient's one reading."""


def retry_after(err: BaseException) -> float | None:
    """Seconds a 429 (or 503) asks us to wait, from ``Retry-After`` or ``details.retryAfterSeconds``."""
    if not isinstance(err, ApiException) or err.status not in (429, 503):
        return None
    header = (err.headers or {}).get("Retry-After") if err.headers is not None else None
    try:
        if header is not None:
            return max(float(header), 0.0)
    except ValueError:
        pass
    seconds = (status_of(err).get("details") or {}).get("retryAfterSeconds")
    return float(seconds) if isinstance(seconds, int | float) else None


def iter_lines(response: Any) -> Iterator[bytes]:
    """Complete newline-terminated lines of a chunked watch response, as they arrive.

    Copies each byte as few times as it can (a streamed list of 150,000 pods is over a gigabyte):
    no join unless a line spans pieces, no ``strip()`` copy to skip blank lines. Reads at most
    ``READ_SIZE`` at a time, however large the server's HTTP chunks: a burst of 20,000 events sent
    as one chunk would otherwise sit in memory twice (the chunk and its lines), 360 MB for 9 KB pods.
    """
    rest = b""
    for chunk in response.stream(READ_SIZE, decode_content=False):
        if not chunk:
            continue
        if rest:
            chunk = rest + chunk
        lines = chunk.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line and not line.isspace():
                yield line
    if rest and not rest.isspace():
        yield rest


class Informer(Generic[V]):
    """List then watch one resource, keeping a reduced copy through two callbacks.

    ``reduce`` turns an object into ``(key, value)``; ``on_replace`` receives the whole map after
    each (re)list, ``on_event`` each change (``value`` None for a deletion). ``prefilter``, given
    an event's raw line, may say it cannot matter: it is then counted (``on_skip``) but never
    decoded, which is what makes 150,000 pods of 4 to 15 KB cheap when a few thousand hold GPUs.

    The list is a streaming list where the server has it (a watch with ``sendInitialEvents``,
    one object per line, so ``prefilter`` applies and no page is held), else pages of
    ``page_size``. After a 410 or a too-large resourceVersion (in the stream or as the watch's
    HTTP status) the informer relists; after any other failure it waits a jittered backoff (or
    the ``Retry-After`` of a 429) and resumes the watch from the last resourceVersion it saw.
    Bookmarks keep that resourceVersion fresh even for events ``prefilter`` skipped.
    """

    def __init__(self, *, name: str, list_call: Callable[..., Any], reduce: Callable[[Obj], tuple[str, V]],
                 on_replace: Callable[[dict[str, V]], None], on_event: Callable[[str, str, V | None], None],
                 page_size: int, watch_timeout: int, backoff: Backoff,
                 on_error: Callable[[str, BaseException], None], on_relist: Callable[[str], None],
                 prefilter: Callable[[bytes], bool] | None = None, on_skip: Callable[[], None] | None = None,
                 field_selector: str | None = None, stream_lists: bool = True,
                 label_selector: str | None = None) -> None:
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
        self._prefilter = prefilter
        self._on_skip = on_skip or (lambda: None)
        self._selector: dict[str, Any] = {"field_selector": field_selector} if field_selector else {}
        if label_selector:
            self._selector["label_selector"] = label_selector
        self.streaming = stream_lists
        """True while streaming lists are tried; a server that refuses one turns it off for good."""
        self.synced = threading.Event()
        self.events = 0
        self.skipped = 0
        self._response: Any = None
        self._stop = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; never raises (errors are reported and retried)."""
        self._stop = stop
        rv: str | None = None
        while not stop.is_set():
            try:
                if rv is None and self.streaming:
                    rv = self._watch(None)
                else:
                    if rv is None:
                        rv = self._relist()
                    rv = self._watch(rv)
                self._backoff.reset()
            except WatchExpired as err:
                log.info("watch expired, relisting", extra={"fields": {"resource": self.name, "reason": str(err)}})
                self._on_relist(self.name)
                rv = None
            except StreamingUnsupported as err:
                log.info("no streaming list here, listing in pages",
                         extra={"fields": {"resource": self.name, "reason": str(err)}})
                self.streaming = False
                rv = None
            except Exception as err:
                if stop.is_set():
                    break
                if isinstance(err, ApiException) and needs_relist(err.status or 0, status_of(err)):
                    log.info("watch refused its resourceVersion, relisting",
                             extra={"fields": {"resource": self.name, "error": kubeclient.failure(err)}})
                    self._on_relist(self.name)
                    rv = None
                    continue
                if rv is None and self.streaming and isinstance(err, ApiException) and err.status in (400, 422):
                    log.info("no streaming list here, listing in pages",
                             extra={"fields": {"resource": self.name, "error": kubeclient.failure(err)}})
                    self.streaming = False
                    continue
                delay = max(self._backoff.next(), retry_after(err) or 0.0)
                self._on_error(f"{self.name}.{'list' if rv is None else 'watch'}", err)
                log.warning("API call failed, backing off",
                            extra={"fields": {"resource": self.name, "error": kubeclient.failure(err),
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
                                      "_request_timeout": (10, 60), **self._selector}
            if token:
                kwargs["_continue"] = token
            response = self._list_call(**kwargs)
            page = orjson.loads(response.data)
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

    def _watch(self, rv: str | None) -> str | None:
        """Watch from ``rv``; ``rv`` None is a streaming list first. Returns where to resume (None: list)."""
        kwargs: dict[str, Any] = {"watch": True, "allow_watch_bookmarks": True,
                                  "timeout_seconds": self._watch_timeout, "_preload_content": False,
                                  "_request_timeout": (10, self._watch_timeout + 30), **self._selector}
        initial: dict[str, V] | None = None
        if rv is None:
            # A consistent read (no resourceVersion) streamed as ADDED events, closed by a
            # bookmark annotated k8s.io/initial-events-end; the watch then simply goes on.
            kwargs.update(send_initial_events=True, resource_version_match="NotOlderThan")
            initial = {}
        else:
            kwargs["resource_version"] = rv
        response = self._list_call(**kwargs)
        self._response = response
        complete = False
        try:
            for line in iter_lines(response):
                if self._skipped(line, listing=initial is not None):
                    continue
                initial, rv = self._handle(orjson.loads(line), initial, rv)
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
        return None if initial is not None else rv

    def _skipped(self, line: bytes, *, listing: bool) -> bool:
        """True for an event ``prefilter`` says cannot matter (counted, unless among the initial events)."""
        quick = EVENT_PREFIXES.get(line[:line.find(b'"', 9) + 1]) if line.startswith(b'{"type":"') else None
        if quick is None or self._prefilter is None or self._prefilter(line):
            return False
        if not listing:
            self.events += 1
            self.skipped += 1
            self._on_skip()
        return True

    def _handle(self, event: Obj, initial: dict[str, V] | None,
                rv: str | None) -> tuple[dict[str, V] | None, str | None]:
        """One decoded event; returns the initial events still being gathered (None once the list
        ended) and the resourceVersion to resume from."""
        etype = event.get("type")
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if etype == "ERROR":
            code = int(obj.get("code") or 500)
            if needs_relist(code, obj):
                raise WatchExpired(obj.get("message", f"{code}"))
            raise ApiException(status=code, reason=obj.get("message", "watch error"))
        if etype == "BOOKMARK":
            if initial is not None:
                if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) != "true":
                    raise StreamingUnsupported("a bookmark before the end of the initial events")
                self._on_replace(initial)
                self.synced.set()
                initial = None
        elif initial is not None:
            if etype != "ADDED":
                raise StreamingUnsupported(f"a {etype} event among the initial events")
            key, value = self._reduce(obj)
            initial[key] = value
        elif etype in ("ADDED", "MODIFIED", "DELETED"):
            key, value = self._reduce(obj)
            self._on_event(etype, key, None if etype == "DELETED" else value)
            self.events += 1
        new_rv = meta.get("resourceVersion")
        return initial, str(new_rv) if new_rv else rv


class NodeWriter:
    """Patches nodes with a strategic merge patch, the body the kubernetes client sends for a dict.

    One field manager name for every replica and label (a name per replica would grow every
    node's managedFields, which kube-apiserver decodes and re-encodes on each write), no dry run,
    no ``fieldValidation`` (the default, Warn), no resourceVersion precondition unless the patch
    carries the taint list (``placement.marks.node_patch``). Measured against the real API server
    (``benchmarks/balancer_cluster.py --patch-cost``, benchmarks/patchcost.py): a raw client
    sending the same bytes costs kube-apiserver the same, and neither a JSON merge patch,
    ``fieldValidation=Ignore`` nor a metadata-only answer is cheaper. What a label patch costs
    it is the node's size and managedFields: handlers/patch.go runs every non-apply write through
    the field manager, whose structured-merge step converts the stored and the patched node to
    typed values and compares them (apimachinery managedfields/internal/structuredmerge.go), and
    only a node with no managedFields at all skips it (internal/skipnonapplied.go).
    """

    FIELD_MANAGER = "gpugate-balancer"
    CONTENT_TYPE = "application/strategic-merge-patch+json"

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    def patch(self, name: str, body: Obj) -> None:
        """Apply ``body``; raises ApiException for any answer but 2xx.

        Through the client's public ``param_serialize``/``call_api`` (its auth, token refresh, TLS and
        connection pool) without the generated method's per-call argument validation and model
        plumbing: a fifth of a patch's CPU, which is most of what a burst costs. The stored node that
        comes back (10 to 50 KB) is read off the wire but not decoded: the watch delivers it anyway.
        """
        method, url, headers, data, post = self._api.param_serialize(
            method="PATCH", resource_path="/api/v1/nodes/{name}", path_params={"name": name},
            query_params=[("fieldManager", self.FIELD_MANAGER)],
            header_params={"Content-Type": self.CONTENT_TYPE, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        response = self._api.call_api(method, url, header_params=headers, body=data, post_params=post,
                                      _request_timeout=(10, 30))
        response.read()  # drain the body, so the connection goes back to the pool
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
