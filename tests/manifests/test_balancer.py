"""manifests/balancer: two replicas, leader election, RBAC that grants exactly must 3 (its own Lease by
name), a disruption budget, a priority class and a readiness that waits for the caches."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.manifests.helpers import NAMESPACE, arg_value, find, one, render_variant, rule_allows
from webhook.stack import matrix

ROOT = Path(__file__).resolve().parents[2]

RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def _grants(rules: list[dict]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Flatten rules into (group, resource, verb, resourceNames) tuples."""
    return {(group, resource, verb, tuple(rule.get("resourceNames") or ()))
            for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_balancer_rbac_grants_exactly_nodes_pods_priority_classes_claim_templates_its_lease_inventory_and_health(
) -> None:
    objs = render_variant("balancer")
    cluster_role = one(objs, "ClusterRole", "gpugate-balancer")
    assert _grants(cluster_role["rules"]) == {
        ("", "nodes", "get", ()), ("", "nodes", "list", ()), ("", "nodes", "watch", ()), ("", "nodes", "patch", ()),
        ("", "pods", "list", ()), ("", "pods", "watch", ()),
        ("scheduling.k8s.io", "priorityclasses", "list", ()), ("scheduling.k8s.io", "priorityclasses", "watch", ()),
        # DRA: read only, the two kinds the counting reads.
        *{("resource.k8s.io", resource, verb, ()) for resource in ("resourceslices", "resourceclaims")
          for verb in ("get", "list", "watch")},
        # Right-sizing through DRA: the template a right-sized pod names, create only.
        ("resource.k8s.io", "resourceclaimtemplates", "create", ()),
        # GPU health quarantine: its DeviceTaintRules, Events on Nodes, the Eviction API.
        *{("resource.k8s.io", "devicetaintrules", verb, ()) for verb in ("list", "create", "update", "delete")},
        ("", "events", "create", ()), ("", "pods/eviction", "create", ()),
        # Idle allocations: the annotation where a policy says annotate.
        ("", "pods", "patch", ()),
    }
    role = one(objs, "Role", "gpugate-balancer")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _grants(role["rules"]) == {
        ("coordination.k8s.io", "leases", "get", ("gpugate-balancer",)),
        ("coordination.k8s.io", "leases", "update", ("gpugate-balancer",)),
        ("coordination.k8s.io", "leases", "create", ()),  # a create names no object when authorized
        ("", "configmaps", "get", ("gpugate-inventory", "gpugate-health")),
        ("", "configmaps", "update", ("gpugate-inventory", "gpugate-health")),
        ("", "configmaps", "create", ()),
        # GPU health: validation pods and the claims pinning their GPU, in its own namespace.
        ("", "pods", "create", ()), ("", "pods", "delete", ()),
        ("resource.k8s.io", "resourceclaims", "create", ()), ("resource.k8s.io", "resourceclaims", "delete", ()),
    }
    # ...and nothing else: no other role or binding in the balancer's render.
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in RBAC_KINDS) == [
        ("ClusterRole", "gpugate-balancer"), ("ClusterRoleBinding", "gpugate-balancer"),
        ("Role", "gpugate-balancer"), ("Role", "gpugate-balancer-certs"),
        ("RoleBinding", "gpugate-balancer"), ("RoleBinding", "gpugate-balancer-certs"),
    ]
    # The certificate Job's own account may touch its one Secret (and create it), nothing else.
    certs = one(objs, "Role", "gpugate-balancer-certs")
    assert _grants(certs["rules"]) == {
        ("", "secrets", "get", ("gpugate-balancer-tls",)), ("", "secrets", "update", ("gpugate-balancer-tls",)),
        ("", "secrets", "patch", ("gpugate-balancer-tls",)), ("", "secrets", "create", ()),
    }


def test_balancer_bindings_give_those_rules_to_its_service_account_only() -> None:
    objs = render_variant("balancer")
    account = one(objs, "ServiceAccount", "gpugate-balancer")
    subject = {"kind": "ServiceAccount", "name": "gpugate-balancer", "namespace": account["metadata"]["namespace"]}
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(objs, kind, "gpugate-balancer")
        assert binding["subjects"] == [subject]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                      "name": "gpugate-balancer"}
    role_binding = one(objs, "RoleBinding", "gpugate-balancer")
    assert role_binding["metadata"]["namespace"] == one(objs, "Role", "gpugate-balancer")["metadata"]["namespace"]


def test_balancer_cannot_touch_secrets_or_delete_pods_outside_its_namespace() -> None:
    objs = render_variant("balancer")
    cluster_rules = one(objs, "ClusterRole", "gpugate-balancer")["rules"]
    rules = cluster_rules + one(objs, "Role", "gpugate-balancer")["rules"]
    assert rule_allows(rules, verb="patch", group="", resource="nodes", name="gpu-1")
    # It may patch a pod (the idle annotation, where a policy says annotate) and evict one through the
    # Eviction API, never update one; deleting and creating pods is checked per namespace below.
    for verb, resource in (("get", "secrets"), ("update", "pods"),
                           ("update", "nodes"), ("delete", "leases"), ("update", "resourceclaims"),
                           ("create", "resourceslices"), ("list", "deviceclasses")):
        group = {"leases": "coordination.k8s.io", "resourceclaims": "resource.k8s.io", "resourceslices":
                 "resource.k8s.io", "deviceclasses": "resource.k8s.io"}.get(resource, "")
        assert not rule_allows(rules, verb=verb, group=group, resource=resource, name=None), (verb, resource)
    # Pods and claims it makes and deletes (GPU validation) only in its own namespace: the Role's, not the
    # ClusterRole's.
    for verb, group, resource in (("delete", "", "pods"), ("create", "", "pods"),
                                  ("delete", "resource.k8s.io", "resourceclaims")):
        assert not rule_allows(cluster_rules, verb=verb, group=group, resource=resource, name=None), (verb, resource)
    assert one(objs, "Role", "gpugate-balancer")["metadata"]["namespace"] == NAMESPACE


def test_balancer_deployment_runs_two_replicas_with_leader_election_inputs() -> None:
    objs = render_variant("balancer")
    deployment = one(objs, "Deployment", "gpugate-balancer")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpugate-balancer"
    [container] = pod["containers"]
    assert container["command"] == ["gpugate", "balance"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name"  # the lease identity
    assert env["POD_NAMESPACE"] == "metadata.namespace"  # the lease lives in the Role's namespace
    health = arg_value(container, "--health-bind")
    port = int(health.rpartition(":")[2])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        target = container[probe]["httpGet"]["port"]
        assert named.get(target, target) == port
    service = one(objs, "Service", "gpugate-balancer")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert not find(objs, "Namespace"), "the namespace belongs to manifests/webhook"


def test_balancer_may_read_and_renew_only_the_lease_its_deployment_names() -> None:
    objs = render_variant("balancer")
    container = one(objs, "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]["containers"][0]
    lease = arg_value(container, "--lease-name")
    rules = one(objs, "Role", "gpugate-balancer")["rules"]
    for verb in ("get", "update"):
        assert rule_allows(rules, verb=verb, group="coordination.k8s.io", resource="leases", name=lease)
        assert not rule_allows(rules, verb=verb, group="coordination.k8s.io", resource="leases",
                               name="kube-controller-manager"), verb
    assert rule_allows(rules, verb="create", group="coordination.k8s.io", resource="leases", name=None)
    assert not rule_allows(rules, verb="delete", group="coordination.k8s.io", resource="leases", name=lease)


def test_balancer_disruption_budget_keeps_one_replica_and_covers_only_the_balancer() -> None:
    objs = render_variant("all")
    budget = one(objs, "PodDisruptionBudget", "gpugate-balancer")
    deployment = one(objs, "Deployment", "gpugate-balancer")
    assert budget["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert budget["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # an unsynced replica never blocks a drain
    chosen = budget["spec"]["selector"]["matchLabels"].items()
    matching = [f"{o['kind']}/{o['metadata']['name']}" for o in objs
                if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
                and chosen <= o["spec"]["template"]["metadata"].get("labels", {}).items()]
    assert matching == ["Deployment/gpugate-balancer"]


def test_balancer_priority_class_is_shipped_below_the_webhook_and_the_system_classes() -> None:
    objs = render_variant("all")
    name = one(objs, "Deployment", "gpugate-balancer")["spec"]["template"]["spec"]["priorityClassName"]
    assert find(render_variant("balancer"), "PriorityClass", name), "the balancer ships its own class"
    balancer = one(objs, "PriorityClass", name)
    webhook_class = one(objs, "Deployment", "gpugate-webhook")["spec"]["template"]["spec"]["priorityClassName"]
    assert 0 < balancer["value"] < one(objs, "PriorityClass", webhook_class)["value"] < 1_000_000_000
    assert balancer.get("globalDefault") is not True


def test_balancer_is_ready_only_once_its_caches_synced_and_alive_while_its_loop_turns() -> None:
    container = one(render_variant("balancer"), "Deployment", "gpugate-balancer")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_inventory_the_balancer_may_write_is_the_configmap_and_file_the_webhook_reads() -> None:
    from webhook.balancer.settings import InventorySettings

    objs = render_variant("all")
    balancer = one(objs, "Deployment", "gpugate-balancer")
    webhook = one(objs, "Deployment", "gpugate-webhook")
    assert balancer["metadata"]["namespace"] == webhook["metadata"]["namespace"]  # $POD_NAMESPACE is the webhook's
    defaults = InventorySettings()
    pod = webhook["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == defaults.name)
    assert volume["configMap"]["optional"] is True  # the webhook starts before the first inventory
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert arg_value(pod["containers"][0], "--inventory") == f"{mount['mountPath']}/{defaults.key}"
    rules = one(objs, "Role", "gpugate-balancer")["rules"]
    for verb in ("get", "update"):
        assert rule_allows(rules, verb=verb, group="", resource="configmaps", name=defaults.name)
        assert not rule_allows(rules, verb=verb, group="", resource="configmaps", name="gpugate-policies"), verb
    assert not rule_allows(rules, verb="list", group="", resource="configmaps", name=None)
    assert not rule_allows(rules, verb="delete", group="", resource="configmaps", name=defaults.name)


def _device_plugin_policies() -> dict[str, str]:
    """Each device plugin config that shares GPUs -> its sharedDevicesAllocationPolicy (the device
    plugin's default, distributed, when unset: cmd/nvidia-device-plugin/main.go at v0.20.0)."""
    values = yaml.safe_load((ROOT / "manifests" / "gpu-operator" / "values.yaml").read_text(encoding="utf-8"))
    found = {}
    for name, text in values["devicePlugin"]["config"]["data"].items():
        config = yaml.safe_load(text)
        if config.get("sharing"):
            plugin = (config.get("flags") or {}).get("plugin") or {}
            found[name] = plugin.get("sharedDevicesAllocationPolicy", "distributed")
    return found


def test_the_extender_models_the_allocation_policy_the_device_plugin_runs() -> None:
    """The extender cannot see which GPU a time-sliced share got (the device plugin picks it at
    Allocate); it models the policy it is told. Told another than the cluster runs, its measure
    would count the shares on the wrong GPUs: one policy for every sharing config, and the same
    on the balancer's command line."""
    policies = _device_plugin_policies()
    assert policies, "no device plugin config shares GPUs: the notebooks policy's gpu.shared is never offered"
    assert len(set(policies.values())) == 1, policies
    [container] = one(render_variant("balancer"), "Deployment", "gpugate-balancer")["spec"]["template"]["spec"][
        "containers"]
    assert arg_value(container, "--extender-device-policy") == next(iter(policies.values()))


def test_the_pinned_device_plugin_knows_the_allocation_policy_key() -> None:
    """flags.plugin.sharedDevicesAllocationPolicy exists from k8s-device-plugin v0.20.0
    (api/config/v1/flags.go); the device plugin the pinned GPU Operator release runs (matrix
    defaults, or a stack.yaml override) must be at least that when a config sets it."""
    stack = yaml.safe_load((ROOT / "manifests" / "gpu-operator" / "stack.yaml").read_text(encoding="utf-8"))
    release = matrix.load().release(stack["operator"]["version"])
    version = (stack.get("components") or {}).get("devicePlugin") or release.defaults["devicePlugin"]
    numbers = tuple(int(part) for part in version.lstrip("v").split("-")[0].split("."))
    if any(policy != "distributed" for policy in _device_plugin_policies().values()):
        assert numbers >= (0, 20, 0), f"device plugin {version} has no sharedDevicesAllocationPolicy"
