"""Right-sizing: a pod says how much GPU it needs, the policy's ladder says what it may get.

The smallest rung that fits and that the cluster offers now wins; without a fresh inventory a
whole GPU rung that fits, else the ladder's order (never a denial); an ask larger than the largest
rung is denied naming it; a pod that asks a rung itself is judged by the same ladder.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.ladders import rightsizing
from tests.kubeversion import KUBERNETES_VERSION
from tests.policy.kit import container, load, node_feasible, pod, policy
from webhook import names
from webhook.admission import mutation, reviews, validation
from webhook.kube import demand
from webhook.kube.inventory import Inventory, Offer
from webhook.policy import loading

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LADDER = rightsizing("{resource: nvidia.com/gpu.shared, memory: 20Gi, compute: 0.25}", mig_strategy="mixed")
POLICIES = load(policy("serving", LADDER))
K8S = KUBERNETES_VERSION  # the target cluster: stack.yaml cluster.kubernetesVersion


def offers(*items: tuple[str, str, int], age: float = 0) -> Inventory:
    """An inventory written ``age`` seconds before NOW: (resource, product, free) per offer."""
    return Inventory(generated_at=NOW - timedelta(seconds=age),
                     offers=tuple(Offer(resource=r, product=p, free=f, allocatable=max(f, 1)) for r, p, f in items))


def asking(memory: str | None = None, fraction: str | None = None, *extra) -> dict:
    labels = {}
    if memory is not None:
        labels[names.GPU_MEMORY_LABEL] = memory
    if fraction is not None:
        labels[names.GPU_FRACTION_LABEL] = fraction
    return pod(container("model"), *extra, labels=labels)


def shaped(p: dict, inventory: Inventory = Inventory(), policies=POLICIES) -> tuple[mutation.Mutation, dict]:
    result = mutation.mutate(p, namespace="ml-a", policies=policies, inventory=inventory, now=NOW)
    return result, jsonpatch.apply_patch(p, list(result.patch))


def asked(p: dict) -> dict[str, str]:
    return {k: v for k, v in p["spec"]["containers"][0].get("resources", {}).get("limits", {}).items()}


class TestAsks:
    @pytest.mark.parametrize(("labels", "memory", "fraction"), [
        ({names.GPU_MEMORY_LABEL: "20Gi"}, 20 * 2**30, None),
        ({names.GPU_MEMORY_LABEL: "10G"}, 10**10, None),
        ({names.GPU_FRACTION_LABEL: "0.25"}, None, 0.25),
        ({names.GPU_MEMORY_LABEL: "8Gi", names.GPU_FRACTION_LABEL: "0.5"}, 8 * 2**30, 0.5),
    ])
    def test_labels_are_read_as_memory_and_compute(self, labels, memory, fraction):
        assert demand.size_of(pod(container(), labels=labels)) == demand.Size(memory, fraction)

    @pytest.mark.parametrize(("labels", "says"), [
        ({names.GPU_MEMORY_LABEL: "lots"}, "not a quantity"),
        ({names.GPU_MEMORY_LABEL: "99999999999Ti"}, "larger than a Kubernetes quantity can be"),  # "not a quantity"
        ({names.GPU_MEMORY_LABEL: "0"}, "more than 0"),
        ({names.GPU_FRACTION_LABEL: "1.5"}, "at most 1"),
        ({names.GPU_FRACTION_LABEL: "half"}, "not a number"),
    ])
    def test_a_label_that_is_no_ask_is_refused_by_validation_naming_it(self, labels, says):
        verdict = validation.validate(pod(container(), labels=labels), namespace="ml-a", policies=POLICIES)
        assert not verdict.allowed and says in verdict.message

    @pytest.mark.parametrize("memory", ["lots", "99999999999Ti"])
    def test_a_label_that_is_no_ask_is_refused_at_mutation_with_no_warning_first(self, memory):
        result = mutation.mutate(pod(container(), labels={names.GPU_MEMORY_LABEL: memory}), namespace="ml-a",
                                 policies=POLICIES)
        assert len(result.denials) == 1 and repr(memory) in result.denials[0]
        assert not result.warnings and not result.patch


class TestChoice:
    def test_without_an_inventory_a_whole_gpu_which_every_gpu_node_offers(self):
        """A 20Gi ask got nvidia.com/mig-3g.40gb without an inventory, Pending forever on a
        cluster without MIG; a whole GPU runs on any GPU node, and the warning says what was passed over."""
        result, stored = shaped(asking("15G"))
        assert asked(stored) == {"nvidia.com/gpu": "1"}
        warning = next(w for w in result.warnings if " gave " in w)
        assert warning.endswith("gave nvidia.com/gpu: 1 to container 'model' for gpugate.io/gpu-memory=15G: no "
                                "inventory from the balancer, so a whole GPU, which every GPU node has")

    def test_without_an_inventory_a_ladder_without_whole_gpus_keeps_its_order_and_says_the_pod_may_wait(self):
        shares = load(policy("serving", """
rightsizing:
  migStrategy: mixed
  ladder:
    - {mig: 1g.10gb}
    - {mig: 2g.20gb}
    - {resource: nvidia.com/gpu.shared, memory: 20Gi, compute: 0.25}
"""))
        result, stored = shaped(asking("15G"), policies=shares)
        assert asked(stored) == {"nvidia.com/mig-2g.20gb": "1"}
        assert any(w.split(": ", 1)[1].startswith("gave nvidia.com/mig-2g.20gb: 1 to container 'model' "
                                                  "for gpugate.io/gpu-memory=15G: Pending until a node configured for "
                                                  "2g.20gb has one free") for w in result.warnings)

    def test_without_an_inventory_a_ladder_with_the_policys_own_resource_gives_it_not_a_slice(self):
        """The starter notebooks ladder (1g.10gb, 2g.20gb, a share) has no whole GPU: an 8Gi notebook
        got a MIG slice and stayed Pending on a cluster without MIG. The share is what every other
        notebook of the policy gets (gpu.resource), so the cluster offers it."""
        starter = loading.load_dir(ROOT / "policies")
        notebook = asking("8Gi")
        notebook["metadata"]["labels"][names.PROFILE_LABEL] = "notebook"
        result = mutation.mutate(notebook, namespace="ml-team", policies=starter, now=NOW)
        assert asked(jsonpatch.apply_patch(notebook, list(result.patch))) == {"nvidia.com/gpu.shared": "1"}
        assert any("so the policy's own resource, not a slice only some nodes have" in w for w in result.warnings)

    @pytest.mark.parametrize("profile", ["notebook", "inference"])
    @pytest.mark.parametrize("memory", ["1Gi", "8Gi", "10G", "15G", "20Gi"])
    def test_without_an_inventory_no_starter_ladder_gives_a_mig_slice(self, profile, memory):
        """The starter set's promise: a missing inventory never leaves a pod Pending for a slice."""
        starter = loading.load_dir(ROOT / "policies")
        p = asking(memory)
        p["metadata"]["labels"][names.PROFILE_LABEL] = profile
        result = mutation.mutate(p, namespace="ml-team", policies=starter, now=NOW)
        assert result.allowed and not any(r.startswith("nvidia.com/mig-")
                                          for r in asked(jsonpatch.apply_patch(p, list(result.patch))))

    def test_a_fitting_rung_that_is_not_free_is_skipped(self):
        inventory = offers(("nvidia.com/mig-2g.20gb", "NVIDIA-H100-80GB-HBM3", 0),
                           ("nvidia.com/mig-3g.40gb", "NVIDIA-H100-80GB-HBM3", 2))
        result, stored = shaped(asking("15G"), inventory)
        assert asked(stored) == {"nvidia.com/mig-3g.40gb": "1"}
        assert any("the smallest that fits and is free now (2g.20gb taken)" in w for w in result.warnings)

    def test_a_stale_inventory_is_ignored_and_the_warning_says_how_old_it_is(self):
        inventory = offers(("nvidia.com/mig-3g.40gb", "NVIDIA-H100-80GB-HBM3", 2), age=3600)
        result, stored = shaped(asking("15G"), inventory)
        assert asked(stored) == {"nvidia.com/gpu": "1"}, "as without an inventory"
        assert any("the balancer's inventory is 60 min old (limit 5 min), so a whole GPU" in w
                   for w in result.warnings), result.warnings

    def test_when_nothing_fitting_is_free_the_pod_waits_for_the_smallest(self):
        result, stored = shaped(asking("15G"), offers(("nvidia.com/mig-1g.10gb", "NVIDIA-H100-80GB-HBM3", 9)))
        assert asked(stored) == {"nvidia.com/mig-2g.20gb": "1"} and not result.denials

    def test_single_strategy_slices_are_nvidia_gpu_on_single_nodes_with_big_enough_slices(self):
        inventory = offers(("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3-MIG-2g.20gb", 4))
        _, stored = shaped(asking("15G"), inventory)
        assert asked(stored) == {"nvidia.com/gpu": "1"}
        slice_node = {names.NVIDIA_MIG_STRATEGY_LABEL: "single", names.NVIDIA_MEMORY_LABEL: "19968"}
        whole_node = {names.NVIDIA_MIG_STRATEGY_LABEL: "mixed", names.NVIDIA_MEMORY_LABEL: "81559"}
        small_slices = {names.NVIDIA_MIG_STRATEGY_LABEL: "single", names.NVIDIA_MEMORY_LABEL: "9984"}
        assert node_feasible(stored, slice_node)
        assert not node_feasible(stored, whole_node), "a whole GPU is not what was chosen"
        assert not node_feasible(stored, small_slices), "a 10 GB slice does not hold 15 GB"

    def test_a_whole_gpu_never_lands_on_a_single_strategy_slice_and_has_the_memory(self):
        _, stored = shaped(asking("60Gi"))
        assert asked(stored) == {"nvidia.com/gpu": "1"}
        assert node_feasible(stored, {names.NVIDIA_MEMORY_LABEL: "81559"})
        assert not node_feasible(stored, {names.NVIDIA_MEMORY_LABEL: "40960"}), "a 40 GB GPU is too small"
        assert not node_feasible(stored, {names.NVIDIA_MIG_STRATEGY_LABEL: "single",
                                          names.NVIDIA_MEMORY_LABEL: "81559"})

    def test_a_fraction_picks_by_compute(self):
        free = offers(("nvidia.com/mig-1g.10gb", "NVIDIA-H100-80GB-HBM3", 7),
                      ("nvidia.com/mig-2g.20gb", "NVIDIA-H100-80GB-HBM3", 3))
        _, stored = shaped(asking(fraction="0.25"), free)
        assert asked(stored) == {"nvidia.com/mig-2g.20gb": "1"}, "1g is 1/7 of the compute, 2g is 2/7"

    def test_an_ask_above_the_largest_rung_is_denied_naming_it(self):
        result, _ = shaped(asking("100Gi"))
        assert result.patch == () and result.denials
        assert "the largest the policy offers is nvidia.com/gpu (80Gi" in result.denials[0]

    def test_tolerations_follow_the_chosen_resource(self):
        _, stored = shaped(asking("15G"), offers(("nvidia.com/mig-2g.20gb", "NVIDIA-H100-80GB-HBM3", 3)))
        keys = {t["key"] for t in stored["spec"]["tolerations"]}
        assert keys == {"nvidia.com/gpu", "nvidia.com/mig-2g.20gb"}

    def test_a_gpus_label_wins_and_the_ask_is_named(self):
        p = asking("15G")
        p["metadata"]["labels"][names.GPUS_LABEL] = "2"
        result, stored = shaped(p, policies=load(policy("serving", LADDER + "gpu: {max: 8}\n")))
        assert asked(stored) == {"nvidia.com/gpu": "2"}
        assert any("is not right-sized" in w for w in result.warnings)


class TestValidation:
    def test_a_pod_asking_a_larger_slice_than_needed_is_denied_when_a_smaller_is_free(self):
        p = pod(container("model", gpus=1, resource="nvidia.com/mig-3g.40gb"),
                labels={names.GPU_MEMORY_LABEL: "15G"})
        inventory = offers(("nvidia.com/mig-2g.20gb", "NVIDIA-H100-80GB-HBM3", 3))
        verdict = validation.validate(p, namespace="ml-a", policies=POLICIES, inventory=inventory, now=NOW)
        assert not verdict.allowed and "2g.20gb also fits and is free now" in verdict.message
        none_free = offers(("nvidia.com/mig-2g.20gb", "NVIDIA-H100-80GB-HBM3", 0))
        assert validation.validate(p, namespace="ml-a", policies=POLICIES, inventory=none_free, now=NOW).allowed
        assert validation.validate(p, namespace="ml-a", policies=POLICIES).allowed, "no inventory, no denial"

    def test_a_slice_smaller_than_the_ask_is_denied(self):
        p = pod(container("model", gpus=1, resource="nvidia.com/mig-1g.10gb"),
                labels={names.GPU_MEMORY_LABEL: "15G"})
        verdict = validation.validate(p, namespace="ml-a", policies=POLICIES)
        assert not verdict.allowed and "gives less than" in verdict.message

    def test_two_shares_are_denied_as_before(self):
        p = pod(container("model", gpus=2, resource="nvidia.com/gpu.shared"))
        verdict = validation.validate(p, namespace="ml-a", policies=POLICIES)
        assert not verdict.allowed and "one shared GPU per container" in verdict.message

    @pytest.mark.parametrize("inventory", [
        Inventory(),
        offers(("nvidia.com/mig-2g.20gb", "H100", 0), ("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 4),
               ("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3", 4)),
    ], ids=["no-inventory", "single-strategy-slices-free"])
    def test_what_mutation_chose_always_passes(self, inventory):
        """Found on the real API server: a single-strategy slice (nvidia.com/gpu) was judged as the
        whole-GPU rung, and validation refused the mutation's own choice."""
        for memory in ("5G", "15G", "30G", "60Gi"):
            _, stored = shaped(asking(memory), inventory)
            verdict = validation.validate(stored, namespace="ml-a", policies=POLICIES, inventory=inventory, now=NOW)
            assert verdict.allowed, (memory, verdict.reasons)


RUNGS = [("nvidia.com/mig-1g.10gb", "H100"), ("nvidia.com/mig-2g.20gb", "H100"),
         ("nvidia.com/mig-3g.40gb", "H100"), ("nvidia.com/gpu.shared", "H100"),
         ("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3")]


@settings(max_examples=200, deadline=None)
@given(memory_gb=st.integers(1, 100), free=st.lists(st.integers(0, 2), min_size=5, max_size=5), fresh=st.booleans())
def test_any_ask_gets_the_smallest_offered_rung_that_fits_idempotent_and_strict_valid(memory_gb, free, fresh):
    inventory = offers(*[(r, p, f) for (r, p), f in zip(RUNGS, free, strict=True)], age=0 if fresh else 3600)
    p = asking(f"{memory_gb}G")
    result, stored = shaped(p, inventory)
    ladder = POLICIES.policies[0].rightsizing.ladder
    fitting = [r for r in ladder if r.memory_bytes >= memory_gb * 10**9]
    if not fitting:
        assert result.denials
        return
    offered = [r for r, f in zip(ladder, free, strict=True) if f and r in fitting] if fresh else []
    whole = [r for r in fitting if r.resource == "nvidia.com/gpu"]
    expected = (offered or (fitting if fresh else whole or fitting))[0]
    resource = f"nvidia.com/mig-{expected.mig}" if expected.mig else expected.resource
    assert asked(stored) == {resource: "1"}
    again = mutation.mutate(stored, namespace="ml-a", policies=POLICIES, inventory=inventory, now=NOW)
    assert again.patch == (), again.patch
    assert validation.validate(stored, namespace="ml-a", policies=POLICIES, inventory=inventory, now=NOW).allowed
    kubernetes_validate.validate(copy.deepcopy(stored), K8S, strict=True)


STARTER = loading.load_dir(ROOT / "policies")


@settings(max_examples=60, deadline=None)
@given(profile=st.sampled_from(["notebook", "inference"]), memory_mib=st.integers(256, 90_000),
       container_name=st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=24),
       free=st.lists(st.integers(0, 1), min_size=5, max_size=5), age=st.sampled_from([None, 0, 90_000]))
def test_every_right_sizing_warning_of_the_starter_set_fits_the_api_servers_limit(profile, memory_mib,
                                                                                 container_name, free, age):
    """The API server cuts a warning at 256 characters: kubectl showed "...and the pod stays Pendin…"."""
    inventory = Inventory() if age is None else offers(
        *[(r, p, f) for (r, p), f in zip(RUNGS, free, strict=True)], age=age)
    p = pod(container(container_name), labels={names.PROFILE_LABEL: profile,
                                               names.GPU_MEMORY_LABEL: f"{memory_mib}Mi"})
    result = mutation.mutate(p, namespace="ml-team", policies=STARTER, inventory=inventory, now=NOW)
    for text in (*result.warnings, *result.denials):
        assert len(text) <= reviews.MAX_WARNING_CHARS, text
