"""NVIDIA's own gpu-operator chart, rendered as Argo CD renders it, passes a real API server.

For every chart release ``gpugate stack`` can move between (the packages in
../shared/upstream/charts: v25.10.1, v26.3.3, v26.7.0), with this repository's values derived for
a stack at that release (the checked-in stack.yaml at the pinned one; ClusterPolicy driver
management before v26.7.0, where NVIDIADriver is not supported):

- ``helm template`` (helm built from helm.sh/helm/v3) renders it, from the loopback Helm
  repository too, byte for byte;
- the rendered ClusterPolicy says what the stack means (``webhook.stack.chartcheck``);
- its CRDs are applied, then every other object (and our NVIDIADrivers) passes a server-side
  dry-run apply on the e2e control plane, as Argo CD's server-side apply would send it (strict
  field validation: a field the CRD does not declare is an error, not silently pruned).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e import gitops_binaries
from tests.e2e.helmrepo import CHARTS, HelmRepo
from tests.prerequisites import missing, needed
from webhook.stack import chartcheck, chartrender, manifestcheck, manifests
from webhook.stack import matrix as matrix_data
from webhook.stack.model import Stack
from webhook.stack.releases import OperatorVersion

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "gpu-operator"
FIELD_MANAGER = "argocd-controller"  # Argo CD's server-side apply manager (common.ArgoCDSSAManager)


def _versions() -> list[str]:
    if not (CHARTS / "index.yaml").is_file():
        return []
    index = yaml.safe_load((CHARTS / "index.yaml").read_text())
    return sorted((e["version"] for e in index["entries"]["gpu-operator"]), key=OperatorVersion.parse)


VERSIONS = _versions()


@pytest.fixture(scope="module")
def helm() -> Path:
    found = gitops_binaries.paths()
    if found is None:
        missing("helm is not built: `python -m tests.e2e.gitops_binaries build`")
    if not VERSIONS:
        missing(f"{CHARTS} holds no chart repository (index.yaml)")
    return found["helm"]


@pytest.fixture(scope="module")
def helm_repo() -> Iterator[HelmRepo]:
    needed(CHARTS / "index.yaml", "NVIDIA's chart repository")
    with HelmRepo.serve(CHARTS) as repo:
        yield repo


def stack_at(version: str) -> Stack:
    """The checked-in stack, moved to ``version`` the way the stack tool would hold it there."""
    stack = manifests.load_stack(REPO)
    target = OperatorVersion.parse(version)
    if target == stack.operator_version:
        return stack
    release = matrix_data.load().release(target)
    pool = dataclasses.replace(stack.default_pool, driver=release.defaults["driver"])
    return stack.replace(operator_version=target, management="clusterpolicy", pools=(pool,))


def values_for(stack: Stack) -> tuple[bytes, list[str]]:
    """The repository's values as the stack tool would commit them at ``stack``'s release.

    Keys that release's chart does not know are dropped and returned: the tool's values-keys check
    refuses the move until they are gone. (They matter: the v25.10.1 and v26.3.3 charts pass
    dcgmExporter.serviceMonitor through verbatim, and their CRD does not declare scrapeTimeout, so
    the API server refuses the ClusterPolicy: "field not declared in schema".)
    """
    from webhook.stack import chartvalues

    text = manifests.render_values((REPO / manifests.VALUES_FILE).read_text(), stack)
    values = yaml.safe_load(text)
    unknown = chartvalues.unknown_keys(values, str(stack.operator_version))
    for dotted in unknown:
        *parents, leaf = dotted.split(".")
        node = values
        for key in parents:
            node = node[key]
        del node[leaf]
    return (yaml.safe_dump(values, sort_keys=False).encode() if unknown else text.encode()), unknown


def kubectl(cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=180, check=False)


def _dump(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def _server_minor(cluster) -> str:
    from kubernetes import client

    info = client.VersionApi(cluster.api_client()).get_code()
    return f"1.{int(''.join(ch for ch in info.minor if ch.isdigit()))}"


@pytest.fixture(scope="module")
def chart_crds(cluster) -> Iterator[set[str]]:
    """Every CRD name the renders applied, and the namespace; removed after the module."""
    applied: set[str] = set()
    created = kubectl(cluster, "create", "namespace", NAMESPACE).returncode == 0
    yield applied
    for name in sorted(applied):
        kubectl(cluster, "delete", "crd", name, "--wait=false", "--ignore-not-found")
    if created:
        kubectl(cluster, "delete", "namespace", NAMESPACE, "--wait=false")


def _apply_crds(cluster, crds: list[dict], applied: set[str]) -> None:
    result = kubectl(cluster, "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                     "-f", "-", stdin=_dump(crds))
    assert result.returncode == 0, result.stderr
    applied.update(c["metadata"]["name"] for c in crds)
    names = [f"crd/{c['metadata']['name']}" for c in crds]
    waited = kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", *names)
    assert waited.returncode == 0, waited.stderr
    # The discovery cache of kubectl in the next call must see the new kinds.
    time.sleep(1)


@pytest.mark.parametrize("version", VERSIONS)
def test_chart_renders_means_the_stack_and_passes_a_server_side_dry_run(version, helm, helm_repo, cluster,
                                                                        chart_crds):
    stack = stack_at(version)
    values, dropped = values_for(stack)
    if version == str(manifests.load_stack(REPO).operator_version):
        assert dropped == [], "the pinned release's chart knows every key of values.yaml"
    minor = _server_minor(cluster)
    source = chartrender.ChartSource(repo_url=helm_repo.url, chart=stack.chart, version=version)
    objects = chartrender.render(helm, source, values=values, kube_version=minor)
    offline = chartrender.render(helm, dataclasses.replace(source, repo_url=f"file://{CHARTS}"), values=values,
                                 kube_version=minor)
    assert objects == offline, "the loopback Helm repository serves the same chart as the folder"

    drivers = (manifestcheck.kustomize(REPO / manifests.DRIVERS_DIR) if stack.management == "nvidiadriver" else [])
    checks = chartcheck.check_rendered_chart(objects, stack, drivers)
    assert all(c.ok for c in checks), [f"{c.name}: {c.reason}" for c in checks if not c.ok]

    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert {"clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"} <= {c["metadata"]["name"] for c in crds}
    _apply_crds(cluster, crds, chart_crds)
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"] + drivers
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"gpu-operator-{version}-") as handle:
        handle.write(_dump(rest))
        handle.flush()
        result = kubectl(cluster, "apply", "--server-side", "--dry-run=server", "--force-conflicts",
                         f"--field-manager={FIELD_MANAGER}", "-n", NAMESPACE, "-o", "json", "-f", handle.name)
    assert result.returncode == 0, f"server-side dry-run of the {version} chart failed:\n{result.stderr}"
    answered = json.loads(result.stdout)
    items = answered.get("items", [answered])
    assert len(items) == len(rest)
    # What the API server made of the ClusterPolicy is still what the stack means (no pruned field).
    [policy] = [o for o in items if o["kind"] == "ClusterPolicy"]
    assert chartcheck.check_cluster_policy([policy], stack).ok


def test_the_values_keys_check_refuses_what_the_api_server_refuses(helm, cluster, chart_crds):
    """Our values at an older release: the key the values-keys check names is the field the API server rejects."""
    from webhook.stack import chartvalues

    older = [v for v in VERSIONS if OperatorVersion.parse(v) < manifests.load_stack(REPO).operator_version]
    if not older:
        missing(f"{CHARTS} holds no chart package older than the checked-in release to move back to")
    stack = stack_at(older[-1])
    text = manifests.render_values((REPO / manifests.VALUES_FILE).read_text(), stack)
    unknown = chartvalues.unknown_keys(yaml.safe_load(text), older[-1])
    assert "dcgmExporter.serviceMonitor.scrapeTimeout" in unknown
    source = chartrender.ChartSource(repo_url=f"file://{CHARTS}", chart=stack.chart, version=older[-1])
    objects = chartrender.render(helm, source, values=text.encode(), kube_version=_server_minor(cluster))
    _apply_crds(cluster, [o for o in objects if o["kind"] == "CustomResourceDefinition"], chart_crds)
    [policy] = [o for o in objects if o["kind"] == "ClusterPolicy"]
    result = kubectl(cluster, "apply", "--server-side", "--dry-run=server", f"--field-manager={FIELD_MANAGER}",
                     "-f", "-", stdin=_dump([policy]))
    assert result.returncode != 0
    assert "scrapeTimeout: field not declared in schema" in result.stderr
