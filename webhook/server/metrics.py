"""Prometheus collectors of the admission server. Global state department.

Collectors are process-wide by nature (prometheus-client keeps them in module state), so they
live here and nowhere else. Under gunicorn each worker is a process: ``gpugate serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh temporary folder *before* anything imports
prometheus_client, every worker writes its samples to memory-mapped files there, and whichever
worker answers ``/metrics`` sums all of them, so a request is counted exactly once whichever
worker served it. The master calls ``mark_process_dead`` when a worker exits so that worker's
live gauges disappear (its counters stay: they already happened).

Names are fixed (the dashboard reads them): see the collectors below.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

ADMISSIONS = Counter(
    "gpugate_admissions_total",
    "Admission reviews answered, by endpoint, operation, policy (NAME@REVISION or '') and result.",
    ["endpoint", "operation", "policy", "result"],
)
DURATION = Histogram(
    "gpugate_admission_duration_seconds",
    "Time from the request body read to the response built, by endpoint, result and policy NAME "
    "(without the revision, so a reload does not multiply the bucket series).",
    ["endpoint", "result", "policy"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
PATCH_OPERATIONS = Counter(
    "gpugate_patch_operations_total",
    "JSON Patch operations returned to the API server.",
    ["policy"],
)
CONNECTIONS = Counter(
    "gpugate_connections_accepted_total",
    "TLS connections accepted. Clients that keep connections alive (the API server does) make this grow "
    "slowly; a rate near the admission rate means a TLS handshake per review.",
)
HTTP2_CONNECTIONS = Counter(
    "gpugate_http2_connections_total",
    "Connections whose TLS handshake chose HTTP/2 by ALPN (the API server does), served by gunicorn's HTTP/2.",
)
CONNECTIONS_REFUSED = Counter(
    "gpugate_connections_refused_total",
    "Connections closed at once because a limit was reached: per_source (one address holds too many), "
    "h2_limit (HTTP/2 connections per worker or per address).",
    ["reason"],
)
POLICY_RELOADS = Counter(
    "gpugate_policy_reloads_total",
    "Policy sets loaded and swapped in (each worker process loads and counts its own).",
)
POLICY_RELOAD_ERRORS = Counter(
    "gpugate_policy_reload_errors_total",
    "Policy folder changes refused as invalid (each worker process counts its own refusal).",
)
# An "info" metric as a gauge: the Info type is not supported in multiprocess mode. 'livemax'
# drops a worker's value when it exits and shows 1 for a revision any live worker serves.
POLICY_REVISION = Gauge(
    "gpugate_policy_revision_info",
    "1 for the policy revision being served, 0 for revisions served before.",
    ["revision"],
    multiprocess_mode="livemax",
)


def multiprocess_dir() -> str | None:
    """The folder of the multiprocess samples, when this process runs under ``gpugate serve``."""
    return os.environ.get(MULTIPROC_ENV) or None


def exposition() -> tuple[bytes, str]:
    """The text exposition of all workers' samples (or of this process outside gunicorn)."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def set_revision(revision: str, previous: str | None) -> None:
    if previous and previous != revision:
        POLICY_REVISION.labels(revision=previous).set(0)
    POLICY_REVISION.labels(revision=revision).set(1)


def mark_process_dead(pid: int) -> None:
    """Called by the gunicorn master when a worker exits."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)


def start_plaintext_server(host: str, port: int) -> None:
    """Serve ``/metrics`` (only) over plain HTTP from the calling process, on a daemon thread."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    if multiprocess_dir():
        multiprocess.MultiProcessCollector(registry)
    start_http_server(port, addr=host, registry=registry)
