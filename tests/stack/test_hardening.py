"""NVIDIA's hardening for unprivileged device access: set in our values, rendered by the real chart of
every release we pin into the ClusterPolicy, and warned about when an override removes it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.helmtool import helm_binary
from tests.prerequisites import needed
from tests.stack.conftest import ROOT, SHARED
from webhook.stack import chartrender, hardening, manifests

CHARTS = SHARED / "upstream" / "charts"
SHIPPED = yaml.safe_load((ROOT / manifests.VALUES_FILE).read_text())
RELEASES = ("v25.10.1", "v26.3.3", "v26.7.0")


def env(entries: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in entries.items()]


def test_the_shipped_values_set_the_hardening():
    check = hardening.check_device_hardening(SHIPPED, SHIPPED)
    assert check.ok and not check.warning and "volume-mounts" in check.reason
    assert hardening.toolkit_ignores_visible_devices(SHIPPED)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda v: v["toolkit"].pop("env"), "toolkit.env has no ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"),
    (lambda v: v["devicePlugin"].update(env=env({"DEVICE_LIST_STRATEGY": "envvar"})),
     "DEVICE_LIST_STRATEGY='envvar'"),
    # the operator applies the entries in order: a later one of the same name wins
    (lambda v: v["toolkit"]["env"].append({"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED",
                                           "value": "true"}), "='true', not 'false'"),
])
def test_an_override_that_removes_the_hardening_is_warned_about_naming_it(edit, says):
    values = copy.deepcopy(SHIPPED)
    edit(values)
    check = hardening.check_device_hardening(values, SHIPPED)
    assert check.ok, "a warning, never a refusal"
    assert check.warning.startswith("this change removes NVIDIA's hardening") and says in check.warning
    assert check.fix and "volume-mounts" in check.fix


def test_values_that_never_had_it_are_warned_about_as_not_set():
    values = copy.deepcopy(SHIPPED)
    values["toolkit"].pop("env")
    check = hardening.check_device_hardening(values, values)
    assert check.warning.startswith("NVIDIA's hardening is not set")
    assert not hardening.toolkit_ignores_visible_devices(values)


def test_a_toolkit_managed_on_the_host_is_not_blamed_but_not_trusted_either():
    values = copy.deepcopy(SHIPPED)
    values["toolkit"] = {"enabled": False}
    check = hardening.check_device_hardening(values, SHIPPED)
    assert not check.warning and "not the operator's" in check.reason
    assert not hardening.toolkit_ignores_visible_devices(values), "nothing proves the host's toolkit ignores it"


@pytest.fixture(scope="module")
def helm() -> Path:
    path = helm_binary()
    needed(CHARTS, "NVIDIA's chart packages")
    return path


def cluster_policy(helm: Path, release: str, values: dict) -> dict:
    source = chartrender.ChartSource(repo_url=f"file://{CHARTS}", chart="gpu-operator", version=release)
    objects = chartrender.render(helm, source, values=yaml.safe_dump(values).encode(), kube_version="1.33")
    [policy] = [o for o in objects if o.get("kind") == "ClusterPolicy"]
    return policy


def applied_env(entries: list[dict] | None) -> dict[str, str]:
    """The env the operator applies from the ClusterPolicy (in order, the last of a name winning)."""
    return {e["name"]: str(e.get("value", "")) for e in entries or []}


@pytest.mark.parametrize("release", RELEASES)
def test_the_real_chart_of_each_release_renders_the_hardening_into_the_cluster_policy(helm, release):
    values = copy.deepcopy(SHIPPED)
    # Only the keys that release has: the rest of our values is checked against v26.7.0 elsewhere.
    values = {k: values[k] for k in ("toolkit", "devicePlugin")}
    spec = cluster_policy(helm, release, values)["spec"]
    toolkit, plugin = applied_env(spec["toolkit"].get("env")), applied_env(spec["devicePlugin"].get("env"))
    assert toolkit["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"] == "false"
    assert toolkit["ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"] == "true"
    assert plugin["DEVICE_LIST_STRATEGY"] == "volume-mounts"


def test_the_real_chart_without_our_env_renders_none_of_it(helm):
    """The chart's own defaults leave the runtime honouring NVIDIA_VISIBLE_DEVICES: the check is needed."""
    spec = cluster_policy(helm, "v26.7.0", {})["spec"]
    assert "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED" not in applied_env(spec["toolkit"].get("env"))
    assert "DEVICE_LIST_STRATEGY" not in applied_env(spec["devicePlugin"].get("env"))
