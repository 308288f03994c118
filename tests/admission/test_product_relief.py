"""Product relief: a GPU pod free to run on any GPU product stays off the products that
pods pinned to a product need most, as the balancer's GPUInventory reports them (typePressure).

Why: packing sends such pods to the tightest node, and the tightest nodes of the openb trace are
the 2-GPU T4 nodes that pinned pods need; the starter policies fell 6 points below the stock
scheduler on the gpuspec lists for that alone (docs/placement.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jsonpatch
import pytest

from tests.policy.kit import container, load, pod, policy
from webhook import names
from webhook.admission import mutation, preferences
from webhook.kube import claims
from webhook.kube import inventory as kube_inventory
from webhook.kube.inventory import Inventory

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PACK = load(policy("train", """
match: {namespaces: ["ml-*"]}
gpu: {resource: nvidia.com/gpu, default: 1}
placement: {strategy: pack}
"""))
SPREAD = load(policy("serve", """
match: {namespaces: ["ml-*"]}
gpu: {resource: nvidia.com/gpu, default: 1}
placement: {strategy: spread}
"""))
PRESSURE = (("ALIBABA-G2", 0.0), ("ALIBABA-G3", 0.2), ("Tesla-P100-PCIE-16GB", 0.6), ("Tesla-T4", 1.5),
            ("Tesla-V100-SXM2-16GB", 0.4))


def published(age: float = 0.0, pressure: tuple[tuple[str, float], ...] = PRESSURE) -> Inventory:
    return Inventory(generated_at=NOW - timedelta(seconds=age), type_pressure=pressure)


def preferred(p: dict, inventory: Inventory, policies=PACK) -> list[dict]:
    result = mutation.mutate(p, namespace="ml-a", policies=policies, inventory=inventory, now=NOW)
    shaped = jsonpatch.apply_patch(p, list(result.patch))
    return shaped["spec"].get("affinity", {}).get("nodeAffinity", {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution", [])


def relief(terms: list[dict]) -> list[dict]:
    return [t for t in terms if t["preference"]["matchExpressions"][0]["key"] == names.NVIDIA_PRODUCT_LABEL]


def test_an_unpinned_gpu_pod_under_pack_stays_off_the_pressured_products() -> None:
    terms = preferred(pod(container(gpus=1)), published())
    assert relief(terms) == [{"weight": preferences.PRODUCT_RELIEF_WEIGHT, "preference": {"matchExpressions": [
        {"key": names.NVIDIA_PRODUCT_LABEL, "operator": "NotIn",
         "values": ["Tesla-P100-PCIE-16GB", "Tesla-T4", "Tesla-V100-SXM2-16GB"]}]}}]
    # ...as much as the whole pack ladder, so an empty node of another product beats a tight pressured one.
    pack = [t["weight"] for t in terms if t not in relief(terms)]
    assert preferences.PRODUCT_RELIEF_WEIGHT >= sum(pack) - min(pack)


def test_a_share_is_relieved_too() -> None:
    assert relief(preferred(pod(container(gpus=1, resource=names.SHARED_GPU_RESOURCE)), published()))


@pytest.mark.parametrize("pinned", [
    {"nodeSelector": {names.NVIDIA_PRODUCT_LABEL: "Tesla-T4"}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": ["Tesla-T4"]}]}]}}}},
    {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
        "matchExpressions": [{"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": ["ALIBABA-G2"]}]}}]}}},
], ids=["nodeSelector", "required", "its own preference"])
def test_a_pod_with_a_say_about_products_is_left_as_it_is(pinned: dict) -> None:
    terms = preferred(pod(container(gpus=1), **pinned), published())
    own = pinned.get("affinity", {}).get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])
    assert relief(terms) == own  # the author's own product preference, nothing of ours


@pytest.mark.parametrize(("inventory", "why"), [
    (Inventory(), "no inventory"),
    (published(age=kube_inventory.MAX_AGE_SECONDS + 1), "stale"),
    (published(pressure=(("Tesla-T4", preferences.PRESSURE_AT_LEAST - 0.1),)), "below the threshold"),
])
def test_no_relief_without_a_fresh_inventory_that_names_a_pressured_product(inventory: Inventory, why: str) -> None:
    assert not relief(preferred(pod(container(gpus=1)), inventory)), why


def test_only_pack_relieves_and_cpu_pods_are_not_touched() -> None:
    assert not relief(preferred(pod(container(gpus=1)), published(), policies=SPREAD))
    assert not relief(preferred(pod(container()), published()))


def test_mutating_the_result_again_changes_nothing_even_with_another_inventory() -> None:
    first = mutation.mutate(pod(container(gpus=1)), namespace="ml-a", policies=PACK, inventory=published(), now=NOW)
    shaped = jsonpatch.apply_patch(pod(container(gpus=1)), list(first.patch))
    other = published(pressure=(("ALIBABA-G2", 0.9),))
    again = mutation.mutate(shaped, namespace="ml-a", policies=PACK, inventory=other, now=NOW)
    assert list(again.patch) == []


def test_the_warning_names_the_products() -> None:
    result = mutation.mutate(pod(container(gpus=1)), namespace="ml-a", policies=PACK, inventory=published(), now=NOW)
    named = "away from Tesla-P100-PCIE-16GB, Tesla-T4, Tesla-V100-SXM2-16GB"
    assert any(named in w for w in result.warnings), result.warnings


def test_the_inventory_reads_type_pressure_and_refuses_what_is_not_a_number() -> None:
    head = '{"apiVersion": "gpugate.io/v1alpha1", "kind": "GPUInventory", "generatedAt": "2026-12-01T12:00:00Z"'
    read = kube_inventory.parse(head + ', "typePressure": {"Tesla-T4": 1.5, "A": 0}}')
    assert read.type_pressure == (("A", 0.0), ("Tesla-T4", 1.5)) and read.pressured(0.5) == ("Tesla-T4",)
    assert kube_inventory.parse(head + "}").type_pressure == ()
    for bad in ('"typePressure": [1]', '"typePressure": {"T4": "high"}', '"typePressure": {"T4": -1}',
                '"typePressure": {"T4": true}'):
        with pytest.raises(kube_inventory.InventoryError, match="typePressure"):
            kube_inventory.parse(head + ", " + bad + "}")


def test_a_claim_only_pod_under_a_policy_naming_products_is_pinned_as_its_twin_is() -> None:
    """The twin asking ``nvidia.com/gpu`` gets the required ``gpu.product In`` and so no relief; the pod
    asking through a claim is held to the products by its claim's selectors, and gets none either."""
    pinning = load(policy("train", """
match: {namespaces: ["ml-*"]}
gpu: {resource: nvidia.com/gpu, products: [Tesla-V100-SXM2-16GB]}
placement: {strategy: pack}
"""))
    claimed = pod(container("trainer"))
    claimed["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    claimed["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "one"}]
    one = {("ResourceClaimTemplate", "one"): claims.parse({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}})}
    result = mutation.mutate(claimed, namespace="ml-a", policies=pinning, inventory=published(), now=NOW, resolved=one)
    shaped = jsonpatch.apply_patch(claimed, list(result.patch))
    terms = shaped["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms and not relief(terms)
    assert relief(preferred(pod(container(gpus=1)), published())), "the same inventory relieves an unpinned pod"
