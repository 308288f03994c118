"""The optional audit component: one writer that judges by the very ConfigMap the webhook mounts."""

from __future__ import annotations

from tests.manifests.helpers import render_variant


def test_the_audit_mounts_the_webhooks_policies_and_may_only_read_and_report() -> None:
    rendered = render_variant("webhook+builtin-tls+audit")
    by = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    audit_pod = by[("Deployment", "gpugate-audit")]["spec"]["template"]["spec"]
    webhook_pod = by[("Deployment", "gpugate-webhook")]["spec"]["template"]["spec"]
    mounted = {v["name"]: v for v in audit_pod["volumes"]}["policies"]["configMap"]["name"]
    assert mounted == {v["name"]: v for v in webhook_pod["volumes"]}["policies"]["configMap"]["name"]
    assert mounted.startswith("gpugate-policies-")  # the generated, hashed name: a policy commit rolls it
    container = audit_pod["containers"][0]
    assert container["command"] == ["gpugate", "audit"] and "--write-reports" in container["args"]
    rules = by[("ClusterRole", "gpugate-audit")]["rules"]
    writes = {verb for rule in rules for verb in rule["verbs"] if verb not in ("get", "list", "watch")}
    assert all(rule["apiGroups"] == ["wgpolicyk8s.io"] for rule in rules if set(rule["verbs"]) & writes)
    assert by[("CustomResourceDefinition", "policyreports.wgpolicyk8s.io")]["spec"]["group"] == "wgpolicyk8s.io"
