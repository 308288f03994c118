"""manifests/gpu-operator as checked in: stack.yaml model, derived files in step, values keys, CRs valid."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from webhook.errors import GpugateError
from webhook.stack import chartvalues, manifestcheck, manifests, verify
from webhook.stack.model import Stack
from webhook.stack.releases import OperatorVersion

ROOT = Path(__file__).resolve().parents[2]
STACK_TEXT = (ROOT / manifests.STACK_FILE).read_text()


def test_stack_yaml_pins_the_release_the_cluster_and_a_default_and_canary_pool():
    data = yaml.safe_load(STACK_TEXT)
    assert data["operator"]["version"] == "v26.7.0"
    # which minor: tests/stack/test_kubernetes_version.py (the e2e control plane's, inside the operator's range)
    assert re.fullmatch(r"1\.\d+", data["cluster"]["kubernetesVersion"])
    pools = {p["name"]: p for p in data["pools"]}
    assert pools["default"]["default"] is True and "nodeSelector" not in pools["default"]
    assert pools["canary"]["nodeSelector"] and pools["canary"]["default"] is False
    assert pools["default"]["upgradePolicy"] != pools["canary"]["upgradePolicy"]


def test_stack_yaml_is_in_the_tools_canonical_layout():
    """The tool rewrites stack.yaml; if the checked-in file were laid out differently, its first edit would be noisy."""
    assert Stack.from_yaml(STACK_TEXT).to_yaml() == STACK_TEXT


def test_every_derived_file_is_in_step_with_stack_yaml():
    stack = manifests.load_stack(ROOT)
    assert manifests.derive(stack, manifests.read_files(ROOT)) == {}


def test_the_argo_cd_application_carries_the_chart_version_of_stack_yaml():
    app = yaml.safe_load((ROOT / manifests.ARGO_APP_FILE).read_text())
    charts = [s for s in app["spec"]["sources"] if s.get("chart") == "gpu-operator"]
    assert [s["targetRevision"] for s in charts] == [yaml.safe_load(STACK_TEXT)["operator"]["version"]]


def test_values_set_what_the_gitops_setup_needs():
    values = yaml.safe_load((ROOT / manifests.VALUES_FILE).read_text())
    assert values["operator"]["upgradeCRD"] is False
    policy = values["driver"]["upgradePolicy"]
    assert {"autoUpgrade", "maxParallelUpgrades", "maxUnavailable", "gpuPodDeletion", "drain"} <= set(policy)
    config = values["devicePlugin"]["config"]
    assert config["create"] and config["name"] and config["default"] in config["data"]
    sharing = yaml.safe_load(config["data"]["time-slicing-4"])["sharing"]["timeSlicing"]["resources"]
    assert sharing == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert values["mig"]["strategy"] in ("single", "mixed")
    assert values["dcgmExporter"]["enabled"] and values["dcgmExporter"]["serviceMonitor"]["enabled"]
    assert values["driver"]["nvidiaDriverCRD"] == {"enabled": True, "deployDefaultCR": False}


def test_every_values_key_exists_in_the_v26_7_0_chart():
    values = yaml.safe_load((ROOT / manifests.VALUES_FILE).read_text())
    assert chartvalues.unknown_keys(values, "v26.7.0") == []
    assert verify.values_keys(values, OperatorVersion.parse("v26.7.0")).ok


def test_the_values_check_catches_a_key_the_chart_does_not_have():
    values = yaml.safe_load((ROOT / manifests.VALUES_FILE).read_text())
    values["driver"]["maxParallelUpgrades"] = 5
    check = verify.values_keys(values, OperatorVersion.parse("v26.7.0"))
    assert not check.ok and "driver.maxParallelUpgrades" in check.reason


def _crd_validator(shared: Path) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((shared / "schemas" / "nvidia.com_nvidiadrivers.yaml").read_text())
    return jsonschema.Draft7Validator(verify.strict_crd_schema(crd, "v1alpha1"))


def test_drivers_render_one_nvidiadriver_per_pool_valid_against_the_v26_7_0_crd(require_shared):
    objects = manifestcheck.kustomize(ROOT / manifests.DRIVERS_DIR)
    stack = manifests.load_stack(ROOT)
    assert sorted(o["metadata"]["name"] for o in objects) == sorted(p.resource_name for p in stack.pools)
    validator = _crd_validator(require_shared)
    for obj in objects:
        assert obj["kind"] == "NVIDIADriver" and obj["apiVersion"] == "nvidia.com/v1alpha1"
        assert [e.message for e in validator.iter_errors(obj)] == []
        # the CRD's CEL rule, which jsonschema cannot run: a default CR has no nodeSelector
        assert not (obj["spec"]["default"] and obj["spec"].get("nodeSelector"))
    checks = verify.rendered_drivers(manifests.read_files(ROOT), kubernetes_minor=stack.kubernetes_minor,
                                     schema_root=require_shared / "schemas")
    assert all(c.ok for c in checks), checks


def test_the_strict_crd_schema_refuses_the_values_key_gpuPodDeletion_inside_a_cr(require_shared):
    obj = manifestcheck.kustomize(ROOT / manifests.DRIVERS_DIR)[0]
    obj["spec"]["upgradePolicy"]["gpuPodDeletion"] = {"force": True}
    errors = [e.message for e in _crd_validator(require_shared).iter_errors(obj)]
    assert any("gpuPodDeletion" in e for e in errors)


@pytest.mark.parametrize(("change", "says"), [
    (lambda d: d["pools"][1].update(default=True, nodeSelector={}), "more than one default pool"),
    (lambda d: d["pools"][0].update(nodeSelector={"a": "b"}), "default pool must not have a nodeSelector"),
    (lambda d: d["pools"][1].pop("nodeSelector"), "needs a nodeSelector"),
    (lambda d: d["pools"][1]["upgradePolicy"].update(gpuPodDeletion={}), "the field is podDeletion"),
    (lambda d: d["pools"][1].update(driverType="cuda"), "pools[1].driverType"),
    (lambda d: d["cluster"].update(kubernetesVersion=1.33), "cluster.kubernetesVersion"),
    (lambda d: d["components"].update(nvidiaSmi="1"), "unknown component"),
    (lambda d: d["pools"].append(dict(d["pools"][1], name="canary2")), "can both match one node"),
])
def test_a_bad_stack_yaml_is_refused_with_the_field_named(change, says):
    data = yaml.safe_load(STACK_TEXT)
    change(data)
    with pytest.raises(GpugateError, match=None) as err:
        Stack.from_dict(data)
    assert says in str(err.value)


def test_set_scalar_changes_one_value_and_keeps_every_other_byte():
    text = (ROOT / manifests.VALUES_FILE).read_text()
    edited = manifests.set_scalar(text, ("driver", "version"), "610.57.04", filename="values.yaml")
    before, after = text.splitlines(), edited.splitlines()
    assert len(before) == len(after)
    diff = [(a, b) for a, b in zip(before, after, strict=False) if a != b]
    assert diff == [('  version: "595.91.07"', '  version: "610.57.04"')]
    with pytest.raises(GpugateError, match="no line for driver.maxParallelUpgrades"):
        manifests.set_scalar(text, ("driver", "maxParallelUpgrades"), 2, filename="values.yaml")


def test_set_chart_revision_edits_only_the_chart_sources_target_revision():
    text = (ROOT / manifests.ARGO_APP_FILE).read_text()
    edited = manifests.set_chart_revision(text, chart="gpu-operator", version="v26.7.1")
    diff = [(a, b) for a, b in zip(text.splitlines(), edited.splitlines(), strict=False) if a != b]
    assert len(diff) == 1 and "v26.7.1" in diff[0][1] and "targetRevision" in diff[0][1]
    assert len(text.splitlines()) == len(edited.splitlines())
    other = [s for s in yaml.safe_load(edited)["spec"]["sources"] if "chart" not in s]
    before = [s for s in yaml.safe_load(text)["spec"]["sources"] if "chart" not in s]
    assert other == before and len(other) == 2


def test_apply_changes_restores_every_file_when_a_write_fails(tmp_path):
    (tmp_path / "a.yaml").write_text("a: 1\n")
    (tmp_path / "b.yaml").write_text("b: 1\n")

    def fail_on_second(path: str) -> None:
        if path == "c.yaml":
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        manifests.apply_changes(tmp_path, {"a.yaml": b"a: 2\n", "b.yaml": None, "c.yaml": b"c: 1\n"},
                                after_write=fail_on_second)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml"]
    assert (tmp_path / "a.yaml").read_text() == "a: 1\n" and (tmp_path / "b.yaml").read_text() == "b: 1\n"


def test_status_json_of_the_checked_in_stack_lists_pools_and_overrides():
    from webhook.stack import status

    result = status.git_status(ROOT)
    assert result["operator"]["version"] == "v26.7.0"
    assert [p["name"] for p in result["pools"]] == ["default", "canary"]
    assert result["components"] == {"dcgmExporter": "4.6.0-4.8.3-distroless"}
    assert result["outOfStep"] == []
    json.dumps(result)


# ---------------------------------------------------------------------------- pools that could overlap


def _with_pool(data: dict, name: str, selector: dict) -> dict:
    pool = dict(data["pools"][1], name=name, nodeSelector=selector)
    data["pools"].append(pool)
    return data


@pytest.mark.parametrize("selector", [
    {"gpugate.io/zone": "a"},                                   # no shared key: a node can carry both labels
    {"gpugate.io/driver-pool": "canary", "gpugate.io/zone": "a"},  # a subset of canary's nodes
    {"nvidia.com/gpu.present": "true", "gpugate.io/zone": "a"},
])
def test_pools_whose_selectors_could_match_one_node_are_refused(selector):
    """The operator refuses NVIDIADrivers that *could* select the same GPU node (nodeSelectorsCanSelectSameGPUNode),
    not only identical selectors."""
    data = _with_pool(yaml.safe_load(STACK_TEXT), "a100", selector)
    with pytest.raises(GpugateError, match="can both match one node") as err:
        Stack.from_dict(data)
    assert "pool canary" in str(err.value)


@pytest.mark.parametrize("selector", [
    {"gpugate.io/driver-pool": "a100"},                          # same key, another value
    {"gpugate.io/driver-pool": "a100", "gpugate.io/zone": "a"},
])
def test_pools_that_disagree_on_a_label_are_accepted(selector):
    stack = Stack.from_dict(_with_pool(yaml.safe_load(STACK_TEXT), "a100", selector))
    assert [p.name for p in stack.pools] == ["default", "canary", "a100"]


def test_the_overlap_rule_is_the_operators():
    from webhook.stack.model import selectors_can_select_same_node as overlap

    assert overlap({"a": "1"}, {"b": "2"}) and overlap({"a": "1"}, {"a": "1", "b": "2"})
    assert not overlap({"a": "1"}, {"a": "2"})
    assert not overlap({"nvidia.com/gpu.present": "false"}, {"b": "2"}), "selects no GPU node at all"


def test_values_carry_the_default_pools_upgrade_policy():
    """The ClusterPolicy's upgradePolicy is the default pool's (rendering the real chart showed it was not)."""
    values = yaml.safe_load((ROOT / manifests.VALUES_FILE).read_text())["driver"]["upgradePolicy"]
    pool = manifests.load_stack(ROOT).default_pool.upgrade_policy
    assert values["maxParallelUpgrades"] == pool["maxParallelUpgrades"]
    assert values["gpuPodDeletion"] == pool["podDeletion"] and values["drain"] == pool["drain"]


def test_nvidiadrivers_share_the_charts_sync_wave():
    for path in sorted((ROOT / manifests.DRIVERS_DIR).glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "NVIDIADriver":
            assert doc["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "0", path.name
