"""manifests/chart/gpugate: lint, strict validation of every documented values combination,
identical renders, a values schema that refuses wrong types with a message, and the behaviour
each switch promises."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from tests.manifests.chart import (
    CHART,
    CI_VALUES,
    installed,
    is_test_hook,
    render,
    render_text,
    template_args,
    values_file,
)
from tests.manifests.chart import helm as run_helm
from tests.manifests.helpers import (
    KUBERNETES_VERSION,
    NAMESPACE,
    SCHEMA_ROOT,
    arg_value,
    find,
    is_custom,
    one,
    require_schemas,
)
from webhook.stack import manifestcheck


def _ids(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


def test_every_documented_combination_is_a_ci_values_file() -> None:
    assert {_ids(p) for p in CI_VALUES} >= {"default", "cert-manager", "fail-open", "everything", "external-url",
                                          "own-policies", "existing-policies", "webhook-only", "balancer-only", "lean"}
    readme = (CHART / "README.md").read_text()
    for path in CI_VALUES:
        assert f"ci/{path.name}" in readme, f"README.md of the chart does not document ci/{path.name}"


def test_helm_lint_strict_passes() -> None:
    result = run_helm("lint", str(CHART), "--strict", "--kube-version", KUBERNETES_VERSION)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", CI_VALUES, ids=_ids)
def test_helm_lint_strict_passes_with(values: Path) -> None:
    result = run_helm("lint", str(CHART), "--strict", "--kube-version", KUBERNETES_VERSION, "--values", str(values))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", CI_VALUES, ids=_ids)
def test_builtin_objects_pass_strict_validation(values: Path) -> None:
    builtins = [o for o in render((values,)) if not is_custom(o)]
    assert builtins
    problems = manifestcheck.validate_objects(builtins, kubernetes_version=KUBERNETES_VERSION, schema_root=None)
    assert problems == []


@pytest.mark.parametrize("values", ["cert-manager", "everything"])
def test_custom_resources_pass_their_strict_json_schemas(values: str) -> None:
    require_schemas()
    customs = [o for o in render((values_file(values),)) if is_custom(o)]
    assert customs
    assert manifestcheck.validate_objects(customs, kubernetes_version=KUBERNETES_VERSION,
                                          schema_root=SCHEMA_ROOT) == []


@pytest.mark.parametrize("values", CI_VALUES, ids=_ids)
def test_two_renders_of_the_same_values_are_byte_identical(values: Path) -> None:
    first = run_helm(*template_args((values,)))
    second = run_helm(*template_args((values,)))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


def test_no_template_makes_anything_at_render_time() -> None:
    """No certificate, random string, clock or cluster lookup at render time: such a render differs every
    time (Argo CD would show drift on every refresh) or depends on the cluster it is rendered against."""
    forbidden = re.compile(r"\b(genCA|genSelfSignedCert|genSignedCert|genPrivateKey|randAlpha\w*|randNumeric|"
                           r"randAscii|randBytes|uuidv4|now|lookup|date)\b")
    for path in sorted((CHART / "templates").rglob("*")):
        if path.is_file():
            found = forbidden.findall(path.read_text())
            assert not found, f"{path.relative_to(CHART)} uses {sorted(set(found))}"


def test_the_chart_holds_no_copy_of_the_policies_dashboard_or_scheduler_config() -> None:
    """One home each: the chart's files/ are links into the kustomize folders and policies/."""
    files = CHART / "files"
    for name, target in (("policies", "policies"), ("dashboard.json", "manifests/observability/dashboard.json"),
                         ("usage-rules.yaml", "manifests/observability/usage-rules.yaml"),
                         ("scheduler-config.yaml", "manifests/scheduler/scheduler-config.yaml")):
        assert (files / name).is_symlink(), f"files/{name} must be a link to {target}"
        assert (files / name).resolve() == (CHART.parents[2] / target).resolve()


# -- the values schema ----------------------------------------------------------------------------

@pytest.mark.parametrize(("pair", "expected"), [
    ("webhook.replicas=two", r"webhook.*replicas.*(integer|got string)"),
    ("webhook.failOpen=maybe", r"failOpen.*(boolean|got string)"),
    ("tls.mode=vault", r"tls.*mode.*(builtin|must be one of|value must be)"),
    ("webhook.url=http://127.0.0.1:8443", r"webhook.*url.*(pattern|does not match)"),
    ("webhook.replica=2", r"(replica.*not allowed|additional properties.*replica)"),
    ("webhook.excludeNamespaces=kube-system", r"excludeNamespaces.*(array|got string)"),
])
def test_a_wrong_value_fails_the_render_naming_the_key(pair: str, expected: str) -> None:
    result = run_helm(*template_args(sets=(pair,)))
    assert result.returncode != 0, f"--set {pair} rendered"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert re.search(expected, result.stderr, re.IGNORECASE | re.DOTALL), result.stderr


@pytest.mark.parametrize(("pairs", "expected"), [
    (("webhook.url=https://127.0.0.1:8443",), "set tls.mode to external"),
    (("tls.mode=external", "webhook.url=https://127.0.0.1:8443"), "webhook.caBundle is empty"),
    (("webhook.caBundle=QUJD",), "use tls.mode external"),
    (("balancer.enabled=false", "scheduler.enabled=true"), "scheduler.enabled needs balancer.enabled"),
    (("policies.existingConfigMap=mine", "policies.files.a\\.yaml=x"), "not both"),
    (("webhook.enabled=false", "balancer.idlePolicies=true"), "enable the webhook or set policies.existingConfigMap"),
])
def test_combinations_that_cannot_work_fail_with_the_fix(pairs: tuple[str, ...], expected: str) -> None:
    result = run_helm(*template_args(sets=pairs))
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


# -- what the switches do -------------------------------------------------------------------------

def _webhooks(objects) -> list[dict]:
    return [hook for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
            for hook in one(objects, kind, "gpugate-webhook")["webhooks"]]


def _excluded(hook: dict) -> list[str]:
    [names] = [e["values"] for e in hook["namespaceSelector"]["matchExpressions"]
               if e["key"] == "kubernetes.io/metadata.name"]
    return names


@pytest.mark.parametrize("namespace", [NAMESPACE, "platform-gpugate"])
def test_webhooks_never_see_the_release_namespace_kube_system_or_the_gpu_operator(namespace: str) -> None:
    objects = installed(render(namespace=namespace))
    for hook in _webhooks(objects):
        assert {"kube-system", namespace, "gpu-operator"} <= set(_excluded(hook)), hook["name"]
    operator = installed(render(sets=("gpuOperatorNamespace=nvidia-gpu-operator",)))
    for hook in _webhooks(operator):
        assert "nvidia-gpu-operator" in _excluded(hook)


def test_a_webhook_url_points_both_configurations_at_it_with_the_ca() -> None:
    objects = render((values_file("external-url"),))
    url = yaml.safe_load(values_file("external-url").read_text())["webhook"]
    for hook in _webhooks(objects):
        path = "/mutate" if hook["name"].startswith("mutate") else "/validate"
        assert hook["clientConfig"] == {"url": url["url"] + path, "caBundle": url["caBundle"]}
    webhook_certs = [o for o in objects if o["kind"] in ("Job", "CronJob")
                     and o["metadata"]["name"].startswith("gpugate-certs")]
    assert webhook_certs == [], "no certificate Job for a server outside the cluster"


def test_no_ca_bundle_is_rendered_unless_given() -> None:
    for values in ("default", "cert-manager", "fail-open"):
        for hook in _webhooks(render((values_file(values),))):
            assert "caBundle" not in hook["clientConfig"], (values, hook["name"])


def test_fail_open_switches_validation_to_ignore_and_the_server() -> None:
    objects = render((values_file("fail-open"),))
    assert {h["failurePolicy"] for h in _webhooks(objects)} == {"Ignore"}
    [container] = one(objects, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]["containers"]
    assert "--fail-open" in container["args"]
    assert {h["name"]: h["failurePolicy"] for h in _webhooks(render())} == {
        "mutate.gpugate.io": "Ignore", "validate.gpugate.io": "Fail"}


@pytest.mark.parametrize(("values", "kinds"), [
    ("webhook-only", {"Deployment/gpugate-webhook"}),
    ("balancer-only", {"Deployment/gpugate-balancer"}),
    ("everything", {"Deployment/gpugate-webhook", "Deployment/gpugate-balancer", "Deployment/gpugate-scheduler"}),
])
def test_parts_switch_on_and_off(values: str, kinds: set[str]) -> None:
    objects = installed(render((values_file(values),)))
    assert {f"{o['kind']}/{o['metadata']['name']}" for o in objects if o["kind"] == "Deployment"} == kinds
    if values == "balancer-only":
        assert not find(objects, "MutatingWebhookConfiguration")
        assert not find(objects, "ConfigMap", "gpugate-policies")


def test_pdb_spread_priority_resources_and_network_policy_are_on_by_default_and_switchable() -> None:
    default = installed(render())
    deployment = one(default, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]
    assert deployment["priorityClassName"] == "gpugate-critical"
    assert one(default, "PriorityClass", "gpugate-critical")["value"] == 1000000
    assert [c["topologyKey"] for c in deployment["topologySpreadConstraints"]] == [
        "kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    assert deployment["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    assert one(default, "PodDisruptionBudget", "gpugate-webhook")["spec"]["maxUnavailable"] == 1
    assert one(default, "NetworkPolicy", "gpugate-webhook")
    balancer = one(default, "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]
    assert balancer["affinity"]["podAntiAffinity"]

    lean = installed(render((values_file("lean"),)))
    assert not find(lean, "PodDisruptionBudget") and not find(lean, "NetworkPolicy")
    assert not find(lean, "PriorityClass")
    spec = one(lean, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert "topologySpreadConstraints" not in spec
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    [balancer_container] = one(lean, "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]["containers"]
    assert arg_value(balancer_container, "--prometheus") == "http://prometheus.monitoring:9090"


# -- policies --------------------------------------------------------------------------------------

def _policy_checksum(objects) -> str | None:
    template = one(objects, "Deployment", "gpugate-webhook")["spec"]["template"]
    return (template["metadata"].get("annotations") or {}).get("checksum/policies")


def test_the_default_policies_are_the_starter_set_of_policies_folder() -> None:
    data = one(render(), "ConfigMap", "gpugate-policies")["data"]
    policies = CHART.parents[2] / "policies"
    listed = yaml.safe_load((policies / "kustomization.yaml").read_text())["configMapGenerator"][0]["files"]
    assert data == {name: (policies / name).read_text() for name in listed}


def test_policies_from_values_replace_the_starter_set_and_roll_the_webhook() -> None:
    own = render((values_file("own-policies"),))
    assert set(one(own, "ConfigMap", "gpugate-policies")["data"]) == {"only-gpu-pods.yaml"}
    assert _policy_checksum(own) != _policy_checksum(render())
    changed = render(sets=("policies.files.a\\.yaml=kind: GPUPolicy",))
    assert _policy_checksum(changed) not in (_policy_checksum(own), _policy_checksum(render()))


def test_an_existing_configmap_is_mounted_and_none_is_rendered() -> None:
    objects = render((values_file("existing-policies"),))
    assert not find(objects, "ConfigMap", "gpugate-policies")
    volumes = one(objects, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policies", "configMap": {"name": "team-gpu-policies"}} in volumes
    assert _policy_checksum(objects) is None


@pytest.mark.parametrize(("sets", "configmap"), [(("balancer.idlePolicies=true",), "gpugate-policies"),
                                                 (("balancer.idlePolicies=true", "policies.existingConfigMap=team"),
                                                  "team")])
def test_idle_policies_mount_the_webhooks_policies_into_the_balancer(sets: tuple[str, ...], configmap: str) -> None:
    """A policy's spec.idle annotate or evict applies only where the balancer reads the policies."""
    balancer = one(render(sets=sets), "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]
    [container] = balancer["containers"]
    assert "--usage" in container["args"] and "--policies=/etc/gpugate/policies" in container["args"]
    assert {"name": "policies", "configMap": {"name": configmap}} in balancer["volumes"]
    default = one(render(), "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]
    assert not any(a.startswith("--policies") for a in default["containers"][0]["args"])


# -- helm test -------------------------------------------------------------------------------------

def test_helm_test_hooks_dry_run_a_shaped_and_a_denied_pod_with_their_own_narrow_account() -> None:
    hooks = [o for o in render() if is_test_hook(o)]
    [pod] = [o for o in hooks if o["kind"] == "Pod"]
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["gpugate", "smoke"]
    assert arg_value(container, "--shaped-namespace") == "gpugate-smoke"
    assert arg_value(container, "--denied-namespace") == "web-gpugate-smoke"
    # The namespaces and the account come first (lower weight), and go once the test passed.
    weights = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]):
               int(o["metadata"]["annotations"].get("helm.sh/hook-weight", "0")) for o in hooks}
    assert all(w < 0 for key, w in weights.items() if key[0] != "Pod")
    roles = [o for o in hooks if o["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["gpugate-smoke", "web-gpugate-smoke"]
    assert all(r["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}] for r in roles)
    # Test hooks are not installed: `helm install` and Argo CD create none of them.
    assert not [o for o in installed(render()) if o["metadata"]["name"].startswith("gpugate-smoke")]


def test_a_certificate_job_changes_name_when_its_spec_changes() -> None:
    """helm upgrade cannot patch a Job's immutable pod template: a changed Job must be a new object."""
    jobs = [o["metadata"]["name"] for o in render() if o["kind"] == "Job"]
    bumped = [o["metadata"]["name"] for o in render(sets=("image.tag=0.2.0",)) if o["kind"] == "Job"]
    assert len(jobs) == 2 and not set(jobs) & set(bumped)
    assert jobs == [o["metadata"]["name"] for o in render() if o["kind"] == "Job"]


def test_the_rendered_ca_bundle_is_the_one_given() -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    text = render_text(sets=("tls.mode=external", f"webhook.caBundle={ca}"))
    assert text.count(f'caBundle: "{ca}"') == 2
