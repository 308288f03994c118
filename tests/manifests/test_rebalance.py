"""manifests/balancer/components/rebalance: the rebalancer's extra RBAC, its settings and the policies it reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.manifests.helpers import find, one, render_variant, rule_allows
from webhook.balancer.settings import BalancerSettings

COMPONENT = Path(__file__).resolve().parents[2] / "manifests" / "balancer" / "components" / "rebalance"


def test_the_rebalancer_may_evict_and_tolerate_but_never_delete_or_create_pods() -> None:
    objs = render_variant("webhook+balancer+rebalance")
    rules = one(objs, "ClusterRole", "gpugate-balancer-rebalance")["rules"]
    assert {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]} \
        == {("policy", "poddisruptionbudgets", "list"), ("policy", "poddisruptionbudgets", "watch"),
            ("", "pods/eviction", "create"), ("", "pods", "patch"), ("", "events", "create"), ("", "events", "list")}
    for verb, resource in (("delete", "pods"), ("create", "pods"), ("update", "pods"), ("delete", "events")):
        assert not rule_allows(rules, verb=verb, group="", resource=resource, name="x"), (verb, resource)
    binding = one(objs, "ClusterRoleBinding", "gpugate-balancer-rebalance")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpugate-balancer", "namespace": "gpugate-system"}]


def test_the_balancer_reads_the_rebalance_settings_and_the_webhooks_policies() -> None:
    objs = render_variant("webhook+balancer+rebalance")
    deployment = one(objs, "Deployment", "gpugate-balancer")
    pod = deployment["spec"]["template"]["spec"]
    assert "--config=/etc/gpugate/balancer/config.yaml" in pod["containers"][0]["args"]
    volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    policies = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].startswith("gpugate-policies")]
    # The same generated (hash-suffixed) ConfigMap the webhook mounts: one policy folder for both.
    assert [volumes["policies"]] == [p["metadata"]["name"] for p in policies]
    config = next(o for o in find(objs, "ConfigMap") if o["metadata"]["name"] == volumes["rebalance-config"])
    settings = BalancerSettings.from_dict(yaml.safe_load(config["data"]["config.yaml"]))
    assert settings.rebalance.enabled and settings.rebalance.policies == "/etc/gpugate/policies"
    assert settings.rebalance.budget_percent == 2 and not settings.rebalance.dry_run


def test_the_shipped_config_file_is_what_the_component_mounts() -> None:
    text = (COMPONENT / "rebalance-config.yaml").read_text()
    assert BalancerSettings.from_dict(yaml.safe_load(text)).rebalance.enabled
