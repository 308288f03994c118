"""Recorded series: exposition pages, as Prometheus would scrape them, turned into promtool input series.

Each scrape parses a page the real renderers wrote (dcgm-exporter's format from
``tests/dcgmexporter.py``, the balancer's from its ``prometheus_client`` collector) and labels
its samples as a Prometheus Operator scrape does (``tests/promserver.py``): the target's labels
added, a sample's own ``namespace``/``pod``/``container``/``job``/``instance`` kept as
``exported_*`` (``honor_labels: false``). A series a page stops carrying gets a staleness marker,
as Prometheus writes one when a scrape no longer has it.

Also the balancer's exposition for a set of Kubernetes objects, through the real collector
(``usagesource.UsageSource``) over a real ``Labeller``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.usage.cluster import Obj, records
from webhook.balancer.labeller import Labeller
from webhook.balancer.metrics import Metrics
from webhook.balancer.settings import BalancerSettings
from webhook.balancer.usagesource import UsagePods, UsageSource
from webhook.kube.gpunode import node_info
from webhook.placement import dracount
from webhook.usage.idle import Decision

TARGET_LABELS = ("job", "instance", "namespace", "pod", "container", "service", "endpoint")
DCGM_TARGET = {"job": "nvidia-dcgm-exporter", "instance": "10.0.3.1:9400", "namespace": "gpu-operator",
               "pod": "nvidia-dcgm-exporter-x", "container": "nvidia-dcgm-exporter"}
BALANCER_TARGETS = ({"job": "gpugate-balancer", "instance": "10.0.1.1:8080", "namespace": "gpugate-system",
                     "pod": "b-1", "container": "balancer"},
                    {"job": "gpugate-balancer", "instance": "10.0.1.2:8080", "namespace": "gpugate-system",
                     "pod": "b-2", "container": "balancer"})
"""Two replicas: both export the same holdings (the rules must not count them twice)."""


def scraped(page: str, target: Mapping[str, str]) -> dict[str, float]:
    """``series -> value`` of one page scraped from ``target``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            labels = {(f"exported_{k}" if k in TARGET_LABELS else k): v for k, v in sample.labels.items()}
            labels.update(target)
            body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out[f"{sample.name}{{{body}}}"] = float(sample.value)
    return out


@dataclass
class Recording:
    """Scrapes one interval apart; :meth:`input_series` is promtool's ``input_series``."""

    scrapes: list[dict[str, float]] = field(default_factory=list)

    def add(self, *pages: Mapping[str, float]) -> None:
        merged: dict[str, float] = {}
        for page in pages:
            merged.update(page)
        self.scrapes.append(merged)

    def input_series(self) -> list[dict[str, str]]:
        names = sorted({s for scrape in self.scrapes for s in scrape})
        return [{"series": name, "values": self._values(name)} for name in names]

    def _values(self, name: str) -> str:
        out: list[str] = []
        seen = False
        for scrape in self.scrapes:
            if name in scrape:
                out.append(repr(scrape[name]))
                seen = True
            else:
                out.append("stale" if seen and out[-1] not in ("stale", "_") else "_")
        return " ".join(out)


def balancer_page(nodes: Iterable[Obj], pods: Iterable[Obj], resource_slices: Iterable[Obj] = (),
                  claims: Iterable[Obj] = (), decisions: Iterable[Decision] = ()) -> str:
    """What ``gpugate balance --usage`` serves on /metrics (its usage series) for these objects, and
    the idle ``decisions`` of its last look."""
    labeller = Labeller(BalancerSettings(), Metrics(), clock=lambda: 0.0)
    labeller.replace_nodes({n["metadata"]["name"]: node_info(n) for n in nodes})
    labeller.dra(lambda cache: cache.replace_slices(dict(dracount.reduce_slice(s) for s in resource_slices)))
    labeller.dra(lambda cache: cache.replace_claims(dict(dracount.reduce_claim(c) for c in claims)))
    usage_pods = UsagePods(lambda **_: None, informer_args=_INFORMER_ARGS, field_selector="")
    usage_pods._replace({r.key: r for r in records(pods)})
    usage_pods.informer.synced.set()
    registry = CollectorRegistry()
    source = UsageSource(labeller, usage_pods, ready=lambda: True)
    source.set_decisions(list(decisions))
    registry.register(source)
    return generate_latest(registry).decode()


def _no_backoff() -> object:
    from random import Random

    from webhook.balancer.backoff import Backoff

    return Backoff(1.0, 1.0, Random(0))


_INFORMER_ARGS = {"page_size": 500, "watch_timeout": 60, "backoff": _no_backoff(), "on_error": lambda *a: None,
                  "on_relist": lambda *a: None}
