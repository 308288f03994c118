"""One rule per test: what each mutation step adds, and what it never touches."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from tests.policy.kit import container, load, node_feasible, node_score, pod, policy, tolerates
from webhook import names
from webhook.admission import desiredpod, mutation
from webhook.kube.inventory import EMPTY, Inventory

NS = "ml-a"


def run(p, spec: str = "", *, namespace: str = NS, name: str = "gp", priority: int | None = None,
        mode: str | None = None, inventory: Inventory = EMPTY) -> mutation.Mutation:
    """Mutate ``p`` under one policy and check the patch really turns the input into ``desired``."""
    policies = load(policy(name, spec, priority=priority, mode=mode))
    original = copy.deepcopy(p)
    result = mutation.mutate(p, namespace=namespace, policies=policies, inventory=inventory)
    assert p == original, "mutate must not edit its input"
    assert jsonpatch.apply_patch(p, list(result.patch)) == result.desired
    return result


def gpu_limits(c):
    return {k: v for k, v in (c.get("resources") or {}).get("limits", {}).items() if k.startswith("nvidia.com/")}


def gpu_requests(c):
    return {k: v for k, v in (c.get("resources") or {}).get("requests", {}).items() if k.startswith("nvidia.com/")}


def spec_of(result):
    return result.desired["spec"]


def labelled(gpus: str, *containers_, **kwargs):
    labels = {names.GPUS_LABEL: gpus, **kwargs.pop("labels", {})}
    return pod(*(containers_ or (container(),)), labels=labels, **kwargs)


# --- GPU requests ------------------------------------------------------------------------------

class TestAbsurdCounts:
    @pytest.mark.parametrize(("label", "spec", "says"), [
        ("1k", "gpu: {max: 8}", "asks for 1000 GPUs; policy gp allows 8. Ask for 8 or fewer"),
        ("12", "gpu: {max: 8}", "asks for 12 GPUs; policy gp allows 8"),
        ("65", "", "asks for 65 GPUs; no node has more than 64. Ask for 64 or fewer"),
        ("9999999999999999999", "", "asks for 9999999999999999999 GPUs; no node has more than 64"),
        ("99999999999999999999", "", "asks for more GPUs than any node has"),
    ])
    def test_a_count_no_node_can_hold_is_denied_at_mutation_and_not_injected(self, label, spec, says):
        result = run(labelled(label), spec)
        assert result.patch == () and result.denials
        assert f"label gpugate.io/gpus={label!r}" in result.denials[0] and says in result.denials[0]

    def test_audit_mode_only_warns(self):
        result = run(labelled("1k"), "gpu: {max: 8}", mode="audit")
        assert not result.denials and any("would deny" in w and "1000 GPUs" in w for w in result.warnings)

    def test_the_largest_allowed_count_is_injected(self):
        result = run(labelled("8"), "gpu: {max: 8}")
        assert not result.denials and gpu_limits(spec_of(result)["containers"][0]) == {"nvidia.com/gpu": "8"}


class TestGpuRequests:
    def test_the_gpus_label_sets_requests_equal_to_limits_on_the_first_container(self):
        result = run(labelled("2", container("trainer"), container("sidecar")))
        trainer, sidecar = spec_of(result)["containers"]
        assert gpu_requests(trainer) == gpu_limits(trainer) == {"nvidia.com/gpu": "2"}
        assert "resources" not in sidecar

    def test_an_empty_gpus_label_asks_for_the_policy_default(self):
        result = run(labelled(""), "gpu: {default: 3}")
        assert gpu_limits(spec_of(result)["containers"][0]) == {"nvidia.com/gpu": "3"}

    def test_an_empty_gpus_label_without_a_default_asks_for_one(self):
        result = run(labelled(""))
        assert gpu_limits(spec_of(result)["containers"][0]) == {"nvidia.com/gpu": "1"}

    def test_the_policy_resource_is_the_one_injected(self):
        result = run(labelled("1"), "gpu: {resource: nvidia.com/gpu.shared}")
        c = spec_of(result)["containers"][0]
        assert gpu_requests(c) == gpu_limits(c) == {"nvidia.com/gpu.shared": "1"}

    def test_gpu_only_false_gives_every_matched_pod_the_default(self):
        result = run(pod(container()), "match: {gpuOnly: false}\ngpu: {default: 1}")
        assert gpu_limits(spec_of(result)["containers"][0]) == {"nvidia.com/gpu": "1"}

    def test_gpu_only_false_without_a_default_adds_no_gpu(self):
        result = run(pod(container()), "match: {gpuOnly: false}\npriorityClassName: batch")
        assert "resources" not in spec_of(result)["containers"][0]
        assert spec_of(result)["priorityClassName"] == "batch"

    def test_the_container_annotation_picks_the_container(self):
        p = labelled("1", container("sidecar"), container("trainer"),
                     annotations={names.CONTAINER_ANNOTATION: "trainer"})
        sidecar, trainer = spec_of(run(p))["containers"]
        assert gpu_limits(trainer) == {"nvidia.com/gpu": "1"} and "resources" not in sidecar

    def test_an_annotation_naming_no_container_adds_nothing_and_says_so(self):
        p = labelled("1", container("a"), annotations={names.CONTAINER_ANNOTATION: "missing"})
        result = run(p)
        assert "resources" not in spec_of(result)["containers"][0]
        assert any("gpugate.io/container='missing' names no regular container" in w for w in result.warnings)

    def test_init_containers_never_get_the_injected_gpu(self):
        p = labelled("1", container("main"), init=[container("setup")])
        desired = spec_of(run(p))
        assert "resources" not in desired["initContainers"][0]
        assert gpu_limits(desired["containers"][0]) == {"nvidia.com/gpu": "1"}

    def test_an_init_container_gpu_does_not_silently_swallow_the_gpus_label(self):
        result = run(labelled("2", container("main"), init=[container("setup", gpus=1)]))
        main = spec_of(result)["containers"][0]
        assert gpu_limits(main) == {"nvidia.com/gpu": "2"} or any(names.GPUS_LABEL in w for w in result.warnings)

    def test_an_annotation_naming_an_init_container_adds_nothing(self):
        p = labelled("1", container("main"), init=[container("setup")],
                     annotations={names.CONTAINER_ANNOTATION: "setup"})
        result = run(p)
        assert "resources" not in spec_of(result)["initContainers"][0]
        assert "resources" not in spec_of(result)["containers"][0]
        assert any("names no regular container" in w for w in result.warnings)

    def test_other_resources_of_the_container_are_kept(self):
        p = labelled("1", container(requests={"cpu": "2", "memory": "8Gi"}, limits={"memory": "8Gi"}))
        c = spec_of(run(p))["containers"][0]
        assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                                  "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}

    @pytest.mark.parametrize(("label", "user", "warned"), [
        ("4", 2, "kept the pod's own nvidia.com/gpu: 2 instead of 4 from the gpugate.io/gpus label"),
        ("1", 8, "kept the pod's own nvidia.com/gpu: 8 instead of 1 from the gpugate.io/gpus label"),
        ("2", 2, None),
    ], ids=["a lower user count is not raised", "a higher user count is not lowered", "agreeing counts say nothing"])
    def test_a_user_gpu_count_is_never_changed_and_the_warning_says_so(self, label, user, warned):
        p = labelled(label, container(gpus=user))
        result = run(p)
        c = spec_of(result)["containers"][0]
        assert gpu_requests(c) == gpu_limits(c) == {"nvidia.com/gpu": str(user)}
        kept = [w for w in result.warnings if "kept the pod's own" in w]
        assert kept == ([f"gpugate gp@{result.policy.revision}: {warned}"] if warned else [])

    def test_a_user_count_on_a_second_container_is_kept_and_nothing_added_to_the_first(self):
        p = labelled("1", container("a"), container("b", gpus=2))
        a, b = spec_of(run(p))["containers"]
        assert "resources" not in a and gpu_limits(b) == {"nvidia.com/gpu": "2"}

    def test_a_different_nvidia_resource_of_the_user_is_kept_and_named(self):
        p = labelled("1", container(gpus=1, resource="nvidia.com/mig-1g.10gb"))
        result = run(p)
        assert gpu_limits(spec_of(result)["containers"][0]) == {"nvidia.com/mig-1g.10gb": "1"}
        assert any("kept the pod's own nvidia.com/mig-1g.10gb request; the policy's nvidia.com/gpu was not added" in w
                   for w in result.warnings)

    @pytest.mark.parametrize(("given", "expected"), [
        ({"limits": {"nvidia.com/gpu": "2"}},
         {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}),
        ({"requests": {"nvidia.com/gpu": "2"}},
         {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}),
        ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
         {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}),
    ], ids=["a limit alone gets the equal request", "a request alone gets the equal limit",
            "a mismatch is left for validation to deny, not silently fixed"])
    def test_requests_equal_limits_for_the_users_own_gpu(self, given, expected):
        c = container()
        c["resources"] = copy.deepcopy(given)
        assert spec_of(run(pod(c)))["containers"][0]["resources"] == expected

    def test_requests_equal_limits_also_for_init_containers(self):
        init = container("setup")
        init["resources"] = {"limits": {"nvidia.com/gpu.shared": "1"}}
        desired = spec_of(run(pod(container(), init=[init]), "gpu: {allowedResources: [nvidia.com/gpu.shared]}"))
        assert gpu_requests(desired["initContainers"][0]) == {"nvidia.com/gpu.shared": "1"}

    def test_the_twin_is_named_in_a_warning(self):
        c = container("trainer")
        c["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
        result = run(pod(c))
        assert any("set requests nvidia.com/gpu: 2 to match limits on container 'trainer'" in w
                   for w in result.warnings)

    @pytest.mark.parametrize(("label", "why"), [("two", "is not a number"), ("1.5", "is not a whole number"),
                                                ("-1", "is negative"), ("500m", "is not a whole number")])
    def test_a_label_that_is_not_a_whole_number_is_refused_with_its_reason_alone(self, label, why):
        """Refused at mutation, unshaped and without warnings: validation refuses it whatever is
        injected, and shaping it first put warnings before the one reason that matters."""
        result = run(labelled(label))
        assert result.denials == (f"label gpugate.io/gpus={label!r} {why}; write a count such as "
                                  f"gpugate.io/gpus: \"1\" (policy {result.policy})",)
        assert not result.patch and not result.warnings

    @pytest.mark.parametrize(("value", "why"), [("-1", "is negative"), ("1e30", "is more than any node has"),
                                                ("1.5", "is not a whole number")])
    def test_a_resource_count_that_is_not_whole_is_refused_without_warnings_first(self, value, why):
        c = container("trainer")
        c["resources"] = {"limits": {"nvidia.com/gpu": value}}
        result = run(pod(c))
        assert result.denials == (f"container 'trainer' asks nvidia.com/gpu: {value}, which {why} (policy "
                                  f"{result.policy}); GPUs are counted in whole devices",)
        assert not result.patch and not result.warnings

    @pytest.mark.parametrize("section", ["limits", "requests"])
    def test_a_resource_written_as_zero_is_not_a_gpu_ask(self, section):
        """``nvidia.com/gpu: "0"`` asks for no GPU: no gpuOnly policy shapes it (it got tolerations,
        placement terms and the policy annotation before)."""
        c = container("trainer")
        c["resources"] = {section: {"nvidia.com/gpu": "0"}}
        result = run(pod(c))
        assert result.policy is None and not result.patch

    def test_a_zero_label_adds_nothing(self):
        assert "resources" not in spec_of(run(labelled("0")))["containers"][0]

    def test_the_injection_is_named_in_a_warning(self):
        result = run(labelled("2", container("trainer")))
        assert f"gpugate gp@{result.policy.revision}: set nvidia.com/gpu: 2 (requests = limits) on container " \
               f"'trainer'" in result.warnings

    def test_a_container_with_null_resources_gets_them(self):
        c = container("a")
        c["resources"] = None
        desired = spec_of(run(labelled("1", c)))
        assert gpu_limits(desired["containers"][0]) == {"nvidia.com/gpu": "1"}


# --- tolerations -------------------------------------------------------------------------------

def taint(key: str) -> dict[str, str]:
    return {"key": key, "value": "present", "effect": "NoSchedule"}


def tolerations_of(result):
    return spec_of(result).get("tolerations") or []


class TestTolerations:
    @pytest.mark.parametrize(("resources", "expected_keys"), [
        ({"nvidia.com/gpu"}, ["nvidia.com/gpu"]),
        ({"nvidia.com/gpu.shared"}, ["nvidia.com/gpu", "nvidia.com/gpu.shared"]),
        ({"nvidia.com/mig-1g.10gb"}, ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]),
        ({"nvidia.com/gpu", "nvidia.com/mig-2g.20gb"}, ["nvidia.com/gpu", "nvidia.com/mig-2g.20gb"]),
    ], ids=["whole GPUs: the GPU taint only", "shared only still tolerates the GPU-node taint and its own",
            "MIG only still tolerates the GPU-node taint and its own", "two resources: one toleration each"])
    def test_auto_tolerates_the_gpu_taint_and_one_per_resource(self, resources, expected_keys):
        containers = [container(f"c{i}", gpus=1, resource=r) for i, r in enumerate(sorted(resources))]
        allowed = ", ".join(sorted(resources))
        result = run(pod(*containers), f"gpu: {{allowedResources: [{allowed}]}}")
        tolerations = tolerations_of(result)
        assert sorted(t["key"] for t in tolerations) == sorted(expected_keys)
        assert all(t["operator"] == "Exists" and t["effect"] == "NoSchedule" for t in tolerations)
        for key in expected_keys:
            assert any(tolerates(t, taint(key)) for t in tolerations), key

    def test_auto_counts_init_container_resources(self):
        init = container("setup", gpus=1, resource="nvidia.com/gpu.shared")
        result = run(pod(container(), init=[init]), "gpu: {allowedResources: [nvidia.com/gpu.shared]}")
        assert {t["key"] for t in tolerations_of(result)} == {"nvidia.com/gpu", "nvidia.com/gpu.shared"}

    def test_auto_tolerates_the_injected_gpu(self):
        assert [t["key"] for t in tolerations_of(run(labelled("1")))] == ["nvidia.com/gpu"]

    def test_a_cpu_pod_gets_no_gpu_toleration(self):
        result = run(pod(container()), "match: {gpuOnly: false}")
        assert "tolerations" not in spec_of(result)

    def test_an_empty_key_exists_toleration_covers_everything(self):
        p = pod(container(gpus=1, resource="nvidia.com/gpu.shared"), tolerations=[{"operator": "Exists"}])
        result = run(p, "gpu: {allowedResources: [nvidia.com/gpu.shared]}")
        assert tolerations_of(result) == [{"operator": "Exists"}]
        assert not any("added tolerations" in w for w in result.warnings)

    def test_an_existing_toleration_without_effect_covers_ours_and_the_missing_one_is_added(self):
        mine = {"key": "nvidia.com/gpu", "operator": "Exists"}
        p = pod(container(gpus=1, resource="nvidia.com/gpu.shared"), tolerations=[mine])
        result = run(p, "gpu: {allowedResources: [nvidia.com/gpu.shared]}")
        assert tolerations_of(result) == [mine, {"key": "nvidia.com/gpu.shared", "operator": "Exists",
                                                 "effect": "NoSchedule"}]

    @pytest.mark.parametrize("existing", [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute"},
    ], ids=["another effect", "one value only", "empty key but another effect"])
    def test_a_narrower_user_toleration_is_kept_and_ours_added(self, existing):
        result = run(pod(container(gpus=1), tolerations=[existing]))
        assert tolerations_of(result) == [existing, {"key": "nvidia.com/gpu", "operator": "Exists",
                                                     "effect": "NoSchedule"}]

    def test_unrelated_user_tolerations_are_kept_in_order_before_ours(self):
        users = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                 {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                  "tolerationSeconds": 300}]
        result = run(pod(container(gpus=1), tolerations=copy.deepcopy(users)))
        assert tolerations_of(result)[:2] == users and len(tolerations_of(result)) == 3

    def test_nothing_is_duplicated_on_a_second_pass(self):
        first = run(labelled("1", container(gpus=1, resource="nvidia.com/gpu.shared")),
                    "gpu: {allowedResources: [nvidia.com/gpu.shared]}")
        keys = [t.get("key") for t in tolerations_of(first)]
        assert len(keys) == len(set(keys))
        again = mutation.mutate(first.desired, namespace=NS, policies=load(policy("gp", "gpu: {allowedResources: "
                                                                                  "[nvidia.com/gpu.shared]}")))
        assert tolerations_of(again) == tolerations_of(first)

    def test_tolerations_none_adds_nothing(self):
        assert "tolerations" not in spec_of(run(pod(container(gpus=1)), "tolerations: none"))

    def test_an_explicit_list_is_added_as_written(self):
        result = run(pod(container(gpus=1), tolerations=[{"key": "a", "operator": "Exists"}]),
                     "tolerations: [{key: a}, {key: pool, value: gpu, effect: NoSchedule}]")
        assert tolerations_of(result) == [{"key": "a", "operator": "Exists"},
                                          {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]

    def test_the_added_tolerations_are_named_in_a_warning(self):
        result = run(pod(container(gpus=1)))
        assert any(w.endswith("added tolerations for nvidia.com/gpu:NoSchedule") for w in result.warnings)


# --- required node affinity --------------------------------------------------------------------

def gpu_node(product="NVIDIA-H100-80GB-HBM3", family="hopper", memory=81559, load_tier=None, **extra):
    labels = {names.NVIDIA_PRODUCT_LABEL: product, names.NVIDIA_FAMILY_LABEL: family,
              names.NVIDIA_MEMORY_LABEL: str(memory), **extra}
    if load_tier:
        labels[names.GPU_LOAD_LABEL] = load_tier
    return labels


class TestRequiredNodeAffinity:
    def test_products_families_and_memory_restrict_the_nodes(self):
        result = run(pod(container(gpus=1)), """
            gpu: {products: [NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB], families: [hopper, ampere],
                  minMemoryMiB: 40000}
        """)
        p = result.desired
        assert node_feasible(p, gpu_node())
        assert node_feasible(p, gpu_node("NVIDIA-A100-SXM4-80GB", "ampere", 81920))
        assert not node_feasible(p, gpu_node("Tesla-T4", "turing", 15360)), "wrong product"
        assert not node_feasible(p, gpu_node(family="volta")), "wrong family"
        assert node_feasible(p, gpu_node(memory=40000)), "exactly the minimum is enough"
        assert not node_feasible(p, gpu_node(memory=39999)), "below the minimum"
        assert not node_feasible(p, {}), "a node without GPU labels"

    def test_the_policy_requirements_are_anded_into_every_existing_term(self):
        terms = [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                 {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": copy.deepcopy(terms)}}})
        desired = run(p, "gpu: {products: [NVIDIA-H100-80GB-HBM3]}").desired
        assert node_feasible(desired, gpu_node(pool="a"))
        assert node_feasible(desired, gpu_node(zone="z1"))
        assert not node_feasible(desired, gpu_node("Tesla-T4", pool="a")), "term 1 now needs the product"
        assert not node_feasible(desired, gpu_node("Tesla-T4", zone="z1")), "term 2 now needs the product"
        assert not node_feasible(desired, gpu_node(pool="b")), "the user's OR of terms is kept"
        out_terms = desired["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert [t["matchExpressions"][0] for t in out_terms] == [t["matchExpressions"][0] for t in terms]

    def test_a_term_with_match_fields_only_keeps_them_and_gains_expressions(self):
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [copy.deepcopy(term)]}}})
        (out,) = run(p, "gpu: {products: [X]}").desired["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert out["matchFields"] == term["matchFields"]
        assert out["matchExpressions"] == [{"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": ["X"]}]

    def test_a_user_node_selector_that_contradicts_the_policy_is_kept_and_named(self):
        p = pod(container(gpus=1), nodeSelector={names.NVIDIA_PRODUCT_LABEL: "Tesla-T4"})
        result = run(p, "gpu: {products: [NVIDIA-H100-80GB-HBM3]}")
        assert result.desired["spec"]["nodeSelector"] == {names.NVIDIA_PRODUCT_LABEL: "Tesla-T4"}
        assert "affinity" not in result.desired["spec"]
        assert any("nodeSelector nvidia.com/gpu.product='Tesla-T4' contradicts" in w for w in result.warnings)

    def test_a_user_node_selector_that_meets_the_policy_needs_no_affinity(self):
        p = pod(container(gpus=1), nodeSelector={names.NVIDIA_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"})
        result = run(p, "gpu: {products: [NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB]}")
        assert "affinity" not in result.desired["spec"]

    def test_an_unrelated_node_selector_is_kept_beside_the_affinity(self):
        p = pod(container(gpus=1), nodeSelector={"pool": "gpu-a"})
        desired = run(p, "gpu: {products: [NVIDIA-H100-80GB-HBM3]}").desired
        assert desired["spec"]["nodeSelector"] == {"pool": "gpu-a"}
        assert node_feasible(desired, gpu_node(pool="gpu-a"))
        assert not node_feasible(desired, gpu_node("Tesla-T4", pool="gpu-a"))

    def test_a_user_affinity_on_the_same_label_is_kept_and_the_policy_anded_to_it(self):
        own = {"key": names.NVIDIA_PRODUCT_LABEL, "operator": "In", "values": ["Tesla-T4", "NVIDIA-H100-80GB-HBM3"]}
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [dict(own)]}]}}})
        result = run(p, "gpu: {products: [NVIDIA-H100-80GB-HBM3], minMemoryMiB: 10000}")
        (term,) = result.desired["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert term["matchExpressions"][0] == own
        assert [e["key"] for e in term["matchExpressions"]] == [
            names.NVIDIA_PRODUCT_LABEL, names.NVIDIA_PRODUCT_LABEL, names.NVIDIA_MEMORY_LABEL]
        assert not node_feasible(result.desired, gpu_node("Tesla-T4")), "the policy's product holds"
        assert node_feasible(result.desired, gpu_node())
        assert any("ANDed the policy's nvidia.com/gpu.product In" in w for w in result.warnings)

    def test_a_user_expression_that_already_implies_the_policy_is_enough(self):
        own = {"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": ["80000"]}
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [dict(own)]}]}}})
        result = run(p, "gpu: {minMemoryMiB: 40000}")
        (term,) = result.desired["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert term["matchExpressions"] == [own]

    def test_a_second_term_cannot_escape_the_requirement(self):
        """Terms are ORed: each must carry the requirement, or the pod escapes through the one that lacks it."""
        terms = [{"matchExpressions": [{"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": ["79999"]}]},
                 {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": copy.deepcopy(terms)}}})
        desired = run(p, "gpu: {minMemoryMiB: 40000}").desired
        small = gpu_node(memory=16384)
        small["kubernetes.io/os"] = "linux"
        assert not node_feasible(desired, small), "the second term no longer admits a 16 GiB GPU"

    def test_an_empty_term_matches_no_node_and_stays_empty(self):
        terms = [{}, {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": copy.deepcopy(terms)}}})
        desired = run(p, "gpu: {products: [X]}").desired
        out = desired["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert out[0] == {}
        assert not node_feasible(desired, gpu_node("Y", pool="b")), "the empty term still admits nothing"

    def test_avoid_congested_required_is_a_required_not_in_congested(self):
        terms = [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                 {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]
        p = pod(container(gpus=1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}})
        desired = run(p, "placement: {avoidCongested: required}").desired
        for pool in ("a", "b"):
            assert not node_feasible(desired, gpu_node(load_tier="congested", pool=pool))
            assert node_feasible(desired, gpu_node(load_tier="busy", pool=pool))
            assert node_feasible(desired, gpu_node(pool=pool)), "an unlabeled node is not congested"
        for term in desired["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"]:
            assert {"key": names.GPU_LOAD_LABEL, "operator": "NotIn", "values": ["congested"]} in term[
                "matchExpressions"]

    def test_a_pod_without_gpus_gets_no_gpu_node_requirements(self):
        result = run(pod(container()), "match: {gpuOnly: false}\ngpu: {products: [X]}\n"
                                       "placement: {avoidCongested: required}")
        assert "affinity" not in spec_of(result)

    def test_the_requirements_are_named_in_a_warning(self):
        result = run(pod(container(gpus=1)), "gpu: {minMemoryMiB: 40000}")
        assert any("required node affinity nvidia.com/gpu.memory Gt 39999" in w for w in result.warnings)


# --- placement preferences ---------------------------------------------------------------------

def free_node(free: int | None, load_tier: str | None = None) -> dict[str, str]:
    labels = {}
    if free is not None:
        labels[names.GPU_FREE_LABEL] = str(free)
    if load_tier:
        labels[names.GPU_LOAD_LABEL] = load_tier
    return labels


def preferred_of(desired):
    return desired["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


class TestPlacement:
    @pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
    def test_pack_ranks_the_tightest_fit_first(self, n):
        desired = run(labelled(str(n)), "placement: {strategy: pack}").desired
        score = {free: node_score(desired, free_node(free)) for free in (n, n + 1, n + 2, n + 3, n + 4, n + 7, n + 8,
                                                                         n + 20)}
        assert score[n] > score[n + 1] > score[n + 2] > score[n + 4] > score[n + 8], score
        assert score[n + 2] == score[n + 3] and score[n + 4] == score[n + 7]
        assert score[n + 8] == score[n + 20] == 0
        assert node_score(desired, free_node(None)) == 0, "an unlabeled node gets no pack preference"

    def test_pack_counts_the_gpus_of_every_regular_container(self):
        desired = run(pod(container("a", gpus=2), container("b", gpus=1)), "placement: {strategy: pack}").desired
        assert node_score(desired, free_node(3)) > node_score(desired, free_node(4)) > node_score(
            desired, free_node(2 + 1 + 2))

    def test_pack_for_a_shared_gpu_prefers_nodes_without_free_whole_gpus(self):
        desired = run(pod(container(gpus=1, resource="nvidia.com/gpu.shared")),
                      "gpu: {resource: nvidia.com/gpu.shared}\nplacement: {strategy: pack}").desired
        assert node_score(desired, free_node(0)) > node_score(desired, free_node(1)) > node_score(
            desired, free_node(8))

    def test_spread_prefers_idle_then_busy_then_congested(self):
        desired = run(pod(container(gpus=1)), "placement: {strategy: spread}").desired
        idle, busy, congested = (node_score(desired, free_node(4, t)) for t in ("idle", "busy", "congested"))
        assert idle > busy > congested

    def test_spread_with_avoid_congested_preferred_puts_congested_nodes_last(self):
        desired = run(pod(container(gpus=1)), "placement: {strategy: spread, avoidCongested: preferred}").desired
        scores = {t: node_score(desired, free_node(4, t)) for t in ("idle", "busy", "congested", None)}
        assert scores["idle"] > scores["busy"] > scores["congested"]
        assert scores[None] > scores["congested"], "an unlabeled node beats a congested one"
        assert scores["congested"] == 0

    def test_avoid_congested_preferred_alone_is_one_term(self):
        desired = run(pod(container(gpus=1)), "placement: {avoidCongested: preferred}").desired
        assert node_score(desired, free_node(1, "busy")) > node_score(desired, free_node(1, "congested"))
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in desired["spec"]["affinity"]["nodeAffinity"]

    def test_weights_are_valid_for_the_api_server(self):
        for strategy in ("pack", "spread"):
            desired = run(pod(container(gpus=1)), f"placement: {{strategy: {strategy}, avoidCongested: preferred}}"
                          ).desired
            assert all(1 <= t["weight"] <= 100 for t in preferred_of(desired))

    def test_no_strategy_adds_no_preference(self):
        assert "affinity" not in spec_of(run(pod(container(gpus=1)), "placement: {strategy: none}"))

    def test_user_preferences_are_kept_before_ours(self):
        users = [{"weight": 7, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                     "values": ["z1"]}]}}]
        p = pod(container(gpus=1), affinity={"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": copy.deepcopy(users)}})
        desired = run(p, "placement: {strategy: spread}").desired
        assert preferred_of(desired)[:1] == users and len(preferred_of(desired)) > 1

    def test_a_cpu_pod_under_a_gpu_only_policy_gets_no_placement(self):
        assert "affinity" not in spec_of(run(pod(container(), labels={names.GPUS_LABEL: "0"}),
                                             "placement: {strategy: pack}"))

    def test_a_cpu_pod_under_a_gpu_only_false_pack_policy_prefers_nodes_without_gpus_then_full_ones(self):
        """CPU pods stop taking the CPU of empty GPU nodes: no-GPU node > full > nearly full > empty."""
        desired = run(pod(container()), "match: {gpuOnly: false}\nplacement: {strategy: pack}").desired
        assert "resources" not in desired["spec"]["containers"][0]  # no GPU injected
        scores = {free: node_score(desired, {names.GPU_FREE_LABEL: free}) for free in ("0", "1", "3", "8")}
        no_gpu = node_score(desired, {})
        assert no_gpu > scores["0"] > scores["1"] > scores["3"] > scores["8"] == 0


# --- topology ----------------------------------------------------------------------------------

TOPOLOGY = "placement: {topology: {key: nvidia.com/gpu.clique}}"


class TestTopology:
    @pytest.mark.parametrize("label", names.JOB_LABELS)
    def test_pods_of_one_job_prefer_one_topology_domain(self, label):
        p = pod(container(gpus=1), labels={label: "job-7"})
        (term,) = run(p, TOPOLOGY).desired["spec"]["affinity"]["podAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert 1 <= term["weight"] <= 100
        assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": {label: "job-7"}},
                                           "topologyKey": "nvidia.com/gpu.clique"}

    def test_required_mode_is_a_required_pod_affinity(self):
        p = pod(container(gpus=1), labels={names.GROUP_LABEL: "j"})
        affinity = run(p, "placement: {topology: {key: topology.kubernetes.io/zone, mode: required}}").desired[
            "spec"]["affinity"]["podAffinity"]
        assert affinity == {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {names.GROUP_LABEL: "j"}}, "topologyKey": "topology.kubernetes.io/zone"}]}

    def test_the_gpugate_group_label_wins_over_job_labels(self):
        p = pod(container(gpus=1), labels={names.GROUP_LABEL: "mine", "batch.kubernetes.io/job-name": "job-x"})
        (term,) = run(p, TOPOLOGY).desired["spec"]["affinity"]["podAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": {names.GROUP_LABEL: "mine"}}

    def test_a_pod_of_no_job_gets_no_pod_affinity(self):
        assert "affinity" not in spec_of(run(pod(container(gpus=1), labels={"app": "x"}), TOPOLOGY))

    def test_user_pod_affinity_and_anti_affinity_are_kept(self):
        own = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                   {"weight": 5, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "cache"}},
                                                     "topologyKey": "kubernetes.io/hostname"}}]},
               "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                   {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}
        p = pod(container(gpus=1), labels={names.GROUP_LABEL: "j"}, affinity=copy.deepcopy(own))
        affinity = run(p, TOPOLOGY).desired["spec"]["affinity"]
        assert affinity["podAntiAffinity"] == own["podAntiAffinity"]
        terms = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert terms[0] == own["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0] and len(terms) == 2


# --- runtimeClassName, priorityClassName, schedulerName ------------------------------------------

FIELDS = "runtimeClassName: nvidia\npriorityClassName: gpu-batch\nschedulerName: gpugate-binpack"


class TestSchedulingFields:
    def test_the_policy_sets_them_when_the_user_did_not(self):
        result = run(pod(container(gpus=1)), FIELDS)
        spec = spec_of(result)
        assert (spec["runtimeClassName"], spec["priorityClassName"], spec["schedulerName"]) == (
            "nvidia", "gpu-batch", "gpugate-binpack")
        for text in ("set runtimeClassName: nvidia", "set priorityClassName: gpu-batch",
                     "set schedulerName: gpugate-binpack"):
            assert any(w.endswith(text) for w in result.warnings), text

    @pytest.mark.parametrize(("field", "user", "policy_value"), [
        ("runtimeClassName", "kata", "nvidia"),
        ("priorityClassName", "urgent", "gpu-batch"),
        ("schedulerName", "volcano", "gpugate-binpack"),
    ])
    def test_a_user_value_is_kept_and_the_warning_says_so(self, field, user, policy_value):
        result = run(pod(container(gpus=1), **{field: user}), FIELDS)
        assert spec_of(result)[field] == user
        assert any(w.endswith(f"kept the pod's {field}: {user} instead of the policy's {policy_value}")
                   for w in result.warnings)

    def test_default_scheduler_counts_as_unset(self):
        assert spec_of(run(pod(container(gpus=1), schedulerName="default-scheduler"), FIELDS))[
            "schedulerName"] == "gpugate-binpack"

    def test_fields_the_policy_leaves_unset_are_not_touched(self):
        spec = spec_of(run(pod(container(gpus=1), schedulerName="default-scheduler")))
        assert spec["schedulerName"] == "default-scheduler"
        assert "runtimeClassName" not in spec and "priorityClassName" not in spec

    def test_setting_the_priority_class_drops_the_stale_computed_priority(self):
        """The Priority admission plugin refuses a spec.priority that its class does not give."""
        spec = spec_of(run(pod(container(gpus=1), priority=0), FIELDS))
        assert spec["priorityClassName"] == "gpu-batch" and "priority" not in spec

    def test_setting_the_priority_class_drops_the_computed_preemption_policy_too(self):
        """Reinvocation re-runs the Priority plugin, which refuses a preemptionPolicy its class does
        not give (plugin/pkg/admission/priority/admission.go admitPod): both fields go."""
        p = pod(container(gpus=1), priority=0, preemptionPolicy="PreemptLowerPriority")
        spec = spec_of(run(p, FIELDS))
        assert "priority" not in spec and "preemptionPolicy" not in spec

    def test_the_policy_class_replaces_the_clusters_global_default(self):
        """The Priority plugin writes the globalDefault class into a pod that names none, before webhooks."""
        p = pod(container(gpus=1), priorityClassName="cluster-default", priority=100,
                preemptionPolicy="PreemptLowerPriority")
        spec = spec_of(run(p, FIELDS, inventory=Inventory(default_priority_class="cluster-default")))
        assert spec["priorityClassName"] == "gpu-batch"
        assert "priority" not in spec and "preemptionPolicy" not in spec
        # Without the inventory the webhook cannot tell the default from a choice: it keeps it.
        kept = run(copy.deepcopy(p), FIELDS)
        assert spec_of(kept)["priorityClassName"] == "cluster-default"
        assert any("kept the pod's priorityClassName: cluster-default" in w for w in kept.warnings)

    def test_a_user_priority_class_keeps_its_priority(self):
        spec = spec_of(run(pod(container(gpus=1), priorityClassName="urgent", priority=1000), FIELDS))
        assert spec["priority"] == 1000

    def test_an_equal_user_value_says_nothing(self):
        result = run(pod(container(gpus=1), runtimeClassName="nvidia"), "runtimeClassName: nvidia")
        assert not any("runtimeClassName" in w for w in result.warnings)


# --- annotation, warnings, modes -----------------------------------------------------------------

class TestAnnotationAndModes:
    def test_the_policy_annotation_is_name_at_revision(self):
        policies = load(policy("training"))
        result = mutation.mutate(pod(container(gpus=1), annotations={"team": "vision"}), namespace=NS,
                                 policies=policies)
        assert result.desired["metadata"]["annotations"] == {"team": "vision",
                                                             names.POLICY_ANNOTATION: f"training@{policies.revision}"}
        assert str(result.policy) == f"training@{policies.revision}"

    def test_the_annotation_path_escapes_the_slash(self):
        result = run(pod(container(gpus=1), annotations={"team": "vision"}))
        assert any(op["path"] == "/metadata/annotations/gpugate.io~1policy" for op in result.patch)

    def test_every_warning_names_the_policy_and_revision(self):
        result = run(labelled("2"), "placement: {strategy: pack}\n" + FIELDS)
        assert result.warnings and all(w.startswith(f"gpugate gp@{result.policy.revision}: ")
                                       for w in result.warnings)

    def test_audit_mode_computes_but_returns_no_patch(self):
        p = labelled("2", container("trainer"))
        result = run(p, "placement: {strategy: pack}", mode="audit")
        assert result.patch == () and result.desired == p and result.mode == "audit"
        assert result.policy is not None and result.policy.name == "gp"
        assert result.warnings and all(w.startswith("audit: ") for w in result.warnings)
        assert any("set nvidia.com/gpu: 2 (requests = limits) on container 'trainer'" in w for w in result.warnings)
        assert any("would apply" in w and "mode is audit" in w for w in result.warnings)

    def test_off_mode_does_nothing(self):
        p = labelled("2")
        result = run(p, "placement: {strategy: pack}\n" + FIELDS, mode="off")
        assert (result.patch, result.warnings, result.policy) == ((), (), None)
        assert result.desired == p

    def test_an_off_policy_lets_the_next_policy_apply(self):
        policies = load(policy("paused", FIELDS, priority=9, mode="off"), policy("base", "", priority=1))
        result = mutation.mutate(labelled("1"), namespace=NS, policies=policies)
        assert result.policy.name == "base" and "runtimeClassName" not in result.desired["spec"]

    def test_no_matching_policy_does_nothing(self):
        p = labelled("2")
        result = run(p, 'match: {namespaces: ["other"]}')
        assert (result.patch, result.policy, result.warnings) == ((), None, ())


# --- idempotence ---------------------------------------------------------------------------------

class TestIdempotence:
    def test_a_second_pass_does_not_switch_to_a_policy_the_first_pass_made_match(self):
        policies = load(policy("gpu-pods", "gpu: {products: [NVIDIA-H100-80GB-HBM3]}", priority=10),
                        policy("everyone", "match: {gpuOnly: false}\ngpu: {default: 1}", priority=0))
        first = mutation.mutate(pod(container()), namespace=NS, policies=policies)
        # "everyone" injects the GPU; the shaped pod is then a GPU pod that "gpu-pods" matches, so
        # mutation converges on it, as validation (which sees the shaped pod) will.
        assert first.policy.name == "gpu-pods" and first.patch
        assert first.desired["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert any("applies instead" in w for w in first.warnings)
        second = mutation.mutate(first.desired, namespace=NS, policies=policies)
        assert second.patch == (), second.patch


    def test_a_policy_switch_keeps_nothing_of_the_lower_policy(self):
        """The pod is annotated with the higher policy: its placement, not a mix of both."""
        policies = load(policy("gpu-pods", "placement: {strategy: pack}", priority=10),
                        policy("everyone", "match: {gpuOnly: false}\ngpu: {default: 1}\n"
                                           "placement: {strategy: spread, avoidCongested: preferred}", priority=0))
        result = mutation.mutate(pod(container()), namespace=NS, policies=policies)
        assert result.policy.name == "gpu-pods"
        preferred = spec_of(result)["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        keys = {t["preference"]["matchExpressions"][0]["key"] for t in preferred}
        assert keys == {names.GPU_FREE_LABEL}, "only pack terms; no spread or avoid-congested term of 'everyone'"
        assert mutation.mutate(result.desired, namespace=NS, policies=policies).patch == ()


# --- edge cases ----------------------------------------------------------------------------------

FULL = """
gpu: {default: 1, products: [NVIDIA-H100-80GB-HBM3], minMemoryMiB: 40000}
placement: {strategy: pack, avoidCongested: required, topology: {key: nvidia.com/gpu.clique}}
runtimeClassName: nvidia
"""


class TestEdgeCases:
    def test_a_pod_with_generate_name_only_is_mutated(self):
        p = labelled("1", name=None, generate_name="trainer-")
        result = run(p, FULL)
        assert result.patch and result.desired["metadata"]["generateName"] == "trainer-"
        assert "name" not in result.desired["metadata"]

    def test_the_namespace_comes_from_the_request_not_the_object(self):
        p = labelled("1")
        assert "namespace" not in p["metadata"]
        assert run(p, 'match: {namespaces: ["ml-*"]}', namespace="ml-a").patch
        assert not run(p, 'match: {namespaces: ["ml-*"]}', namespace="web-a").patch

    def test_a_pod_without_metadata_labels_or_annotations_gets_them_created(self):
        p = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "x-"},
             "spec": {"containers": [container(gpus=1)]}}
        result = run(p, FULL)
        assert names.POLICY_ANNOTATION in result.desired["metadata"]["annotations"]

    def test_a_pod_without_metadata_gets_the_annotation(self):
        p = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [container(gpus=1)]}}
        result = run(p)
        assert result.desired["metadata"] == {"annotations": {names.POLICY_ANNOTATION: str(result.policy)}}

    def test_a_pod_without_containers_gets_no_gpu_and_no_crash(self):
        p = labelled("1")
        p["spec"]["containers"] = []
        assert run(p).desired["spec"]["containers"] == []

    def test_everything_the_user_wrote_survives(self):
        affinity = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 3, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                   "values": ["z"]}]}}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}
        tolerations = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
        p = labelled("2", container("a", requests={"cpu": "1"}), container("b"), init=[container("setup")],
                     labels={names.GROUP_LABEL: "j", "app": "train"}, annotations={"note": "x"},
                     tolerations=copy.deepcopy(tolerations), nodeSelector={"pool": "a"},
                     affinity=copy.deepcopy(affinity), serviceAccountName="trainer")
        desired = run(p, FULL).desired
        spec = desired["spec"]
        assert spec["nodeSelector"] == {"pool": "a"} and spec["serviceAccountName"] == "trainer"
        assert spec["tolerations"][0] == tolerations[0]
        assert spec["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]
        assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0] == \
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert term["matchExpressions"][0] == {"key": "pool", "operator": "In", "values": ["a"]}
        assert desired["metadata"]["labels"] == p["metadata"]["labels"]
        assert desired["metadata"]["annotations"]["note"] == "x"
        assert spec["containers"][0]["resources"]["requests"]["cpu"] == "1"

    def test_mutating_the_result_again_changes_nothing(self):
        policies = load(policy("gp", FULL))
        p = labelled("2", labels={names.GROUP_LABEL: "j"}, tolerations=[{"key": "x", "operator": "Exists"}])
        first = mutation.mutate(p, namespace=NS, policies=policies)
        second = mutation.mutate(first.desired, namespace=NS, policies=policies)
        assert first.patch and second.patch == () and second.desired == first.desired

    def test_the_steps_run_in_the_declared_order(self):
        assert [s.__name__ for s in mutation.STEPS] == [
            "right_size", "inject_gpu_requests", "add_tolerations", "add_required_node_affinity",
            "add_placement_preferences", "add_topology_affinity", "set_scheduling_fields", "annotate_policy"]


class TestCopyOnWrite:
    """The desired pod shares what no step wrote with the input (the patch derivation skips shared
    subtrees by identity), and copies a container only when a request is written into it."""

    def test_only_the_container_given_a_gpu_is_copied_and_the_input_is_untouched(self):
        p = labelled("2", container("a", requests={"cpu": "1"}), container("b"), init=[container("setup")])
        desired = run(p).desired  # run() also checks the input is unchanged and the patch is exact
        written, untouched = desired["spec"]["containers"]
        assert gpu_limits(written) == {"nvidia.com/gpu": "2"} and written is not p["spec"]["containers"][0]
        assert untouched is p["spec"]["containers"][1]
        assert desired["spec"]["initContainers"][0] is p["spec"]["initContainers"][0]
        assert desired["metadata"]["labels"] is p["metadata"]["labels"]

    def test_a_pod_that_brings_its_own_gpu_shares_every_container(self):
        p = pod(container("a", gpus=1), container("b"))
        desired = run(p, FULL).desired
        assert all(d is c for d, c in zip(desired["spec"]["containers"], p["spec"]["containers"], strict=True))

    def test_filling_a_missing_request_copies_the_container_once_for_both_resources(self):
        c = container("a", limits={"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"})
        result = run(pod(c))
        (written,) = result.desired["spec"]["containers"]
        assert gpu_requests(written) == {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}
        assert [op["path"] for op in result.patch if "resources" in op["path"]] == [
            "/spec/containers/0/resources/requests"]

    def test_a_write_through_a_stale_container_is_a_bug_not_a_silent_edit_of_the_input(self):
        p = labelled("1")
        desired = desiredpod.working_copy(p)
        context = desiredpod.StepContext(policy=load(policy("gp")).policies[0], ref=None, namespace=NS)
        original = p["spec"]["containers"][0]
        context.set_request(desired, original, "requests", "nvidia.com/gpu", "1")
        with pytest.raises(ValueError, match="stale reference"):
            context.set_request(desired, original, "limits", "nvidia.com/gpu", "1")
        assert "resources" not in original
