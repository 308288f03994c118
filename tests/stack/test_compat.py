"""The compatibility matrix and the upgrade rules, without files or git (pure core)."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml

from webhook.errors import GpugateError
from webhook.stack import compat, matrix, releases
from webhook.stack.releases import OperatorVersion as V

M = matrix.load()


def test_matrix_covers_every_release_line_from_v24_9_to_v26_7_0():
    versions = [str(r.version) for r in M.releases]
    assert versions[0] == "v24.9.0" and versions[-1] == "v26.7.0"
    assert M.lines() == ((24, 9), (25, 3), (25, 10), (26, 3), (26, 7))
    assert {"v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3"} <= set(versions)


def test_every_entry_names_a_source_for_defaults_kubernetes_and_drivers():
    for release in M.releases:
        assert set(release.sources) >= {"defaults", "kubernetes", "drivers"}, release.version
        assert all(":" in text and len(text) > 20 for text in release.sources.values())
        assert release.defaults["driver"], release.version
        assert release.branches and release.drivers


def test_an_entry_without_a_source_is_refused_at_load():
    data = yaml.safe_load(resources.files("webhook.stack").joinpath("data/matrix.yaml").read_text())
    del data["releases"][3]["source"]["kubernetes"]
    with pytest.raises(releases.MatrixError, match=r"v25.3.0.*no source for kubernetes"):
        releases.Matrix.from_dict(data)


def test_a_listed_driver_outside_the_listed_branches_is_refused_at_load():
    data = yaml.safe_load(resources.files("webhook.stack").joinpath("data/matrix.yaml").read_text())
    data["releases"][-1]["drivers"].append("570.1.1")
    with pytest.raises(releases.MatrixError, match="outside the listed branches"):
        releases.Matrix.from_dict(data)


@pytest.mark.parametrize("tag", ["v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3", "v26.7.0"])
def test_defaults_equal_the_chart_values_at_that_tag(tag, require_shared):
    values = yaml.safe_load((require_shared / "upstream" / "gpu-operator" / f"values-{tag}.yaml").read_text())
    paths = {"driver": ("driver", "version"), "driverManager": ("driver", "manager", "version"),
             "toolkit": ("toolkit", "version"), "devicePlugin": ("devicePlugin", "version"),
             "gfd": ("gfd", "version"), "dcgmExporter": ("dcgmExporter", "version"),
             "dcgm": ("dcgm", "version"), "migManager": ("migManager", "version")}
    release = M.release(tag)
    for component, version in release.defaults.items():
        node = values
        for key in paths[component]:
            node = node[key]
        assert node == version, f"{tag} {component}: matrix {version}, chart {node}"


@pytest.mark.parametrize(("current", "target", "ok", "says"), [
    ("v25.10.0", "v25.10.1", True, "stays within release line v25.10"),
    ("v25.3.4", "v25.10.1", True, "moves to the next release line v25.10"),
    ("v26.3.3", "v26.7.0", True, "next release line"),
    ("v26.7.0", "v26.7.0", True, "stays at"),
    ("v24.9.2", "v25.10.1", False, "skips release line(s) v25.3"),
    ("v25.3.4", "v26.7.0", False, "skips release line(s) v25.10, v26.3"),
    ("v26.7.0", "v26.3.3", False, "older than the current"),
])
def test_release_path_allows_the_same_or_the_next_line_only(current, target, ok, says):
    check = compat.check_release_path(M, V.parse(current), V.parse(target))
    assert check.ok is ok
    assert says in check.reason


@pytest.mark.parametrize(("tag", "minor", "ok", "warned"), [
    ("v26.7.0", 33, True, False), ("v26.7.0", 36, True, False), ("v26.7.0", 32, False, False),
    ("v26.7.0", 37, True, True), ("v24.9.2", 31, True, False), ("v24.9.2", 32, True, True),
    ("v25.10.1", 30, True, False), ("v25.10.1", 29, False, False),
])
def test_kubernetes_older_than_the_targets_range_is_refused_and_newer_is_warned(tag, minor, ok, warned):
    """Older than the listed range refuses (missing APIs); newer passes with a warning, since
    NVIDIA extends a release's range only in a later release."""
    check = compat.check_kubernetes(M.release(tag), minor)
    assert check.ok is ok
    assert bool(check.warning) is warned
    assert f"1.{minor}" in check.reason and M.release(tag).kubernetes_range in check.reason


@pytest.mark.parametrize("driver", ["570.124.06", "570.133.20", "570.148.08", "570.158.01"])
def test_known_bad_drivers_are_refused_on_pools_mixing_mig_and_full_gpus(driver):
    check = compat.check_mig_mixed(M, pool="canary", driver=driver, mixes_mig_and_full=True)
    assert not check.ok
    assert "mixes MIG and full GPUs" in check.reason and "Pending" in check.reason
    assert compat.check_mig_mixed(M, pool="canary", driver=driver, mixes_mig_and_full=False).ok
    assert compat.check_mig_mixed(M, pool="canary", driver="580.65.06", mixes_mig_and_full=True).ok


def test_driver_outside_validated_branches_is_refused_unless_allowed_then_warned():
    release = M.release("v26.7.0")
    refused = compat.check_driver_validated(release, pool="default", driver="575.57.08", allow_unvalidated=False)
    assert not refused.ok and "outside v26.7.0's validated branches" in refused.reason and not refused.warning
    allowed = compat.check_driver_validated(release, pool="default", driver="575.57.08", allow_unvalidated=True)
    assert allowed.ok and "575.57.08" in allowed.warning
    in_branch = compat.check_driver_validated(release, pool="default", driver="580.65.06", allow_unvalidated=False)
    assert in_branch.ok and "validated branch" in in_branch.reason
    precompiled = compat.check_driver_validated(release, pool="default", driver="595", allow_unvalidated=False)
    assert precompiled.ok


@pytest.mark.parametrize(("current", "mode", "target", "target_mode", "steps"), [
    ("v26.3.3", "clusterpolicy", "v26.7.0", "nvidiadriver", 2),
    ("v26.7.0", "clusterpolicy", "v26.7.0", "nvidiadriver", 1),
    ("v26.3.3", "clusterpolicy", "v26.7.0", "clusterpolicy", 1),
    ("v26.7.0", "nvidiadriver", "v26.7.0", "nvidiadriver", 1),
])
def test_moving_to_nvidiadriver_from_before_v26_7_0_takes_two_commits(current, mode, target, target_mode, steps):
    assert compat.migration_steps(M, current=V.parse(current), current_mode=mode,
                                  target=V.parse(target), target_mode=target_mode) == steps


def test_nvidiadriver_management_needs_v26_7_0():
    check = compat.check_driver_management(M, current=V.parse("v26.3.0"), current_mode="clusterpolicy",
                                           target=V.parse("v26.3.3"), target_mode="nvidiadriver")
    assert not check.ok and "needs gpu-operator v26.7.0" in check.reason


@pytest.mark.parametrize(("old", "new", "ok"), [
    ({"driverType": "gpu", "usePrecompiled": False}, {"driverType": "gpu", "usePrecompiled": False}, True),
    ({"driverType": "gpu"}, {"driverType": "vgpu", "usePrecompiled": False}, False),
    ({"driverType": "gpu", "usePrecompiled": False}, {"driverType": "gpu", "usePrecompiled": True}, False),
])
def test_driver_type_and_use_precompiled_never_change_under_one_cr_name(old, new, ok):
    check = compat.check_immutable(cr_name="canary", old=old, new=new)
    assert check.ok is ok
    if not ok:
        assert "immutable" in check.reason and "new CR name" in check.reason


@pytest.mark.parametrize("bad", ["26.7", "v26.7.0-rc1", "latest"])
def test_a_malformed_operator_version_names_the_expected_form(bad):
    with pytest.raises(GpugateError, match="vYY.MM.PP"):
        V.parse(bad)


# ---------------------------------------------------------------------------- driver images, matrix data


@pytest.mark.parametrize(("driver", "precompiled", "says"), [
    ("595.99.99", False, "not in the list of published driver images"),
    ("595.91.7", False, "did you mean 595.91.07?"),
    ("610", False, "is a bare branch"),
    ("610", True, "has precompiled images for branches 580, 595"),
    ("595.91.07", True, "name the branch (595)"),
])
def test_a_driver_image_that_was_never_published_is_refused(driver, precompiled, says):
    """A branch check let these through; each would commit an image tag that does not exist."""
    release = M.release("v26.7.0")
    assert compat.check_driver_validated(release, pool="p", driver=driver, allow_unvalidated=False).ok
    check = compat.check_driver_published(M, release, pool="p", driver=driver, use_precompiled=precompiled,
                                          allow_unlisted=False)
    assert not check.ok and says in check.reason


def test_an_unlisted_driver_passes_only_with_the_override_and_says_so():
    release = M.release("v26.7.0")
    check = compat.check_driver_published(M, release, pool="gold", driver="595.99.99", use_precompiled=False,
                                          allow_unlisted=True)
    assert check.ok and "--allow-unlisted-driver" in check.reason and "--allow-unlisted-driver" in check.warning
    bare = compat.check_driver_published(M, release, pool="gold", driver="610", use_precompiled=False,
                                         allow_unlisted=True)
    assert not bare.ok, "a bare branch is never an image without usePrecompiled"


@pytest.mark.parametrize(("driver", "precompiled"), [("595.91.07", False), ("610.57.04", False), ("580", True),
                                                     ("595", True)])
def test_published_drivers_and_precompiled_branches_pass_with_their_source(driver, precompiled):
    check = compat.check_driver_published(M, M.release("v26.7.0"), pool="p", driver=driver,
                                          use_precompiled=precompiled, allow_unlisted=False)
    assert check.ok and check.source


def test_every_release_driver_is_a_published_image_and_the_loader_checks_it():
    for release in M.releases:
        assert set(release.drivers) | {release.defaults["driver"]} <= set(M.published_drivers), release.version
    data = yaml.safe_load(resources.files("webhook.stack").joinpath("data/matrix.yaml").read_text())
    del data["publishedDrivers"]["610.57.04"]
    with pytest.raises(releases.MatrixError, match="not under publishedDrivers"):
        releases.Matrix.from_dict(data)


def test_575_57_08_is_known_bad_on_pools_mixing_mig_and_full_gpus():
    """NVIDIA/gpu-operator#1361 names 575.57.08 with the 570 drivers."""
    check = compat.check_mig_mixed(M, pool="p", driver="575.57.08", mixes_mig_and_full=True)
    assert not check.ok and "issue-1361" in check.source


def test_newer_patches_of_the_pinned_lines_are_known():
    """The matrix knows what a patch upgrade could move to: the operator line's and the driver branch's."""
    assert [str(r.version) for r in M.newer_patches(V.parse("v26.3.1"))] == ["v26.3.2", "v26.3.3"]
    assert M.newer_patches(M.newest.version) == ()
    assert M.newer_drivers("580.173.02") == ("580.178.04",)
    assert M.newer_drivers("595.91.07") == () and M.newer_drivers("595") == ()
    ok = compat.check_driver_published(M, M.release("v26.7.0"), pool="p", driver="580.173.02",
                                       use_precompiled=False, allow_unlisted=False)
    assert "newer in branch 580: 580.178.04" in ok.reason


_OS_SUFFIX = re.compile(r"-(ubuntu\d\d\.\d\d|ubi\d+|rhel\d+|distroless)$")


@pytest.mark.parametrize("tag", ["v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3"])
def test_component_defaults_keep_the_os_suffix_of_their_release_line(tag, require_shared):
    """An image tag without its OS suffix does not exist: every release of a line writes a component's
    tag with the suffix the tagged values.yaml of that line uses (dcgm -ubuntu22.04, mig-manager -ubuntu20.04)."""
    values = yaml.safe_load((require_shared / "upstream" / "gpu-operator" / f"values-{tag}.yaml").read_text())
    line = V.parse(tag).line
    for component in ("dcgm", "migManager", "toolkit", "dcgmExporter"):
        suffix = _OS_SUFFIX.search(str(values[component]["version"]))
        for release in M.releases:
            default = release.defaults.get(component)
            if release.version.line != line or default is None:
                continue
            found = _OS_SUFFIX.search(default)
            assert (found and found.group(1)) == (suffix and suffix.group(1)), \
                f"{release.version} {component} {default}"
