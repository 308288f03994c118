"""The starter policies ask only for NVIDIA resources the declared GPU stack advertises.

A policy asking for ``nvidia.com/gpu.shared`` on a stack whose time-slicing config keeps the
``nvidia.com/gpu`` name (``renameByDefault: false``) leaves every such pod Pending, and lets
whole-GPU pods land on time-sliced replicas: two repositories' worth of YAML that must agree.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from webhook.policy import loading

ROOT = Path(__file__).resolve().parents[1]


def stack_values() -> dict:
    return yaml.safe_load((ROOT / "manifests/gpu-operator/values.yaml").read_text())


def advertised_resources(values: dict) -> set[str]:
    """Resources the device plugin configs in the chart values make nodes advertise."""
    found = {"nvidia.com/gpu"}
    for text in values["devicePlugin"]["config"]["data"].values():
        config = yaml.safe_load(text)
        if (config.get("flags") or {}).get("migStrategy") == "mixed":
            found.add("nvidia.com/mig-*")
        sharing = (config.get("sharing") or {}).get("timeSlicing") or {}
        for resource in sharing.get("resources") or ():
            renamed = resource.get("rename") or (f"{resource['name']}.shared" if sharing.get("renameByDefault")
                                                 else None)
            if renamed:
                found.add(renamed)
    return found


def test_every_resource_a_starter_policy_injects_is_advertised() -> None:
    advertised = advertised_resources(stack_values())
    for policy in loading.load_dir(ROOT / "policies").policies:
        resource = policy.gpu.resource
        wanted = "nvidia.com/mig-*" if resource.startswith("nvidia.com/mig-") else resource
        assert wanted in advertised, (f"policy {policy.name} asks for {resource}; "
                                      f"the stack advertises {sorted(advertised)}")


def test_a_time_slicing_config_that_keeps_the_gpu_name_advertises_no_shared_resource() -> None:
    values = stack_values()
    data = values["devicePlugin"]["config"]["data"]
    for key, text in data.items():
        data[key] = text.replace("renameByDefault: true", "renameByDefault: false")
    assert "nvidia.com/gpu.shared" in advertised_resources(stack_values())
    assert "nvidia.com/gpu.shared" not in advertised_resources(values)
