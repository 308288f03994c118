"""Claim reads fail closed and stay inside the review's time: one deadline for all of a pod's reads,
no retry, a size cap; through the real ``kubernetes`` client's connection pool against a fake API
server (the far side of the wire)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.kubefake import FakeKube
from webhook import kubeclient
from webhook.kube import claims
from webhook.server.claimlookup import MAX_REFERENCES, ClaimLookup, ClaimReadError


def _claim(name: str, gpus: int, **spec_extra: object) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml-a"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                          "count": gpus}}], **spec_extra}}}


def _pod(*names: str) -> dict:
    return {"spec": {"resourceClaims": [{"name": f"r{i}", "resourceClaimName": name}
                                        for i, name in enumerate(names)]}}


@pytest.fixture
def kube():
    with FakeKube() as fake:
        fake.register("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", True)
        fake.register("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", True)
        yield fake


def _reads(kube: FakeKube) -> int:
    return sum(1 for request in kube.requests if "/resourceclaims/" in request.path)


def test_all_reads_of_a_pod_share_one_deadline(kube):
    for i in range(6):
        kube.put(_claim(f"c{i}", 1))
    kube.delay("GET", r"/resourceclaims/", 1.0)
    lookup = ClaimLookup(kubeclient.api_client(kube.url), read_seconds=5.0)
    started = time.monotonic()
    resolved = lookup.resolve(_pod(*(f"c{i}" for i in range(6))), "ml-a")
    assert len(resolved) == 6
    assert time.monotonic() - started < 3.0   # read at once, not one after another (6 s)


def test_a_slow_read_is_refused_at_the_deadline_and_never_retried(kube):
    kube.put(_claim("slow", 8))
    kube.delay("GET", r"/resourceclaims/slow", 4.0)
    lookup = ClaimLookup(kubeclient.api_client(kube.url), read_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(ClaimReadError, match="took longer than 0.5 s"):
        lookup.resolve(_pod("slow"), "ml-a")
    assert time.monotonic() - started < 2.0
    time.sleep(4.5)   # a retry would have been sent meanwhile
    assert _reads(kube) == 1


def test_an_error_is_refused_not_retried_and_an_absent_claim_is_not_counted(kube):
    kube.put(_claim("broken", 8))
    kube.fail_next("GET", r"/resourceclaims/broken", 503, count=5)
    lookup = ClaimLookup(kubeclient.api_client(kube.url))
    with pytest.raises(ClaimReadError, match="503"):
        lookup.resolve(_pod("broken"), "ml-a")
    assert _reads(kube) == 1
    assert lookup.resolve(_pod("absent"), "ml-a") == {}


class _Raw(BaseHTTPRequestHandler):
    """Answers every GET with the server's ``body``: JSON nested past what the fake API server can encode."""

    def do_GET(self) -> None:
        body = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_a_claim_too_large_or_too_deep_to_read_is_refused(kube):
    kube.put(_claim("large", 1, config=[{"opaque": {"driver": "x", "parameters": {"blob": "x" * 200_000}}}]))
    lookup = ClaimLookup(kubeclient.api_client(kube.url), max_bytes=100_000)
    with pytest.raises(ClaimReadError, match="larger than the 100000 bytes"):
        lookup.resolve(_pod("large"), "ml-a")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Raw)
    server.body = json.dumps(_claim("deep", 1, config="DEEP")).replace(  # type: ignore[attr-defined]
        '"DEEP"', '{"a":' * 1_100 + "{}" + "}" * 1_100).encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        deep = ClaimLookup(kubeclient.api_client(f"http://127.0.0.1:{server.server_address[1]}"))
        with pytest.raises(ClaimReadError, match="cannot be decoded"):
            deep.resolve(_pod("deep"), "ml-a")
    finally:
        server.shutdown()
        server.server_close()


def test_more_references_than_kubernetes_allows_are_refused(kube):
    lookup = ClaimLookup(kubeclient.api_client(kube.url))
    with pytest.raises(ClaimReadError, match=str(MAX_REFERENCES)):
        lookup.resolve(_pod(*(f"c{i}" for i in range(MAX_REFERENCES + 1))), "ml-a")


def test_what_was_read_is_what_the_claim_asks(kube):
    kube.put(_claim("eight", 8))
    resolved = ClaimLookup(kubeclient.api_client(kube.url)).resolve(_pod("eight"), "ml-a")
    assert resolved[("ResourceClaim", "eight")].most_devices(frozenset(claims.NVIDIA_DEVICE_CLASSES)) == 8
