"""Invariants of the webhook deployment, each its own rule (manifests/webhook and components)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from flask import Flask

from tests.manifests.helpers import (
    KUBERNETES_VERSION,
    MANIFESTS,
    NAMESPACE,
    POLICIES,
    VARIANTS,
    arg_value,
    find,
    one,
    render_variant,
    rule_allows,
)
from webhook.server import routes, serving
from webhook.stack import manifestcheck

WEBHOOK_VARIANTS = sorted(v for v, (resources, _) in VARIANTS.items() if "webhook" in resources)
CONFIG_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
ROOT = Path(__file__).resolve().parents[2]
SYSTEM_NAMESPACES = {"kube-system", "kube-public", "kube-node-lease"}


def _walk(value, path=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}.{key}", key, item
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


def _deployment(objs):
    return one(objs, "Deployment", "gpugate-webhook")


def _container(objs):
    spec = _deployment(objs)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "webhook")


def _hooks(objs):
    for kind in CONFIG_KINDS:
        config = one(objs, kind, "gpugate-webhook")
        for hook in config["webhooks"]:
            yield kind, hook


def _server_routes() -> set[tuple[str, str]]:
    app = Flask("routes-only")
    app.register_blueprint(routes.blueprint)
    flask_routes = {(rule.rule, method) for rule in app.url_map.iter_rules() for method in rule.methods}
    # The two admission paths are answered in front of Flask (routes.admission_wsgi), POST only.
    return flask_routes | {(path, "POST") for path in routes.ADMISSION_ENDPOINTS}


# --- caBundle and TLS ------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_ca_bundle_anywhere(variant: str) -> None:
    """caBundle comes from the cluster (cainjector or gpugate certs); Git never carries one."""
    for obj in render_variant(variant):
        hits = [path for path, key, _ in _walk(obj) if key == "caBundle"]
        assert not hits, f"{obj['kind']}/{obj['metadata']['name']} has caBundle at {hits}"


def test_no_ca_bundle_in_any_file_under_manifests() -> None:
    offenders = [p for p in MANIFESTS.rglob("*.yaml")
                 if p.relative_to(MANIFESTS).parts[0] in ("webhook", "balancer", "scheduler", "observability")
                 and any(line.strip().startswith("caBundle:") for line in p.read_text().splitlines())]
    assert offenders == []


@pytest.mark.parametrize("variant", ["webhook+builtin-tls", "webhook+cert-manager"])
def test_both_tls_ways_fill_the_secret_the_deployment_mounts(variant: str) -> None:
    objs = render_variant(variant)
    volumes = {v["name"]: v for v in _deployment(objs)["spec"]["template"]["spec"]["volumes"]}
    secret_name = volumes["tls"]["secret"]["secretName"]
    mount = next(m for m in _container(objs)["volumeMounts"] if m["name"] == "tls")["mountPath"]
    assert arg_value(_container(objs), "--cert") == f"{mount}/tls.crt"
    assert arg_value(_container(objs), "--key") == f"{mount}/tls.key"
    if variant == "webhook+cert-manager":
        cert = one(objs, "Certificate", "gpugate-webhook")
        assert cert["spec"]["secretName"] == secret_name
        assert f"gpugate-webhook.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
        for kind in CONFIG_KINDS:
            annotations = one(objs, kind, "gpugate-webhook")["metadata"]["annotations"]
            assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{cert['metadata']['name']}"
    else:
        for kind in ("Job", "CronJob"):
            for obj in find(objs, kind):
                pod = obj["spec"]["template"]["spec"] if kind == "Job" else \
                    obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
                certs = pod["containers"][0]
                assert certs["command"] == ["gpugate", "certs"]
                assert arg_value(certs, "--secret") == f"{NAMESPACE}/{secret_name}"
                assert arg_value(certs, "--patch-webhooks") == "gpugate-webhook"
                assert arg_value(certs, "--service") == "gpugate-webhook"
                assert arg_value(certs, "--namespace") == NAMESPACE
        assert find(objs, "Job") and find(objs, "CronJob")


def test_builtin_tls_rbac_is_limited_by_resource_names() -> None:
    objs = render_variant("webhook+builtin-tls")
    role = one(objs, "Role", "gpugate-certs")
    for rule in role["rules"]:
        assert rule["resources"] == ["secrets"] and rule["apiGroups"] == [""]
        if rule["verbs"] == ["create"]:
            continue  # RBAC cannot scope create by name; granted alone, in this namespace only
        assert rule["resourceNames"] == ["gpugate-webhook-tls"]
    assert role["metadata"]["namespace"] == NAMESPACE
    cluster_role = one(objs, "ClusterRole", "gpugate-certs")
    assert cluster_role["rules"] == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": ["gpugate-webhook"],
        "verbs": ["get", "patch"],
    }]


# --- where the webhook configurations point -------------------------------------------------------

@pytest.mark.parametrize("variant", WEBHOOK_VARIANTS)
def test_webhook_configurations_point_at_the_service_and_the_servers_paths(variant: str) -> None:
    objs = render_variant(variant)
    service = one(objs, "Service", "gpugate-webhook")
    routes = _server_routes()
    expected_paths = {"MutatingWebhookConfiguration": "/mutate", "ValidatingWebhookConfiguration": "/validate"}
    for kind, hook in _hooks(objs):
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (service["metadata"]["name"], service["metadata"]["namespace"])
        assert ref["path"] == expected_paths[kind]
        assert (ref["path"], "POST") in routes, f"the server has no POST {ref['path']}"
        assert ref.get("port", 443) in {p["port"] for p in service["spec"]["ports"]}


def test_service_maps_443_to_the_containers_8443() -> None:
    objs = render_variant("webhook")
    service = one(objs, "Service", "gpugate-webhook")
    https = next(p for p in service["spec"]["ports"] if p["port"] == 443)
    ports = {p["name"]: p["containerPort"] for p in _container(objs)["ports"]}
    target = https["targetPort"]
    assert ports.get(target, target) == 8443
    assert arg_value(_container(objs), "--bind") == "0.0.0.0:8443"
    template_labels = _deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= template_labels.items()


@pytest.mark.parametrize("variant", WEBHOOK_VARIANTS)
def test_excluded_namespaces_include_the_webhooks_own_and_the_system_ones(variant: str) -> None:
    objs = render_variant(variant)
    own = one(objs, "Deployment", "gpugate-webhook")["metadata"]["namespace"]
    for kind, hook in _hooks(objs):
        expressions = hook["namespaceSelector"]["matchExpressions"]
        by_name = [e for e in expressions if e["key"] == "kubernetes.io/metadata.name"]
        assert len(by_name) == 1 and by_name[0]["operator"] == "NotIn"
        assert {own, *SYSTEM_NAMESPACES} <= set(by_name[0]["values"]), kind
        # The GPU Operator's namespace (argocd/apps/gpu-operator.yaml): its pods are not gpugate's to shape.
        operator_namespace = yaml.safe_load((ROOT / "argocd/apps/gpu-operator.yaml").read_text())
        assert operator_namespace["spec"]["destination"]["namespace"] in by_name[0]["values"], kind
        opt_out = {"key": "gpugate.io/skip", "operator": "NotIn", "values": ["true"]}
        if kind == "MutatingWebhookConfiguration":
            assert opt_out in expressions
            assert hook["objectSelector"] == {"matchExpressions": [opt_out]}
        else:  # the label, on a namespace or a pod, opts out of mutation, never out of deny rules
            assert [e for e in expressions if e["key"] != "kubernetes.io/metadata.name"] == [], kind
            assert "objectSelector" not in hook


def _workload_rules() -> list[dict]:
    """One rule per API group of ``admission.workloads.WORKLOAD_KINDS``, in the table's order."""
    from webhook.admission.workloads import WORKLOAD_KINDS

    rules: dict[tuple[str, str], list[str]] = {}
    for workload in WORKLOAD_KINDS:
        rules.setdefault((workload.group, workload.version), []).append(workload.resource)
    return [{"apiGroups": [group], "apiVersions": [version], "resources": resources,
             "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}
            for (group, version), resources in rules.items()]


def test_webhook_registration_fields() -> None:
    objs = render_variant("webhook")
    names = {kind: hook["name"] for kind, hook in _hooks(objs)}
    assert names == {"MutatingWebhookConfiguration": "mutate.gpugate.io",
                     "ValidatingWebhookConfiguration": "validate.gpugate.io"}
    for kind, hook in _hooks(objs):
        # DRA claims and templates: shaped on CREATE, judged on CREATE and UPDATE.
        claim_operations = ["CREATE"] if kind == "MutatingWebhookConfiguration" else ["CREATE", "UPDATE"]
        # Workloads: validation only, every kind admission.workloads judges and nothing else.
        workload_rules = [] if kind == "MutatingWebhookConfiguration" else _workload_rules()
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                  "operations": ["CREATE"], "scope": "Namespaced"},
                                 {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                                  "resources": ["resourceclaims", "resourceclaimtemplates"],
                                  "operations": claim_operations, "scope": "Namespaced"}, *workload_rules]
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] == 5
        assert hook["matchPolicy"] == "Equivalent"
        # Mutation is defaulting and fails open; validation fails closed (docs/server.md).
        assert hook["failurePolicy"] == ("Ignore" if kind == "MutatingWebhookConfiguration" else "Fail")
        if kind == "MutatingWebhookConfiguration":
            assert hook["reinvocationPolicy"] == "IfNeeded"


def test_fail_open_component_switches_validation_to_ignore_and_the_server_flag() -> None:
    objs = render_variant("webhook+builtin-tls+fail-open")
    assert {hook["failurePolicy"] for _, hook in _hooks(objs)} == {"Ignore"}
    assert "--fail-open" in _container(objs)["args"]
    assert "--fail-open" not in _container(render_variant("webhook+builtin-tls"))["args"]
    assert _deployment(objs)["spec"]["replicas"] >= 2
    readme = (MANIFESTS / "webhook/components/fail-open/README.md").read_text()
    assert "Trade-off" in (MANIFESTS / "webhook/components/fail-open/kustomization.yaml").read_text()
    assert "The risk" in readme


# --- the Deployment ---------------------------------------------------------------------------------

def test_deployment_runs_two_replicas_spread_across_nodes_with_a_pdb() -> None:
    objs = render_variant("webhook")
    deployment = _deployment(objs)
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spread = [c for c in pod.get("topologySpreadConstraints", [])
              if c["topologyKey"] == "kubernetes.io/hostname" and c["whenUnsatisfiable"] == "DoNotSchedule"]
    anti = (pod.get("affinity", {}).get("podAntiAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", []))
    assert spread or anti, "replicas are not forced onto different nodes"
    for constraint in spread:
        assert constraint["maxSkew"] == 1
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = one(objs, "PodDisruptionBudget", "gpugate-webhook")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    allowed_down = pdb["spec"].get("maxUnavailable")
    assert allowed_down is not None and allowed_down < deployment["spec"]["replicas"] \
        or pdb["spec"].get("minAvailable", 0) >= 1


def test_probes_use_https_on_8443_with_the_servers_paths() -> None:
    objs = render_variant("webhook")
    container = _container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    routes = _server_routes()
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["scheme"] == "HTTPS"
        assert ports.get(get["port"], get["port"]) == 8443
        assert (path, "GET") in routes


def test_the_webhooks_token_may_only_read_claims_templates_device_classes_and_pods() -> None:
    """--resolve-claims needs a token: it GETs the ResourceClaims and templates a pod references,
    lists and watches DeviceClasses (their extended-resource names are GPU asks), and gets and lists
    pods (a new claim is judged with the pods it serves); it writes nothing and reads nothing else.
    Other pods of the account get no token."""
    objs = render_variant("webhook")
    account = one(objs, "ServiceAccount", "gpugate-webhook")
    assert account["automountServiceAccountToken"] is False
    pod = _deployment(objs)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpugate-webhook" and pod["automountServiceAccountToken"] is True
    assert "--resolve-claims" in _container(objs)["args"]
    bindings = [b for b in objs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and any(s.get("name") == "gpugate-webhook" and s["kind"] == "ServiceAccount" for s in b["subjects"])]
    assert [(b["kind"], b["roleRef"]["name"]) for b in bindings] == [("ClusterRoleBinding", "gpugate-webhook-claims")]
    assert bindings[0]["subjects"][0]["namespace"] == account["metadata"]["namespace"]
    rules = one(objs, "ClusterRole", "gpugate-webhook-claims")["rules"]
    reads = {("resource.k8s.io", "resourceclaims"): {"get"}, ("resource.k8s.io", "resourceclaimtemplates"): {"get"},
             ("resource.k8s.io", "deviceclasses"): {"list", "watch"}, ("", "pods"): {"get", "list"}}
    for (group, resource), verbs in reads.items():
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
            granted = rule_allows(rules, verb=verb, group=group, resource=resource,
                                  name="x" if verb in ("get", "update", "patch", "delete") else None)
            assert granted is (verb in verbs), (group, resource, verb)
    for group, resource in (("", "secrets"), ("resource.k8s.io", "resourceslices"), ("", "pods/status")):
        assert not rule_allows(rules, verb="get", group=group, resource=resource, name="x")


def test_priority_class_is_shipped_and_below_the_system_classes() -> None:
    objs = render_variant("webhook")
    name = _deployment(objs)["spec"]["template"]["spec"]["priorityClassName"]
    priority_class = one(objs, "PriorityClass", name)
    assert 0 < priority_class["value"] < 1_000_000_000  # user classes must stay below system ones
    assert priority_class.get("globalDefault") is not True


def test_writable_paths_are_empty_dirs_and_the_root_is_read_only() -> None:
    objs = render_variant("webhook")
    pod = _deployment(objs)["spec"]["template"]["spec"]
    container = _container(objs)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    state_dir = arg_value(container, "--state-dir")
    assert state_dir is None or state_dir.startswith("/tmp/")
    for path, mount in mounts.items():
        if path != "/tmp":
            assert mount.get("readOnly") is True, f"{path} should be mounted read-only"


def test_network_policy_admits_only_8443_and_metrics_from_monitoring() -> None:
    objs = render_variant("webhook")
    policy = one(objs, "NetworkPolicy", "gpugate-webhook")
    labels = _deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    metrics_port = int(arg_value(_container(objs), "--metrics-bind").rpartition(":")[2])
    open_ports = set()
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        if "from" not in rule:
            assert ports == {8443}, "only the TLS port may be open to every source"
        else:
            assert ports == {metrics_port}
            assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}}]
        open_ports |= ports
    assert open_ports == {8443, metrics_port}


# --- the policies ConfigMap ---------------------------------------------------------------------------

def _policy_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(POLICIES.glob("*.yaml")) if p.name != "kustomization.yaml"}


def test_policy_configmap_holds_every_policy_file() -> None:
    objs = render_variant("webhook")
    [config_map] = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].startswith("gpugate-policies-")]
    files = _policy_files()
    assert files, "policies/ holds no policy file"
    assert config_map["data"] == files
    assert config_map["metadata"]["namespace"] == NAMESPACE


def test_policies_are_mounted_where_the_server_reads_them() -> None:
    objs = render_variant("webhook")
    [config_map] = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].startswith("gpugate-policies-")]
    volumes = {v["name"]: v for v in _deployment(objs)["spec"]["template"]["spec"]["volumes"]}
    volume = next(v for v in volumes.values() if v.get("configMap", {}).get("name", "").startswith("gpugate-policies"))
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]  # the hashed name: a change rolls
    mount = next(m for m in _container(objs)["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == "/etc/gpugate/policies"
    assert arg_value(_container(objs), "--policies") == "/etc/gpugate/policies"
    assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates


def test_a_policy_change_renames_the_configmap_and_rolls_the_deployment(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(MANIFESTS / "webhook", copy / "manifests/webhook")
    shutil.copytree(POLICIES, copy / "policies")
    before = manifestcheck.kustomize(copy / "manifests/webhook")
    first = sorted(_policy_files())[0]
    (copy / "policies" / first).write_text((POLICIES / first).read_text() + "\n# edited\n")
    after = manifestcheck.kustomize(copy / "manifests/webhook")

    def names(objs):
        config_map = next(o for o in objs if o["metadata"]["name"].startswith("gpugate-policies-"))
        volume = next(v for v in one(objs, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]["volumes"]
                      if "configMap" in v)
        return config_map["metadata"]["name"], volume["configMap"]["name"]

    (cm_before, vol_before), (cm_after, vol_after) = names(before), names(after)
    assert cm_before == vol_before and cm_after == vol_after
    assert cm_before != cm_after


# --- namespace ------------------------------------------------------------------------------------------

def test_namespace_is_skipped_and_enforces_restricted_pod_security() -> None:
    namespace = one(render_variant("webhook"), "Namespace", NAMESPACE)
    labels = namespace["metadata"]["labels"]
    assert labels["gpugate.io/skip"] == "true"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # The standard as the target cluster's minor defines it (stack.yaml cluster.kubernetesVersion).
    assert labels["pod-security.kubernetes.io/enforce-version"] == f"v{KUBERNETES_VERSION}"


def test_validation_update_decision_is_written_down() -> None:
    text = (MANIFESTS / "webhook/webhookconfigurations.yaml").read_text()
    assert "UPDATE" in text and "immutable" in text



def test_pods_keep_serving_while_their_endpoint_is_withdrawn() -> None:
    objs = render_variant("webhook")
    pod = _deployment(objs)["spec"]["template"]["spec"]
    sleep = _container(objs)["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep >= 3
    args = dict(a.removeprefix("--").split("=", 1) for a in _container(objs)["args"] if "=" in a)
    graceful = serving.GRACEFUL_TIMEOUT
    # preStop, then the drain, then gunicorn's graceful stop: all of it before the kubelet's SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > sleep + float(args["drain-seconds"]) + graceful
    assert float(args["request-timeout"]) <= 10
    assert _deployment(objs)["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
