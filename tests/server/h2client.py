"""A minimal HTTP/2 client over TLS with ALPN (the ``h2`` package gunicorn's ``http2`` extra brings):
what the API server's Go client does, one connection, requests as streams."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import h2.config
import h2.connection
import h2.events


class H2Client:
    """One TLS connection that negotiated ``h2``; ``post`` sends a stream and waits for its answer."""

    def __init__(self, port: int, ca: Path, *, source: str = "127.0.0.1", timeout: float = 10.0) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        context.check_hostname = False
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.protocol = self.sock.selected_alpn_protocol()
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", "POST"), (":path", path), (":scheme", "https"),
                                        (":authority", "localhost"), ("content-type", "application/json"),
                                        ("content-length", str(len(body)))])
        for start in range(0, len(body), 16_384):
            self._send_data(stream, body[start:start + 16_384])
        self.conn.end_stream(stream)
        self.sock.sendall(self.conn.data_to_send())
        status, parts = 0, []
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the HTTP/2 connection")
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    parts.append(event.data)
                    self.conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    self.sock.sendall(self.conn.data_to_send())
                    return status, b"".join(parts)
            self.sock.sendall(self.conn.data_to_send())

    def _send_data(self, stream: int, chunk: bytes) -> None:
        while self.conn.local_flow_control_window(stream) < len(chunk):
            for _event in self.conn.receive_data(self.sock.recv(65536)):
                pass
            self.sock.sendall(self.conn.data_to_send())
        self.conn.send_data(stream, chunk)
        self.sock.sendall(self.conn.data_to_send())

    def close(self) -> None:
        try:
            self.conn.close_connection()
            self.sock.sendall(self.conn.data_to_send())
        except OSError:
            pass
        self.sock.close()
