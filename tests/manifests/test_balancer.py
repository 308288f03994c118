"""manifests/balancer: two replicas, leader election, and RBAC that grants exactly must 3."""

from __future__ import annotations

from tests.manifests.helpers import NAMESPACE, arg_value, find, one, render_variant, rule_allows

RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def _grants(rules: list[dict]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Flatten rules into (group, resource, verb, resourceNames) tuples."""
    return {(group, resource, verb, tuple(rule.get("resourceNames") or ()))
            for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_balancer_rbac_grants_exactly_nodes_pods_and_its_lease() -> None:
    objs = render_variant("balancer")
    cluster_role = one(objs, "ClusterRole", "gpugate-balancer")
    assert _grants(cluster_role["rules"]) == {
        ("", "nodes", "get", ()), ("", "nodes", "list", ()), ("", "nodes", "watch", ()), ("", "nodes", "patch", ()),
        ("", "pods", "list", ()), ("", "pods", "watch", ()),
    }
    role = one(objs, "Role", "gpugate-balancer")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _grants(role["rules"]) == {
        ("coordination.k8s.io", "leases", "get", ()), ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "update", ()),
    }
    # ...and nothing else: no other role or binding in the balancer's render.
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in RBAC_KINDS) == [
        ("ClusterRole", "gpugate-balancer"), ("ClusterRoleBinding", "gpugate-balancer"),
        ("Role", "gpugate-balancer"), ("RoleBinding", "gpugate-balancer"),
    ]


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


def test_balancer_cannot_touch_secrets_or_delete_pods() -> None:
    objs = render_variant("balancer")
    rules = one(objs, "ClusterRole", "gpugate-balancer")["rules"] + one(objs, "Role", "gpugate-balancer")["rules"]
    assert rule_allows(rules, verb="patch", group="", resource="nodes", name="gpu-1")
    for verb, resource in (("get", "secrets"), ("delete", "pods"), ("patch", "pods"), ("create", "pods"),
                           ("update", "nodes"), ("delete", "leases")):
        group = "coordination.k8s.io" if resource == "leases" else ""
        assert not rule_allows(rules, verb=verb, group=group, resource=resource, name=None), (verb, resource)


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
        assert named.get(target, target) == port and container[probe]["httpGet"]["path"] == "/healthz"
    service = one(objs, "Service", "gpugate-balancer")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert not find(objs, "Namespace"), "the namespace belongs to manifests/webhook"
