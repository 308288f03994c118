"""What a pod became, as `gpugate smoke` and `gpugate demo` report it."""

from __future__ import annotations

import json

from webhook.server import outcome


def _pod(**extra) -> dict:
    return {"metadata": {"name": "train-0", "annotations": {"gpugate.io/policy": "training@abc"}},
            "spec": {"nodeName": "h100-a", "containers": [
                {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}},
                {"name": "side", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
            "status": {"phase": "Running"}, **extra}


def test_an_admitted_pod_names_its_policy_its_gpu_asks_and_its_node() -> None:
    got = outcome.admitted(_pod(), namespace="ml")
    assert got == outcome.Outcome(name="train-0", namespace="ml", policy="training@abc",
                                  gpus=(("nvidia.com/gpu", 4), ("nvidia.com/mig-1g.10gb", 1)), node="h100-a",
                                  phase="Running")
    assert got.shaped and got.asks() == "nvidia.com/gpu: 4, nvidia.com/mig-1g.10gb: 1"


def test_an_unshaped_pod_without_gpus_says_so() -> None:
    got = outcome.admitted({"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "c"}]}},
                           namespace="web")
    assert not got.shaped and got.asks() == "-" and got.node is None


def test_only_gpugates_own_webhooks_count_as_its_denials() -> None:
    ours = 'admission webhook "validate.gpugate.io" denied the request: container asks nvidia.com/gpu'
    rbac = 'pods is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods"'
    other = 'admission webhook "validate.kyverno.svc" denied the request: no'
    assert outcome.by_gpugate(ours) and not outcome.by_gpugate(rbac) and not outcome.by_gpugate(other)


def test_the_denial_message_is_the_status_message_or_the_body() -> None:
    assert outcome.denial_text(json.dumps({"kind": "Status", "message": " no GPUs here "})) == "no GPUs here"
    assert outcome.denial_text("plain text\n") == "plain text"


def test_the_table_lines_up_and_keeps_a_denial_whole() -> None:
    message = 'admission webhook "validate.gpugate.io" denied the request: ' + "x" * 150
    text = outcome.table([("training", outcome.admitted(_pod(), namespace="ml")),
                          ("web", outcome.refused("shop-", namespace="web-shop", message=message)),
                          ("pending", outcome.Outcome(name="p", namespace="ml", policy="a@b"))])
    lines = text.splitlines()
    assert lines[0].split() == ["POD", "NAMESPACE", "ASKED", "POLICY", "BECAME", "NODE"]
    assert lines[1].endswith("  h100-a") and "training@abc" in lines[1]
    assert lines[2].endswith(message) and "DENIED" in lines[2]
    assert lines[3].endswith("(not scheduled: Pending)")
    starts = {line.index(word) for line, word in zip(lines[1:], ("ml", "web-shop", "ml"), strict=True)}
    assert len(starts) == 1, "the namespace column starts at one place"
