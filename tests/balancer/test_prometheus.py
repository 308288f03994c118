"""The DCGM query edge against a tiny local HTTP server answering /api/v1/query like Prometheus."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from webhook.balancer.prometheus import PROFILING_METRIC, UTIL_METRIC, PrometheusClient, PrometheusError


def vector(series: list[tuple[dict, float]]) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1764470000.123, str(value)]} for labels, value in series]}}


class FakePrometheus:
    """Answers each query with the vector registered for the metric it names."""

    def __init__(self) -> None:
        self.answers: dict[str, dict] = {}
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/api/v1/query":
                    self.send_error(404)
                    return
                query = parse_qs(url.query)["query"][0]
                fake.queries.append(query)
                metric = next((m for m in fake.answers if m in query), None)
                if metric is None:
                    code, body = 200, vector([])
                elif fake.answers[metric].get("status") == "error":
                    code, body = 400, fake.answers[metric]
                else:
                    code, body = 200, fake.answers[metric]
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    yield server
    server.stop()


def test_profiling_metric_wins_and_gpu_util_fills_in(prom: FakePrometheus) -> None:
    prom.answers[PROFILING_METRIC] = vector([({"Hostname": "gpu-1"}, 0.42), ({"hostname": "gpu-2"}, 0.9)])
    prom.answers[UTIL_METRIC] = vector([({"Hostname": "gpu-1"}, 99), ({"Hostname": "gpu-3"}, 55)])
    result = PrometheusClient(prom.url, window="5m", timeout=2).utilization()
    assert result.by_host == {"gpu-1": 0.42, "gpu-2": 0.9, "gpu-3": 0.55}
    assert result.source == {"gpu-1": PROFILING_METRIC, "gpu-2": PROFILING_METRIC, "gpu-3": UTIL_METRIC}
    assert f"avg by (Hostname, hostname) (avg_over_time({PROFILING_METRIC}[5m]))" in prom.queries


def test_values_are_clamped_and_nan_or_hostless_series_ignored(prom: FakePrometheus) -> None:
    prom.answers[PROFILING_METRIC] = vector([({"Hostname": "a"}, 1.7), ({"Hostname": "b"}, float("nan")),
                                             ({"gpu": "0"}, 0.5)])
    assert PrometheusClient(prom.url, window="1m", timeout=2).utilization().by_host == {"a": 1.0}


def test_an_error_answer_is_a_prometheus_error(prom: FakePrometheus) -> None:
    prom.answers[PROFILING_METRIC] = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    with pytest.raises(PrometheusError, match="parse error"):
        PrometheusClient(prom.url, window="5m", timeout=2).utilization()


def test_unreachable_prometheus_is_a_prometheus_error(prom: FakePrometheus) -> None:
    url = prom.url
    prom.stop()
    with pytest.raises(PrometheusError):
        PrometheusClient(url, window="5m", timeout=1).utilization()
