"""How a worker's loop stops (SIGTERM, a HUP's retirement, the end of ``--max-requests``).

The way a client can live with: for ``drain_seconds`` the worker keeps accepting (when it is the last
one) and answering, each answer with ``Connection: close`` and ``/readyz`` at 503, so clients close
between requests, never in the middle of one; HTTP/2 connections get GOAWAY from gunicorn after their
next stream, and the rest are woken once the drain ends; then idle connections close after a moment
of quiet, requests in flight finish, and the worker exits within gunicorn's graceful timeout.
"""

from __future__ import annotations

import time
from typing import Any

from webhook.server import workershared
from webhook.server.connection import Phase

RequestLoop = Any
"""``requestloop.RequestLoop`` (not imported: it imports this module)."""

IDLE_LINGER_SECONDS = 0.5
"""An idle connection is closed once it has been quiet this long: a client that was about to send on
it has done so (and is answered with Connection: close)."""


def stop(loop: RequestLoop) -> None:
    """Drain ``loop``'s worker, then close what is left."""
    started = time.monotonic()
    # siblings now see this worker draining and take the new clients
    workershared.publish(loop.slot, loop.nr_conns, draining=not loop.alive)
    loop._drain_h2()
    drain_end = started + loop.settings.drain_seconds
    while time.monotonic() < drain_end and loop.is_parent_alive():
        loop.notify()
        loop.set_accept_enabled(loop._may_accept())
        loop._dispatch(min(loop._timeout(), 0.05, max(drain_end - time.monotonic(), 0.0)))
        loop._expire()
    loop.set_accept_enabled(False)
    if not workershared.siblings(loop.slot):
        _accept_backlog(loop)  # the last to stop: take what the kernel queued, then close
    for listener in loop.sockets:
        try:
            listener.close()
        except OSError:
            pass
    loop._stop_h2()
    give_up = started + loop.cfg.graceful_timeout - 1.0
    while loop.conns and time.monotonic() < give_up:
        loop.notify()
        now = time.monotonic()
        for conn in [c for c in loop.conns if c.phase in (Phase.IDLE, Phase.HANDSHAKE)
                     and now - c.last_activity >= IDLE_LINGER_SECONDS]:
            loop._close_gracefully(conn)
        loop._dispatch(min(loop._timeout(), 0.05))
        loop._expire()
    for conn in list(loop.conns):
        loop._close(conn)
    loop.tpool.shutdown(wait=False)
    loop.poller.close()
    loop.method_queue.close()


def _accept_backlog(loop: RequestLoop) -> None:
    for listener in loop.sockets:
        for _ in range(loop.worker_connections):
            before = loop.nr_conns
            try:
                listener.setblocking(False)
                loop.accept(listener)
            except OSError:
                break
            if loop.nr_conns == before:
                break
