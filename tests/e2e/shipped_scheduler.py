"""The second scheduler as manifests/scheduler ships it: the KubeSchedulerConfiguration its Deployment reads.

Why a module of its own: test_extender (the balancer's extender called by kube-scheduler) and
test_placement (the second scheduler packing pods) both start a real kube-scheduler from the
configuration the project ships, never from a copy that could drift from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.e2e.webhook_fixture import find, kustomize
from webhook import names

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests" / "scheduler"
BINPACK = "gpugate-binpack"
"""The first profile's schedulerName (plugins only); the second is the extender's."""


def configuration() -> dict[str, Any]:
    """The KubeSchedulerConfiguration in the ConfigMap that ``kubectl kustomize manifests/scheduler``
    renders, under the key the Deployment's ``--config`` names; its two profiles checked."""
    documents = kustomize(MANIFESTS)
    deployment = find(documents, "Deployment", "gpugate-scheduler")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config_path = next(arg.split("=", 1)[1] for arg in container["command"] if arg.startswith("--config="))
    mount = next(m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = find(documents, "ConfigMap", volume["configMap"]["name"])
    document = yaml.safe_load(config_map["data"][config_path[len(mount["mountPath"]) + 1:]])
    assert document["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in document["profiles"]] == [BINPACK, names.EXTENDER_SCHEDULER_NAME]
    return dict(document)
