"""A stand-in for Prometheus' instant-query API on 127.0.0.1, for the balancer's loops that read it.

Only ``/api/v1/query`` and its JSON answer: the loops' own parsing is what the tests judge (the
real Prometheus stands in tests/promserver.py, for the queries themselves). A subclass says what a
query answers (``vector``); every query asked is kept in ``queries``, so a test can show that a
standby or a dry run asked nothing.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakePrometheus:
    """Serves ``vector(query)`` as a successful instant vector; ``down`` answers 503 instead."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.down = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
                fake.queries.append(query)
                if fake.down:
                    body, code = {"status": "error", "error": "storage is down"}, 503
                else:
                    body = {"status": "success", "data": {"resultType": "vector", "result": fake.vector(query)}}
                    code = 200
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def vector(self, query: str) -> list[dict[str, Any]]:
        """The samples ``query`` answers; none unless a subclass says otherwise."""
        return []

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
