"""The worker's lean path for the API server's calls: which requests take it, and that a
real server answers them exactly as its full gunicorn + Flask path does."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time

import pytest

from tests.admission.harness import SERVICE_HOST, Server, example_pod, review_of
from tests.admission.test_worker import read_response, tls_socket
from webhook.admission import framing, leanpath

PATHS = ("/mutate", "/validate")


def framed(request: bytes) -> leanpath.LeanRequest | None:
    found = framing.frame(request, max_header_bytes=65536, max_body_bytes=3 << 20)
    assert found.state is framing.State.COMPLETE
    return leanpath.lean_request(request[:found.end], found.body_start, PATHS)


def api_server_call(body: bytes, *, path: bytes = b"/mutate?timeout=10s", extra: bytes = b"") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: gpugate-webhook.gpugate-system.svc:443\r\n"
            b"User-Agent: kube-apiserver-admission\r\nContent-Length: %d\r\nAccept: application/json, */*\r\n"
            b"Content-Type: application/json\r\n%sAccept-Encoding: gzip\r\n\r\n%s" % (len(body), extra, body))


def test_the_api_servers_call_takes_the_lean_path_with_its_body() -> None:
    found = framed(api_server_call(b'{"a": 1}'))
    assert found == leanpath.LeanRequest(path="/mutate", body=b'{"a": 1}', closes=False,
                                         raw=api_server_call(b'{"a": 1}'))
    closing = framed(api_server_call(b"{}", path=b"/validate", extra=b"Connection: keep-alive, Close\r\n"))
    assert closing is not None and closing.path == "/validate" and closing.closes


@pytest.mark.parametrize("request_bytes", [
    b"GET /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",           # another method
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",          # another route
    b"POST /mutate HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",           # HTTP/1.0
    b"POST /mutate HTTP/1.1\r\nHost: x\r\n\r\n",                                  # no body length
    b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length : 2\r\n\r\n{}",          # space before the colon
    b"POST /mutate HTTP/1.1\r\nHost: x\r\n folded\r\nContent-Length: 2\r\n\r\n{}",  # obs-fold
    b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"\r\nPOST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",       # an empty line first
    b"POST  /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",          # two spaces
])
def test_any_other_request_takes_the_full_path(request_bytes: bytes) -> None:
    found = framing.frame(request_bytes, max_header_bytes=65536, max_body_bytes=3 << 20)
    assert leanpath.lean_request(request_bytes[:found.end], found.body_start, PATHS) is None


def test_an_answer_is_a_whole_http_message() -> None:
    data = leanpath.answer(400, b'{"error": "x"}', close=True, date="Sat, 05 Dec 2026 21:00:00 GMT")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 400 Bad Request" and body == b'{"error": "x"}'
    assert b"Content-Length: 14" in lines and b"Connection: close" in lines
    assert b"Connection: keep-alive" in leanpath.answer(200, b"{}", close=False, date="d").split(b"\r\n")


# --- on a real server -----------------------------------------------------------------------------

def exchange(server: Server, *requests: bytes) -> list[tuple[int, bytes]]:
    """Status and body of each answer, all on one kept-alive connection."""
    with tls_socket(server) as sock:
        answers = []
        for request in requests:
            sock.sendall(request)
            answers.append(read_response(sock))
    return answers


def chunked_call(body: bytes, path: bytes = b"/mutate") -> bytes:
    """The same review, chunked: the lean path leaves it to gunicorn's parser and Flask."""
    return (b"POST " + path + b" HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", [b"/mutate", b"/validate"])
def test_the_lean_and_the_full_path_give_the_same_answer(server: Server, endpoint: bytes) -> None:
    gpu_pod = example_pod()
    payload = json.dumps(review_of(gpu_pod)).encode()
    (lean_status, lean), (full_status, full) = exchange(
        server, api_server_call(payload, path=endpoint + b"?timeout=10s"), chunked_call(payload, endpoint))
    assert lean_status == full_status == 200
    assert json.loads(lean) == json.loads(full)
    if endpoint == b"/mutate":
        assert json.loads(lean)["response"]["patch"], "the example GPU pod is shaped"


@pytest.mark.slow
def test_malformed_json_gets_400_naming_the_problem_and_the_connection_serves_on(server: Server) -> None:
    good = json.dumps(review_of(example_pod())).encode()
    answers = exchange(server, api_server_call(b'{"apiVersion": '), api_server_call(b"[1, 2]"),
                       api_server_call(good))
    (bad_status, bad), (wrong_status, wrong), (ok_status, ok) = answers
    assert bad_status == 400 and json.loads(bad)["code"] == 400 and "JSON" in json.loads(bad)["error"]
    assert wrong_status == 400 and json.loads(wrong)["error"]
    assert ok_status == 200 and json.loads(ok)["response"]["allowed"] is True
    lines = [line for line in server.log_lines() if line.get("result") == "bad_request"]
    assert len(lines) >= 2 and all(line["endpoint"] == "mutate" for line in lines)


@pytest.mark.slow
def test_connection_close_is_honoured(server: Server) -> None:
    payload = json.dumps(review_of(example_pod())).encode()
    with tls_socket(server) as sock:
        sock.sendall(api_server_call(payload, extra=b"Connection: close\r\n"))
        sock.settimeout(10)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in head.split(b"\r\n")
    assert json.loads(body)["response"]["allowed"] is True  # and the server closed: recv returned b""


@pytest.mark.slow
def test_a_client_that_reads_late_gets_every_pipelined_answer_in_order(server: Server) -> None:
    """The loop answers lean requests itself, one after another from its buffer, without blocking; a
    client reading late gets them all, in order. (Should the socket not take an answer whole, the rest
    goes to a thread; this test does not fill the server's send buffer, which grows to 4 MiB.)"""
    count = 300
    sent = [review_of(example_pod()) for _ in range(count)]
    context = ssl.create_default_context(cafile=str(server.ca))
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect(("127.0.0.1", server.port))
    with context.wrap_socket(raw, server_hostname=SERVICE_HOST) as sock:
        # Sent from a thread: the server stops reading while an answer waits for the window, so a
        # client must read and write at once (as any pipelining client must).
        sender = threading.Thread(target=sock.sendall, daemon=True,
                                  args=(b"".join(api_server_call(json.dumps(review).encode()) for review in sent),))
        sender.start()
        time.sleep(1.0)  # the server has answered what fits and holds the rest
        answers = [read_response(sock) for _ in range(count)]
        sender.join(10)
    assert [status for status, _ in answers] == [200] * count
    uids = [json.loads(body)["response"]["uid"] for _, body in answers]
    assert uids == [review["request"]["uid"] for review in sent]
