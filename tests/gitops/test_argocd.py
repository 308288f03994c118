"""The Argo CD bundle (argocd/) is valid, points at things that exist, and keeps its promises:
wave order, sync options, drift rules, no cascade delete of the GPU stack, dashboard links
and notifications, and a project that allows exactly what we render.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from tests.gitops.gitopsdata import (
    ARGOCD,
    CHART_REPO,
    REPO,
    REPO_URL,
    app_named,
    argo_objects,
    deep_merge,
    deployed_applications,
    dig,
    kustomize,
    render_source,
    shared_or_skip,
    sources,
    strict_crd_schema,
    yaml_documents,
)

STACK_FILE = REPO / "manifests" / "gpu-operator" / "stack.yaml"
VALUES_FILE = REPO / "manifests" / "gpu-operator" / "values.yaml"
CHILDREN = ("gpu-operator", "gpugate-webhook", "gpugate-balancer", "gpugate-scheduler", "gpugate-observability")
# docs/gitops.md: webhook < balancer & scheduler < operator & observability (the last wave, never
# waited for: tests/gitops/test_sync_waves.py shows why the GPU Operator must not gate anything)
WAVE_ORDER = (("gpugate-webhook",), ("gpugate-balancer", "gpugate-scheduler"),
              ("gpu-operator", "gpugate-observability"))

# Built-in cluster-scoped kinds (group, kind) we might render. A rendered kind that is in
# neither this table, nor the namespaced table below, nor a saved CRD fails the test so that
# its scope is decided by a person, not guessed.
BUILTIN_CLUSTER_SCOPED = {
    ("", "Namespace"), ("", "Node"), ("", "PersistentVolume"),
    ("rbac.authorization.k8s.io", "ClusterRole"), ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"), ("apiregistration.k8s.io", "APIService"),
    ("scheduling.k8s.io", "PriorityClass"), ("node.k8s.io", "RuntimeClass"),
    ("storage.k8s.io", "StorageClass"), ("storage.k8s.io", "CSIDriver"), ("networking.k8s.io", "IngressClass"),
    ("certificates.k8s.io", "CertificateSigningRequest"), ("flowcontrol.apiserver.k8s.io", "FlowSchema"),
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"), ("cert-manager.io", "ClusterIssuer"),
    ("nvidia.com", "ClusterPolicy"), ("nvidia.com", "NVIDIADriver"), ("nvidia.com", "GPUCluster"),
    ("nfd.k8s-sigs.io", "NodeFeatureRule"), ("security.openshift.io", "SecurityContextConstraints"),
}
NAMESPACED = {
    ("", "ConfigMap"), ("", "Secret"), ("", "Service"), ("", "ServiceAccount"), ("", "PersistentVolumeClaim"),
    ("apps", "Deployment"), ("apps", "DaemonSet"), ("apps", "StatefulSet"), ("batch", "Job"), ("batch", "CronJob"),
    ("rbac.authorization.k8s.io", "Role"), ("rbac.authorization.k8s.io", "RoleBinding"),
    ("policy", "PodDisruptionBudget"), ("networking.k8s.io", "NetworkPolicy"), ("coordination.k8s.io", "Lease"),
    ("autoscaling", "HorizontalPodAutoscaler"), ("monitoring.coreos.com", "ServiceMonitor"),
    ("monitoring.coreos.com", "PodMonitor"), ("monitoring.coreos.com", "PrometheusRule"),
    ("cert-manager.io", "Certificate"), ("cert-manager.io", "Issuer"),
    ("argoproj.io", "Application"), ("argoproj.io", "AppProject"), ("argoproj.io", "ApplicationSet"),
}


def _group_kind(obj: dict) -> tuple[str, str]:
    api_version = obj["apiVersion"]
    return (api_version.rpartition("/")[0], obj["kind"])


def _is_cluster_scoped(obj: dict) -> bool:
    group_kind = _group_kind(obj)
    if group_kind in BUILTIN_CLUSTER_SCOPED:
        return True
    if group_kind in NAMESPACED:
        return False
    raise AssertionError(f"unknown scope for {group_kind}: add it to BUILTIN_CLUSTER_SCOPED or NAMESPACED")


def _git_path_sources(app: dict) -> list[dict]:
    return [s for s in sources(app) if s.get("path") and s["repoURL"] == REPO_URL]


def _rendered(app: dict) -> list[dict]:
    objs: list[dict] = []
    for source in _git_path_sources(app):
        objs += render_source(source)
    return objs


def _sync_options(app: dict) -> set[str]:
    return set((app["spec"].get("syncPolicy") or {}).get("syncOptions") or [])


# --- schemas ----------------------------------------------------------------------------

def test_every_argo_object_validates_against_the_strict_schema():
    """Every Application/ApplicationSet/AppProject under argocd/ (testdata included) is valid."""
    shared = shared_or_skip()
    found = argo_objects()
    kinds = [o["kind"] for _, o in found]
    assert kinds.count("Application") >= 5 + 6 and kinds.count("AppProject") == 1, kinds
    for path, obj in found:
        version = obj["apiVersion"].split("/")[1]
        schema_file = shared / "schemas" / "json" / "argoproj.io" / f"{obj['kind'].lower()}_{version}.json"
        schema = json.loads(schema_file.read_text())
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
        assert not errors, f"{path.relative_to(REPO)}: {errors}"


def test_schema_validation_can_fail():
    """The strict schema rejects a misspelt sync option field, so the test above is not vacuous."""
    shared = shared_or_skip()
    schema = json.loads((shared / "schemas/json/argoproj.io/application_v1alpha1.json").read_text())
    app = app_named("gpu-operator")
    app["spec"]["syncPolicy"]["automated"]["selfheal"] = True
    assert list(jsonschema.Draft7Validator(schema).iter_errors(app))


def _nvidia_objects() -> list[tuple[str, dict]]:
    objs = [(str(p.relative_to(REPO)), o) for p, o in yaml_documents(ARGOCD / "health" / "nvidia.com")]
    for app in deployed_applications():
        objs += [(f"{app['metadata']['name']} render", o) for o in _rendered(app)
                 if o["apiVersion"].startswith("nvidia.com/")]
    return objs


def test_nvidia_objects_validate_against_the_crds():
    """ClusterPolicy/NVIDIADriver test data and rendered NVIDIADrivers match the v26.7.0 CRDs."""
    shared = shared_or_skip()
    schemas = {
        "ClusterPolicy": strict_crd_schema(shared / "schemas" / "nvidia.com_clusterpolicies.yaml"),
        "NVIDIADriver": strict_crd_schema(shared / "schemas" / "nvidia.com_nvidiadrivers.yaml"),
    }
    objs = _nvidia_objects()
    assert {o["kind"] for _, o in objs} == {"ClusterPolicy", "NVIDIADriver"}
    assert any(where.endswith("render") for where, _ in objs), "drivers/ rendered no NVIDIADriver"
    for where, obj in objs:
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in jsonschema.Draft7Validator(schemas[obj["kind"]]).iter_errors(obj)]
        assert not errors, f"{where} {obj['kind']}/{obj['metadata']['name']}: {errors}"


def test_crd_schema_catches_the_values_key_used_as_a_cr_field():
    """gpuPodDeletion is a Helm values key; in a CR it is unknown and would be pruned silently."""
    shared = shared_or_skip()
    schema = strict_crd_schema(shared / "schemas" / "nvidia.com_nvidiadrivers.yaml")
    obj = yaml.safe_load((ARGOCD / "health/nvidia.com/NVIDIADriver/testdata/healthy_ready.yaml").read_text())
    obj["spec"]["upgradePolicy"]["gpuPodDeletion"] = {"force": True}
    assert any("gpuPodDeletion" in e.message for e in jsonschema.Draft7Validator(schema).iter_errors(obj))


# --- sources ----------------------------------------------------------------------------

def test_applications_deployed_are_the_root_and_five_children():
    names = sorted(a["metadata"]["name"] for a in deployed_applications())
    assert names == sorted(("gpugate-root", *CHILDREN))


@pytest.mark.parametrize("name", ("gpugate-root", *CHILDREN))
def test_every_git_path_exists_and_renders(name):
    """Each Git source path exists and renders with the real kubectl kustomize (with its components)."""
    app = app_named(name)
    paths = _git_path_sources(app)
    assert paths, f"{name} has no Git path source"
    for source in paths:
        assert (REPO / source["path"]).is_dir(), f"{name}: {source['path']} does not exist"
        assert render_source(source), f"{name}: {source['path']} renders nothing"


def test_operator_sources_are_chart_values_and_drivers():
    """Multi-source: NVIDIA's chart at the stack.yaml version, $values from Git, drivers/ path."""
    app = app_named("gpu-operator")
    chart, values_ref, drivers = sources(app)
    stack = yaml.safe_load(STACK_FILE.read_text())
    assert (chart["repoURL"], chart["chart"]) == (CHART_REPO, "gpu-operator")
    assert chart["targetRevision"] == stack["operator"]["version"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", chart["targetRevision"]), "pin an exact chart version"
    assert values_ref == {"repoURL": REPO_URL, "targetRevision": "main", "ref": "values"}
    assert drivers["path"] == "manifests/gpu-operator/drivers" and "chart" not in drivers
    for value_file in chart["helm"]["valueFiles"]:
        assert value_file.startswith("$values/"), value_file
        assert (REPO / value_file.removeprefix("$values/")).is_file(), value_file
    assert "ignoreMissingValueFiles" not in chart["helm"], "a missing values file must fail the render"


def test_every_repo_and_destination_is_allowed_by_the_project():
    """sourceRepos lists each repoURL; destinations allow every namespace an object lands in, and no other."""
    project = next(o for o in deployed_applications_and_project() if o["kind"] == "AppProject")
    allowed_repos = set(project["spec"]["sourceRepos"])
    allowed_ns = {d["namespace"] for d in project["spec"]["destinations"]}
    used_ns: set[str] = set()
    for app in deployed_applications():
        assert app["spec"]["project"] == "gpugate"
        for source in sources(app):
            assert source["repoURL"] in allowed_repos, source["repoURL"]
        default_ns = app["spec"]["destination"]["namespace"]
        used_ns.add(default_ns)
        for obj in _rendered(app):
            if not _is_cluster_scoped(obj):
                used_ns.add(obj["metadata"].get("namespace") or default_ns)
    assert allowed_repos == {REPO_URL, CHART_REPO}
    assert allowed_ns == used_ns


def deployed_applications_and_project() -> list[dict]:
    return kustomize(ARGOCD / "apps")


# --- waves and sync policy ----------------------------------------------------------------

def _wave(obj: dict) -> int:
    value = obj["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave", "0")
    assert isinstance(value, str) and re.fullmatch(r"-?\d+", value), f"sync-wave must be a quoted integer: {value!r}"
    return int(value)


def test_sync_waves_follow_the_documented_order():
    """Project first, then webhook < balancer = scheduler < operator = observability (the last wave)."""
    objs = deployed_applications_and_project()
    waves = {o["metadata"]["name"]: _wave(o) for o in objs}
    project_wave = next(_wave(o) for o in objs if o["kind"] == "AppProject")
    groups = [{waves[n] for n in group} for group in WAVE_ORDER]
    assert all(len(g) == 1 for g in groups), "apps of one step share a wave"
    ordered = [project_wave] + [g.pop() for g in groups]
    assert ordered == sorted(set(ordered)), f"waves out of order: {ordered}"
    documented = {m.group(2): int(m.group(1)) for m in re.finditer(
        r"^\|\s*(-?\d+)\s*\|\s*`([\w-]+)`", (REPO / "docs" / "gitops.md").read_text(), re.MULTILINE)}
    assert documented == waves, "docs/gitops.md's wave table differs from the manifests"


@pytest.mark.parametrize("name", CHILDREN)
def test_children_sync_automatically_with_server_side_apply_and_backoff(name):
    app = app_named(name)
    policy = app["spec"]["syncPolicy"]
    assert policy["automated"] == {"prune": True, "selfHeal": True}
    assert {"ServerSideApply=true", "CreateNamespace=true", "RespectIgnoreDifferences=true"} <= _sync_options(app)
    backoff = policy["retry"]["backoff"]
    assert policy["retry"]["limit"] > 0 and backoff["factor"] >= 2 and backoff["duration"] and backoff["maxDuration"]


@pytest.mark.parametrize("name", CHILDREN)
def test_skip_dry_run_where_a_custom_resource_may_precede_its_crd(name):
    """Any app that renders a custom resource (or installs a chart with CRDs) skips dry-run for missing kinds."""
    app = app_named(name)
    renders_cr = any(o["apiVersion"].split("/")[0].count(".") and not o["apiVersion"].split("/")[0].endswith("k8s.io")
                     for o in _rendered(app))
    has_chart = any(s.get("chart") for s in sources(app))
    if renders_cr or has_chart:
        assert "SkipDryRunOnMissingResource=true" in _sync_options(app)


def test_root_app_has_no_server_side_apply_and_does_not_prune():
    """SSA on the parent makes Argo CD ignore child waves (#13320); prune off is the documented exception."""
    root = app_named("gpugate-root")
    assert not any(o.startswith("ServerSideApply") for o in _sync_options(root))
    assert root["spec"]["syncPolicy"]["automated"] == {"prune": False, "selfHeal": True}
    assert root["spec"]["syncPolicy"]["retry"]["backoff"]
    assert "finalizers" not in root["metadata"]
    assert root["spec"]["source"]["path"] == "argocd/apps"


def test_operator_app_has_no_cascade_delete_finalizer_and_says_why():
    app = app_named("gpu-operator")
    assert not app["metadata"].get("finalizers")
    text = (ARGOCD / "apps" / "gpu-operator.yaml").read_text()
    assert "No resources-finalizer on purpose" in text and "drivers" in text
    for name in ("gpugate-webhook", "gpugate-balancer", "gpugate-scheduler", "gpugate-observability"):
        assert app_named(name)["metadata"]["finalizers"] == ["resources-finalizer.argocd.argoproj.io"]


# --- drift rules --------------------------------------------------------------------------

def test_webhook_ca_bundle_is_ignored_for_both_configurations():
    app = app_named("gpugate-webhook")
    rules = {(r["group"], r["kind"]): r for r in app["spec"]["ignoreDifferences"]}
    rendered = {(_group_kind(o), o["metadata"]["name"]) for o in _rendered(app)}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        rule = rules[("admissionregistration.k8s.io", kind)]
        assert rule["jqPathExpressions"] == [".webhooks[]?.clientConfig.caBundle"]
        assert (("admissionregistration.k8s.io", kind), rule["name"]) in rendered, "rule names a rendered object"
    assert "RespectIgnoreDifferences=true" in _sync_options(app)


def test_webhook_manifests_never_render_a_ca_bundle():
    """An empty caBundle in Git would fight the injected one; the rule above only covers diffs."""
    for obj in _rendered(app_named("gpugate-webhook")):
        for hook in obj.get("webhooks", []):
            assert "caBundle" not in hook["clientConfig"]


def test_clusterpolicy_ignores_only_crd_defaulted_fields_the_chart_no_longer_renders():
    """Each ignored ClusterPolicy pointer has a CRD default, is not a chart values key at the
    pinned release (so the chart does not render it) and is not set in our values."""
    shared = shared_or_skip()
    from webhook.stack import chartvalues

    app = app_named("gpu-operator")
    rules = [r for r in app["spec"]["ignoreDifferences"] if r["kind"] == "ClusterPolicy"]
    assert rules and all(r["group"] == "nvidia.com" for r in rules)
    crd = yaml.safe_load((shared / "schemas" / "nvidia.com_clusterpolicies.yaml").read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    release = sources(app)[0]["targetRevision"]
    chart_keys = chartvalues.chart_keys(release).keys
    values = yaml.safe_load(VALUES_FILE.read_text())
    pointers = [p for r in rules for p in r["jsonPointers"]]
    assert "/spec/cdi/default" in pointers
    for pointer in pointers:
        parts = pointer.split("/")[2:]
        node = spec_schema
        for part in parts:
            node = node["properties"][part]
        assert "default" in node, f"{pointer}: the CRD does not default it, so it cannot drift this way"
        dotted = ".".join(parts)
        assert dotted not in chart_keys, f"{pointer}: the chart still renders {dotted}"
        assert dig(values, dotted) is None, f"{pointer}: our values set {dotted}; ignoring it would freeze it"


# --- dashboard and notifications ----------------------------------------------------------

@pytest.mark.parametrize("name", ("gpugate-root", *CHILDREN))
def test_links_to_grafana_and_notification_subscriptions(name):
    annotations = app_named(name)["metadata"]["annotations"]
    links = {k: v for k, v in annotations.items() if k.startswith("link.argocd.argoproj.io/")}
    assert any("grafana" in v and v.startswith("https://") for v in links.values()), links
    for trigger in ("on-sync-failed", "on-health-degraded"):
        assert any(k.startswith(f"notifications.argoproj.io/subscribe.{trigger}.") for k in annotations), trigger


# --- the project's cluster-scoped allow-list -----------------------------------------------

def _chart_cluster_kinds(values: dict) -> set[tuple[str, str]]:
    data = yaml.safe_load((ARGOCD / "chart-cluster-kinds.yaml").read_text())
    kinds = set()
    for entry in data["kinds"]:
        if all(dig(values, cond) is True for cond in entry.get("when", [])):
            kinds.add((entry["group"], entry["kind"]))
    return kinds


def test_project_allows_exactly_the_cluster_scoped_kinds_we_render():
    """Allow-list == kinds rendered by kubectl kustomize from every Application path
    + the chart's documented kinds for our values + Namespace (CreateNamespace)."""
    shared = shared_or_skip()
    project = next(o for o in deployed_applications_and_project() if o["kind"] == "AppProject")
    allowed = {(e["group"], e["kind"]) for e in project["spec"]["clusterResourceWhitelist"]}
    assert all("name" not in e for e in project["spec"]["clusterResourceWhitelist"])

    rendered: set[tuple[str, str]] = set()
    for app in deployed_applications():
        rendered |= {_group_kind(o) for o in _rendered(app) if _is_cluster_scoped(o)}
        if "CreateNamespace=true" in _sync_options(app):
            rendered.add(("", "Namespace"))
    chart_data = yaml.safe_load((ARGOCD / "chart-cluster-kinds.yaml").read_text())
    assert chart_data["release"] == sources(app_named("gpu-operator"))[0]["targetRevision"], \
        "argocd/chart-cluster-kinds.yaml describes another chart release: review it"
    chart_defaults = yaml.safe_load(
        (shared / "upstream" / "gpu-operator" / f"values-{chart_data['release']}.yaml").read_text())
    values = deep_merge(chart_defaults, yaml.safe_load(VALUES_FILE.read_text()))
    rendered |= _chart_cluster_kinds(values)
    assert allowed == rendered, (f"allowed but not rendered: {allowed - rendered}; "
                                 f"rendered but not allowed: {rendered - allowed}")


def test_chart_kind_conditions_follow_the_values():
    """The chart list is value-driven: the DRA stack adds GPUCluster, OpenShift adds SCCs."""
    base = {"clusterPolicy": {"deployCR": True}, "gpuCluster": {"deployCR": False}, "platform": {"openshift": False}}
    assert ("nvidia.com", "GPUCluster") not in _chart_cluster_kinds(base)
    dra = deep_merge(base, {"gpuCluster": {"deployCR": True}, "platform": {"openshift": True}})
    assert ({("nvidia.com", "GPUCluster"), ("security.openshift.io", "SecurityContextConstraints")}
            <= _chart_cluster_kinds(dra))


# --- docs -----------------------------------------------------------------------------------

def test_every_url_comes_from_the_site_file_and_the_docs_say_so():
    """Rendered objects carry exactly the repository and chart URLs of argocd/site/site.yaml;
    the raw files carry none (a fork edits one file), and docs/gitops.md names that file."""
    urls = set()
    for obj in deployed_applications_and_project() + deployed_applications():
        spec = obj.get("spec", {})
        for source in ([spec["source"]] if spec.get("source") else []) + list(spec.get("sources") or []):
            urls.add(source["repoURL"])
        urls |= set(spec.get("sourceRepos") or [])
    assert urls == {REPO_URL, CHART_REPO}
    for _, obj in argo_objects():
        if str(_.relative_to(ARGOCD)).startswith("health/"):
            continue
        text = yaml.safe_dump(obj)
        assert "https://" not in text.replace("https://kubernetes.default.svc", ""), _
    assert "argocd/site/site.yaml" in (REPO / "docs" / "gitops.md").read_text()


def test_chart_cluster_kinds_match_what_the_real_chart_renders():
    """The documented list (used where helm is absent) against NVIDIA's chart package, rendered with our values."""
    shared = shared_or_skip()
    from tests.gitops.test_sync_waves import operator_app_objects

    rendered = {_group_kind(o) for o in operator_app_objects()
                if _is_cluster_scoped(o) and not (o["metadata"].get("annotations") or {}).get("helm.sh/hook")}
    chart_data = yaml.safe_load((ARGOCD / "chart-cluster-kinds.yaml").read_text())
    chart_defaults = yaml.safe_load(
        (shared / "upstream" / "gpu-operator" / f"values-{chart_data['release']}.yaml").read_text())
    documented = _chart_cluster_kinds(deep_merge(chart_defaults, yaml.safe_load(VALUES_FILE.read_text())))
    assert rendered == documented | {("nvidia.com", "NVIDIADriver")}, "drivers/ adds our NVIDIADrivers"
