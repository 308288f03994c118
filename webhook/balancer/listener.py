"""What the balancer's two HTTP servers share (``health``, ``extenderserver``): a threading server
on a daemon thread of its own, its port, start and stop, and the one way an answer is written."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class Listener:
    """Serves ``server`` on a thread named ``thread_name`` once started."""

    def __init__(self, server: ThreadingHTTPServer, *, thread_name: str) -> None:
        self._server = server
        self._thread_name = thread_name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def send(handler: BaseHTTPRequestHandler, code: int, content_type: str, body: bytes) -> None:
    """One whole answer: status, type, length, body."""
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
