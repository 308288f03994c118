"""manifests/scheduler: the gpugate-binpack profile, its Deployment and the upstream RBAC."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.kubeversion import KUBERNETES_MINOR
from tests.manifests.helpers import KUBERNETES_VERSION, NAMESPACE, arg_value, find, one, render_variant
from webhook.localcluster import binaries
from webhook.names import EXTENDER_SCHEDULER_NAME, GPU_RESOURCE

# KubeSchedulerConfiguration v1 top-level fields (kubescheduler.config.k8s.io/v1 reference).
CONFIG_FIELDS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                 "healthzBindAddress", "metricsBindAddress", "enableProfiling", "enableContentionProfiling",
                 "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles",
                 "extenders", "delayCacheUntilActive"}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
SCORING_TYPES = {"LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"}
LEADER_FIELDS = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
                 "resourceNamespace"}


def _config() -> tuple[dict, dict, dict]:
    objs = render_variant("scheduler")
    deployment = one(objs, "Deployment", "gpugate-scheduler")
    [config_map] = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].startswith("gpugate-scheduler-config")]
    [key] = config_map["data"]
    return yaml.safe_load(config_map["data"][key]), config_map, deployment


def test_config_is_a_v1_kube_scheduler_configuration_with_known_fields() -> None:
    config, _, _ = _config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= CONFIG_FIELDS, set(config) - CONFIG_FIELDS
    assert set(config["leaderElection"]) <= LEADER_FIELDS
    for profile in config["profiles"]:
        assert set(profile) <= PROFILE_FIELDS, set(profile) - PROFILE_FIELDS
        for entry in profile.get("pluginConfig", []):
            assert set(entry) == {"name", "args"}
    assert 0 <= config.get("percentageOfNodesToScore", 0) <= 100


def test_the_profiles_are_gpugate_binpack_and_the_extenders_default_profile() -> None:
    """``gpugate``: kube-scheduler's defaults (no plugins, no pluginConfig) plus the extender, the
    profile the replay's extender arm models under the same name."""
    config, _, _ = _config()
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpugate-binpack", EXTENDER_SCHEDULER_NAME]
    assert config["profiles"][1] == {"schedulerName": EXTENDER_SCHEDULER_NAME}


def test_binpack_scores_most_allocated_with_gpu_weighted_above_cpu_and_memory() -> None:
    config, _, _ = _config()
    [profile] = [p for p in config["profiles"] if p["schedulerName"] == "gpugate-binpack"]
    [fit] = [c["args"] for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    strategy = fit["scoringStrategy"]
    assert strategy["type"] == "MostAllocated" and strategy["type"] in SCORING_TYPES
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert all(isinstance(w, int) and 1 <= w <= 100 for w in weights.values())  # the API's range
    assert weights[GPU_RESOURCE] > weights["cpu"] and weights[GPU_RESOURCE] > weights["memory"]
    disabled = {p["name"] for p in (profile.get("plugins", {}).get("score", {}).get("disabled", []))}
    assert "NodeResourcesFit" not in disabled and "*" not in disabled


def test_deployment_reads_the_config_from_the_generated_configmap() -> None:
    config, config_map, deployment = _config()
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    path = Path(arg_value(container, "--config"))
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert path.name in config_map["data"]
    assert pod["serviceAccountName"] == "gpugate-scheduler"
    assert container["livenessProbe"]["httpGet"]["port"] == 10259
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_image_is_kube_scheduler_pinned_to_the_clusters_minor() -> None:
    """The Kubernetes version skew policy (https://kubernetes.io/releases/version-skew-policy/, "kube-controller-
    manager, kube-scheduler, and cloud-controller-manager"): kube-scheduler must not be newer than kube-apiserver
    and may be at most one minor older. gpugate keeps it at the cluster's own minor (stack.yaml
    cluster.kubernetesVersion), at the release the e2e control plane builds and runs it as
    (webhook/localcluster/toolchain/kubernetes/go.mod), so the e2e tests judge the scheduler that ships."""
    _, _, deployment = _config()
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    match = re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v(\d+)\.(\d+)\.(\d+)", image)
    assert match, image
    major, minor = int(match[1]), int(match[2])
    assert major == 1 and KUBERNETES_MINOR - 1 <= minor <= KUBERNETES_MINOR, (
        f"{image} is outside the version skew policy for a {KUBERNETES_VERSION} API server")
    assert f"{major}.{minor}" == KUBERNETES_VERSION, f"{image}: keep the scheduler at the cluster's minor"
    assert image.rpartition(":")[2] == binaries.version(binaries.KUBERNETES), (
        "the shipped kube-scheduler and the one the e2e tests build differ")


def _binding(objs, kind: str, role: str) -> dict:
    [binding] = [o for o in find(objs, kind) if o["roleRef"]["name"] == role]
    return binding


@pytest.mark.parametrize("role", ["system:kube-scheduler", "system:volume-scheduler"])
def test_cluster_role_bindings_to_the_built_in_scheduler_roles(role: str) -> None:
    objs = render_variant("scheduler")
    binding = _binding(objs, "ClusterRoleBinding", role)
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpugate-scheduler", "namespace": NAMESPACE}]


def test_authentication_reader_role_binding_lives_in_kube_system() -> None:
    objs = render_variant("scheduler")
    binding = _binding(objs, "RoleBinding", "extension-apiserver-authentication-reader")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpugate-scheduler", "namespace": NAMESPACE}]


def test_leader_election_lease_is_granted_where_the_config_puts_it() -> None:
    config, _, _ = _config()
    election = config["leaderElection"]
    assert election["leaderElect"] is True and election.get("resourceLock", "leases") == "leases"
    objs = render_variant("scheduler")
    [role] = [r for r in find(objs, "Role") if r["metadata"]["namespace"] == election["resourceNamespace"]]
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [election["resourceName"]], "verbs": ["get", "update"]}]
    binding = _binding(objs, "RoleBinding", role["metadata"]["name"])
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["subjects"][0]["name"] == "gpugate-scheduler"


# --- the balancer's extender ---------------------------------------------------------------

EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                   "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}


def test_the_scheduler_calls_the_balancers_extender_to_prioritize_only() -> None:
    from webhook.balancer.settings import ExtenderServing
    from webhook.placement.scoring import RECOMMENDED_WEIGHT

    config, _, _ = _config()
    [extender] = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS, set(extender) - EXTENDER_FIELDS
    assert extender["prioritizeVerb"] == "prioritize"
    assert not {"filterVerb", "bindVerb", "preemptVerb"} & set(extender)  # it scores; it never filters or binds
    assert extender["weight"] == RECOMMENDED_WEIGHT
    assert extender["nodeCacheCapable"] is True  # names in: the balancer keeps its own node cache
    assert extender["ignorable"] is True
    assert re.fullmatch(r"[0-9]+(ms|s)", extender["httpTimeout"])
    # The balancer's Service, its extender port, and the path the balancer serves.
    balancer = render_variant("balancer")
    service = one(balancer, "Service", "gpugate-balancer")
    port = next(p for p in service["spec"]["ports"] if p["name"] == "extender")
    assert extender["urlPrefix"] == (f"https://gpugate-balancer.{NAMESPACE}.svc:{port['port']}"
                                     f"{ExtenderServing().path}")
    container = one(balancer, "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == int(arg_value(container, "--extender-bind").rpartition(":")[2])


def test_the_extenders_ca_is_the_balancers_certificate_secret_mounted_alone() -> None:
    config, _, deployment = _config()
    [extender] = config["extenders"]
    assert extender["enableHTTPS"] is True and "insecure" not in extender["tlsConfig"]
    ca_file = extender["tlsConfig"]["caFile"]
    pod = deployment["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if ca_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": ca_file[len(mount["mountPath"]) + 1:]}]
    assert not volume["secret"].get("optional"), "kube-scheduler refuses to start without the CA file"
    # The Secret is the one the balancer's certificate Job writes, for the Service the urlPrefix names.
    balancer = render_variant("balancer")
    job = one(balancer, "Job", "gpugate-balancer-certs")["spec"]["template"]["spec"]["containers"][0]
    assert arg_value(job, "--secret") == f"{NAMESPACE}/{volume['secret']['secretName']}"
    host = f"{arg_value(job, '--service')}.{arg_value(job, '--namespace')}.svc"
    assert extender["urlPrefix"].startswith(f"https://{host}:")
    balancer_pod = one(balancer, "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]
    secret = volume["secret"]["secretName"]
    [tls] = [v for v in balancer_pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
    tls_mount = next(m for m in balancer_pod["containers"][0]["volumeMounts"] if m["name"] == tls["name"])
    assert arg_value(balancer_pod["containers"][0], "--extender-cert") == f"{tls_mount['mountPath']}/tls.crt"
    assert arg_value(balancer_pod["containers"][0], "--extender-key") == f"{tls_mount['mountPath']}/tls.key"
