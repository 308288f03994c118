"""policies/extender: the starter policies routed to the second scheduler's
``gpugate`` profile, plus ``all-pods``, so that every pod the webhook shapes is bound by one scheduler.

The files are copies (kustomize's configMapGenerator reads files only under its own folder); this
keeps each copy the starter policy with ``schedulerName: gpugate`` and nothing else, and shows that
every pod shape the starter set meets, CPU-only pods in any namespace included, is routed there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from tests.policy.kit import container, pod
from webhook import names
from webhook.admission import mutation
from webhook.policy import loading

ROOT = Path(__file__).resolve().parents[2]
STARTER = loading.load_dir(ROOT / "policies")
ROUTED = loading.load_dir(ROOT / "policies" / "extender")


def generated(folder: Path) -> list[str]:
    return list(yaml.safe_load((folder / "kustomization.yaml").read_text())["configMapGenerator"][0]["files"])


def test_each_starter_policy_is_routed_and_otherwise_unchanged() -> None:
    routed = {p.name: p for p in ROUTED.policies}
    for policy in STARTER.policies:
        assert policy.scheduler_name is None, policy.name  # the starter set stays with the default scheduler
        copy = routed.pop(policy.name)
        assert copy.scheduler_name == names.EXTENDER_SCHEDULER_NAME
        assert dataclasses.replace(copy, scheduler_name=None, source=policy.source) == policy, policy.name
    assert list(routed) == ["all-pods"]


def test_the_configmap_holds_every_file_of_the_folder_under_the_starter_name() -> None:
    folder = ROOT / "policies" / "extender"
    assert sorted(generated(folder)) == sorted(p.name for p in loading.policy_files(folder))
    assert set(generated(ROOT / "policies")) < set(generated(folder))
    starter = yaml.safe_load((ROOT / "policies" / "kustomization.yaml").read_text())["configMapGenerator"][0]
    ours = yaml.safe_load((folder / "kustomization.yaml").read_text())["configMapGenerator"][0]
    assert (ours["name"], ours["namespace"]) == (starter["name"], starter["namespace"])


@pytest.mark.parametrize(("namespace", "labels", "gpus"), [
    ("ml-a", {names.PROFILE_LABEL: "training"}, 2),
    ("ml-a", {names.PROFILE_LABEL: "inference"}, 1),
    ("notebooks-a", {names.PROFILE_LABEL: "notebook"}, 1),
    ("ml-a", {}, 0),          # cpu-pods
    ("team-a", {}, 1),        # default-gpu
    ("team-a", {}, 0),        # all-pods: a CPU-only pod anywhere
    ("web-a", {}, 0),         # web-no-gpus matches GPU pods only; a CPU pod there is all-pods'
])
def test_every_pod_shape_goes_to_the_gpugate_scheduler(namespace: str, labels: dict[str, str], gpus: int) -> None:
    resource = names.SHARED_GPU_RESOURCE if labels.get(names.PROFILE_LABEL) == "notebook" else names.GPU_RESOURCE
    made = pod(container("main", gpus=gpus or None, resource=resource), labels=labels)
    result = mutation.mutate(made, namespace=namespace, policies=ROUTED)
    assert result.policy is not None and not result.denials, result
    assert result.desired["spec"]["schedulerName"] == names.EXTENDER_SCHEDULER_NAME, result.policy
