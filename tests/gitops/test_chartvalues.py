"""The values check knows each chart release's keys and reports the ones Helm would ignore."""

from __future__ import annotations

import pytest
import yaml

from tests.gitops.gitopsdata import REPO, shared_or_skip
from tools import chartkeys_gen
from webhook.errors import GpugateError
from webhook.stack import chartvalues

VALUES_FILE = REPO / "manifests" / "gpu-operator" / "values.yaml"
STACK_FILE = REPO / "manifests" / "gpu-operator" / "stack.yaml"

OUR_OWN_VALUES = {
    "operator": {"upgradeCRD": False, "annotations": {"example.com/team": "gpu"}},
    "driver": {
        "nvidiaDriverCRD": {"enabled": True, "deployDefaultCR": False},
        "upgradePolicy": {"maxParallelUpgrades": 2, "gpuPodDeletion": {"force": False}, "drain": {"enable": True}},
    },
    "devicePlugin": {"config": {"create": True, "name": "dp", "default": "any", "data": {"any": "version: v1"}}},
    "dcgmExporter": {"serviceMonitor": {"enabled": True, "additionalLabels": {"release": "prom"}}},
    "hostPaths": {"kubeletRootDir": "/var/lib/k0s/kubelet"},
    "daemonsets": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
    "node-feature-discovery": {"worker": {"anything": {"goes": True}}},
}


def test_known_releases_are_the_five_saved_chart_releases():
    assert chartvalues.known_releases() == ("v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3", "v26.7.0")


def test_unknown_key_is_caught_and_its_real_home_suggested():
    """driver.maxParallelUpgrades is the classic typo: the real key sits under upgradePolicy."""
    values = {"driver": {"maxParallelUpgrades": 5, "version": "595.91.07"}}
    assert chartvalues.unknown_keys(values, "v26.7.0") == ["driver.maxParallelUpgrades"]
    assert chartvalues.suggest("driver.maxParallelUpgrades", "v26.7.0") == "driver.upgradePolicy.maxParallelUpgrades"


def test_a_values_dict_of_our_own_is_accepted():
    """Known keys, free-form maps (labels, data), lists, comment-documented keys and the NFD subchart pass."""
    assert chartvalues.unknown_keys(OUR_OWN_VALUES, "v26.7.0") == []


def test_only_the_first_wrong_segment_is_reported_and_open_maps_stop_the_walk():
    values = {"dcgmExporter": {"serviceMonitr": {"enabled": True}, "serviceMonitor": {"intervall": "5s"}},
              "toolkit": {"env": [{"name": "X"}]}, "operator": {"annotations": {"a.b/c": "d"}}}
    assert chartvalues.unknown_keys(values, "v26.7.0") == [
        "dcgmExporter.serviceMonitor.intervall", "dcgmExporter.serviceMonitr"]


def test_keys_follow_the_release():
    """clusterPolicy.deployCR arrived in v26.7.0; useOpenKernelModules was removed (kept only as a
    deprecated comment, which the data leaves out on purpose)."""
    values = {"clusterPolicy": {"deployCR": True}, "driver": {"useOpenKernelModules": True}}
    assert chartvalues.unknown_keys(values, "v26.7.0") == ["driver.useOpenKernelModules"]
    assert chartvalues.unknown_keys(values, "v26.3.3") == ["clusterPolicy", "driver.useOpenKernelModules"]
    assert chartvalues.unknown_keys(values, "v24.9.2") == ["clusterPolicy"]


def test_release_without_v_is_accepted_and_unknown_release_is_an_error():
    assert chartvalues.unknown_keys({"mig": {"strategy": "mixed"}}, "26.7.0") == []
    with pytest.raises(GpugateError, match=r"v99\.1\.0.*known releases: v24\.9\.2"):
        chartvalues.unknown_keys({}, "v99.1.0")
    with pytest.raises(GpugateError, match="mapping"):
        chartvalues.unknown_keys(["driver"], "v26.7.0")  # type: ignore[arg-type]


def test_the_real_values_file_passes_for_the_pinned_release():
    """manifests/gpu-operator/values.yaml has no key the pinned chart would ignore."""
    release = yaml.safe_load(STACK_FILE.read_text())["operator"]["version"]
    assert chartvalues.unknown_keys(yaml.safe_load(VALUES_FILE.read_text()), release) == []


def test_every_data_file_names_its_source():
    for release in chartvalues.known_releases():
        text = (REPO / "webhook" / "stack" / "data" / "chart-keys" / f"{release}.txt").read_text()
        header = [line for line in text.splitlines() if line.startswith("#")]
        assert any(f"github.com/NVIDIA/gpu-operator deployments/gpu-operator/values.yaml at tag {release}" in h
                   for h in header)
        assert any("sha256" in h for h in header)


def test_checked_in_key_data_equals_what_the_generator_derives(tmp_path, capsys):
    """Regenerating from ../shared/upstream/gpu-operator changes nothing."""
    upstream = shared_or_skip() / "upstream" / "gpu-operator"
    assert chartkeys_gen.main(["--upstream", str(upstream), "--check"]) == 0
    assert "up to date with" in capsys.readouterr().out  # a check that passes says so
    assert chartkeys_gen.main(["--upstream", str(upstream), "--out", str(tmp_path)]) == 0
    (tmp_path / "v26.7.0.txt").write_text("# edited by hand\n")
    assert chartkeys_gen.main(["--upstream", str(upstream), "--out", str(tmp_path), "--check"]) == 1


SAMPLE = """\
driver:
  enabled: true
  # NOTE: useOpenKernelModules has been deprecated and made no-op.
  # useOpenKernelModules: false
  upgradePolicy:
    # how many nodes can be upgraded in parallel
    maxParallelUpgrades: 1
  labels:
    team: gpu
hostPaths:
  rootFS: "/"
  # kubeletRootDir represents the root with the kubelet base directory
  # kubeletRootDir: ""
  # capability: a controller Deployment plus the plugin
operator:
  # metrics:
  #   serviceMonitor:
  #     interval: 15s
  #     # - sourceLabels:
  #     additionalLabels: {}
  env: []
"""


def test_derive_keys_reads_values_and_commented_examples_but_not_prose_or_deprecated():
    entries = {e.path: (e.kind, e.origin) for e in chartkeys_gen.derive_keys(SAMPLE)}
    assert entries == {
        "driver": ("key", "values"),
        "driver.enabled": ("key", "values"),
        "driver.upgradePolicy": ("key", "values"),
        "driver.upgradePolicy.maxParallelUpgrades": ("key", "values"),
        "driver.labels": ("open", "values"),
        "hostPaths": ("key", "values"),
        "hostPaths.rootFS": ("key", "values"),
        "hostPaths.kubeletRootDir": ("key", "comment"),
        "operator": ("key", "values"),
        "operator.env": ("open", "values"),
        "operator.metrics": ("key", "comment"),
        "operator.metrics.serviceMonitor": ("key", "comment"),
        "operator.metrics.serviceMonitor.interval": ("key", "comment"),
        "operator.metrics.serviceMonitor.additionalLabels": ("open", "comment"),
    }
