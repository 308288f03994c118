"""The canary controller's metrics (process-wide: Prometheus collectors live once per process, here).

``gpugate_canary_decisions_total{pool,decision,mode}``, ``gpugate_canary_decision_delay_seconds{pool,mode}``
(from the failure's signal to the pushed commit), ``gpugate_canary_pool_state{pool,state}`` (1 for the
state the pool is in: idle, watching, decided, gave-up), ``gpugate_canary_push_refused_total{pool}``,
``gpugate_canary_gave_up_total{pool}``, ``gpugate_canary_leader`` and ``gpugate_canary_round_errors_total``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REGISTRY = CollectorRegistry()
DECISIONS = Counter("gpugate_canary_decisions_total", "Canary decisions committed, by pool, decision and failure "
                    "mode.", ["pool", "decision", "mode"], registry=REGISTRY)
DELAY = Gauge("gpugate_canary_decision_delay_seconds", "Seconds from the failure's signal to the pushed decision "
              "(the last decision per pool and mode).", ["pool", "mode"], registry=REGISTRY)
STATE = Gauge("gpugate_canary_pool_state", "1 for the state the canary pool is in.", ["pool", "state"],
              registry=REGISTRY)
PUSH_REFUSED = Counter("gpugate_canary_push_refused_total", "Decision pushes the remote refused (redone on the new "
                       "head).", ["pool"], registry=REGISTRY)
GAVE_UP = Counter("gpugate_canary_gave_up_total", "Decisions given up after every push was refused.", ["pool"],
                  registry=REGISTRY)
LEADER = Gauge("gpugate_canary_leader", "1 while this replica holds the canary Lease.", registry=REGISTRY)
ERRORS = Counter("gpugate_canary_round_errors_total", "Rounds that failed (the next one retries).",
                 registry=REGISTRY)
POOL_STATES = ("idle", "watching", "decided", "gave-up")


def state(pool: str, now: str) -> None:
    for name in POOL_STATES:
        STATE.labels(pool=pool, state=name).set(1 if name == now else 0)


def decided(pool: str, decision: str, mode: str, delay: float) -> None:
    DECISIONS.labels(pool=pool, decision=decision, mode=mode or "none").inc()
    DELAY.labels(pool=pool, mode=mode or "none").set(delay)


def serve(port: int) -> None:
    """Serve /metrics on ``port`` (all interfaces: the pod's metrics port) in a daemon thread."""
    start_http_server(port, registry=REGISTRY)
