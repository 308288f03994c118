"""A real Prometheus for tests: started on 127.0.0.1 with a scrape config of its own, stopped by PID.

Prometheus, not a fake, evaluates every PromQL expression the balancer sends and the dashboard
shows. ``.ci/run`` installs Debian's ``prometheus`` package (it brings ``promtool``); without the
binaries a test skips and says so, under ``CI`` it fails.

The scrape config gives each target the labels the Prometheus Operator gives a ServiceMonitor's
target (``namespace``, ``pod``, ``container``, ``service``, ``endpoint``, ``job``) with
``honor_labels: false``, the GPU Operator's default for dcgm-exporter: the exporter's own
``pod``/``namespace``/``container`` (the workload holding the GPU) then arrive as
``exported_pod``/``exported_namespace``/``exported_container``, as they do in a cluster.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.prerequisites import missing
from webhook.localcluster import processes

INSTALL = "install Debian's prometheus package (`apt-get install prometheus`; .ci/run does), or put it on PATH"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def binary(name: str = "prometheus") -> Path:
    """``prometheus`` or ``promtool`` from PATH; skip without it (fail under CI)."""
    found = shutil.which(name)
    if found is None:
        missing(f"no {name} on PATH: {INSTALL}")
    return Path(found)


def target_labels(index: int) -> dict[str, str]:
    """What the Prometheus Operator's ServiceMonitor relabeling gives the index-th dcgm-exporter target."""
    return {"namespace": "gpu-operator", "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
            "pod": f"nvidia-dcgm-exporter-{index:05d}", "container": "nvidia-dcgm-exporter"}


class Prometheus:
    """One Prometheus process scraping the given targets every ``interval``."""

    def __init__(self, workdir: Path, targets: Mapping[str, Sequence[str]], *, interval: str = "1s",
                 rule_files: Sequence[Path] = (), evaluation_interval: str = "1s") -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": evaluation_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "honor_labels": False,
                 "static_configs": [{"targets": [t], "labels": target_labels(i)} for i, t in enumerate(addresses)]}
                for job, addresses in targets.items()],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        program = binary()
        data = workdir / "data"
        self.process = processes.start(processes.Launch(
            name="prometheus", ports=1, timeout=60,
            command=lambda ports: [str(program), f"--config.file={self.config}", f"--storage.tsdb.path={data}",
                                   f"--web.listen-address=127.0.0.1:{ports[0]}", "--log.level=warn"],
            probe=lambda ports: _get(f"http://127.0.0.1:{ports[0]}/-/ready", timeout=1)[0] == 200),
            workdir)
        self.url = f"http://127.0.0.1:{self.process.ports[0]}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query now; AssertionError with Prometheus' error otherwise."""
        status, body = _get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10)
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix (what a Grafana time series panel asks for)."""
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        status, body = _get(f"{self.url}/api/v1/query_range?{params}", timeout=30)
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def value(self, expr: str, **labels: str) -> float | None:
        """The value of the one series of ``expr`` whose labels include ``labels`` (None: none)."""
        found = [s for s in self.query(expr) if labels.items() <= s["metric"].items()]
        assert len(found) <= 1, found
        return float(found[0]["value"][1]) if found else None

    def wait_for(self, expr: str, *, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until ``expr`` has a non-empty result (a scrape or two landed); returns it."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline or not self.process.running():
                raise AssertionError(f"no result for {expr} after {timeout:.0f}s; Prometheus log:\n"
                                     f"{self.process.tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.stop()


def _get(url: str, *, timeout: float) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()
