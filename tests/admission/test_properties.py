"""Properties of mutation over generated pods AND generated policies.

Policies are written as GPUPolicy YAML and loaded through ``PolicySet.from_texts``, so every
generated case also passes the real schema and loader. Pods are generated valid (checked with
kubernetes-validate strict and ``assume``d), with labels, 1-3 containers, init containers and
the user's own tolerations, nodeSelector, affinity and resources, NVIDIA ones included.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, Phase, assume, find, given, settings
from hypothesis import strategies as st

from tests.kubeversion import KUBERNETES_VERSION
from webhook import names
from webhook.admission import dra, mutation, patches, validation
from webhook.kube import claims, pods
from webhook.kube.inventory import EMPTY, Inventory
from webhook.policy import PolicySet, matching, parsing

K8S = KUBERNETES_VERSION  # the target cluster: stack.yaml cluster.kubernetesVersion
PRESSURED = Inventory(generated_at=datetime(2026, 12, 1, tzinfo=UTC),
                      type_pressure=(("NVIDIA-A100-SXM4-80GB", 0.9), ("NVIDIA-H100-80GB-HBM3", 0.1), ("Tesla-T4", 1.5)))
"""A GPUInventory whose type pressure makes the pack strategy add its product relief (judged fresh:
mutate gets no clock here)."""

NAMESPACES = ["ml-a", "ml-b", "web-a", "research-x", "other"]
NS_GLOBS = ["*", "ml-*", "web-*", "ml-a", "research-?", "*-a"]
SELECTOR_KEYS = [names.PROFILE_LABEL, "team", "tier"]
SELECTOR_VALUES = ["training", "inference", "notebook", "a", "b"]
RESOURCES = [names.GPU_RESOURCE, names.SHARED_GPU_RESOURCE, "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "Tesla-T4"]
FAMILIES = ["hopper", "ampere", "turing"]


# --- policies -----------------------------------------------------------------------------------

def selector_expressions(keys: list[str], values: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    with_values = st.builds(lambda k, op, vs: {"key": k, "operator": op, "values": vs},
                            st.sampled_from(keys), st.sampled_from(["In", "NotIn"]),
                            st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True))
    without = st.builds(lambda k, op: {"key": k, "operator": op},
                        st.sampled_from(keys), st.sampled_from(["Exists", "DoesNotExist"]))
    return st.one_of(with_values, without)


label_selectors = st.fixed_dictionaries({}, optional={
    "matchLabels": st.dictionaries(st.sampled_from(SELECTOR_KEYS), st.sampled_from(SELECTOR_VALUES), max_size=2),
    "matchExpressions": st.lists(selector_expressions(SELECTOR_KEYS, SELECTOR_VALUES), max_size=2),
})

policy_tolerations = st.one_of(
    st.sampled_from(["auto", "none"]),
    st.lists(st.sampled_from([
        {"key": "pool", "value": "gpu", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    ]), max_size=2),
)


@st.composite
def gpu_specs(draw) -> dict[str, Any]:
    gpu: dict[str, Any] = {}
    if draw(st.booleans()):
        gpu["resource"] = draw(st.sampled_from(RESOURCES))
    if draw(st.booleans()):
        gpu["default"] = draw(st.integers(1, 4))
    if draw(st.booleans()):
        gpu["max"] = draw(st.integers(gpu.get("default", 1), 8))
    if draw(st.booleans()):
        gpu["allowedResources"] = draw(st.lists(st.sampled_from(RESOURCES), max_size=3, unique=True))
    if draw(st.booleans()):
        gpu["failRequestsGreaterThanOne"] = draw(st.booleans())
    if draw(st.booleans()):
        gpu["products"] = draw(st.lists(st.sampled_from(PRODUCTS), min_size=1, max_size=2, unique=True))
    if draw(st.booleans()):
        gpu["families"] = draw(st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=2, unique=True))
    if draw(st.booleans()):
        gpu["minMemoryMiB"] = draw(st.sampled_from([16000, 40000, 80000]))
    return gpu


@st.composite
def policy_documents(draw, name: str, priority: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": priority,
                            "mode": draw(st.sampled_from(["enforce", "enforce", "enforce", "audit", "off"]))}
    match: dict[str, Any] = {"namespaces": draw(st.lists(st.sampled_from(NS_GLOBS), min_size=1, max_size=2,
                                                         unique=True))}
    if draw(st.booleans()):
        match["excludeNamespaces"] = draw(st.lists(st.sampled_from(["web-*", "ml-b", "kube-*"]), min_size=1,
                                                   max_size=2, unique=True))
    match["podSelector"] = draw(label_selectors)
    match["gpuOnly"] = draw(st.booleans())
    spec["match"] = match
    spec["gpu"] = draw(gpu_specs())
    spec["tolerations"] = draw(policy_tolerations)
    for field, values in (("runtimeClassName", ["nvidia", "kata"]), ("priorityClassName", ["gpu-batch", "urgent"]),
                          ("schedulerName", ["gpugate-binpack", "volcano"])):
        if draw(st.integers(0, 3)) == 0:
            spec[field] = draw(st.sampled_from(values))
    placement: dict[str, Any] = {}
    if draw(st.booleans()):
        placement["strategy"] = draw(st.sampled_from(["pack", "spread", "none"]))
    if draw(st.booleans()):
        placement["avoidCongested"] = draw(st.sampled_from(["required", "preferred", "no"]))
    if draw(st.booleans()):
        key = draw(st.sampled_from([names.NVIDIA_CLIQUE_LABEL, "topology.kubernetes.io/zone"]))
        placement["topology"] = {"key": key, "mode": draw(st.sampled_from(["required", "preferred"]))}
    spec["placement"] = placement
    if draw(st.integers(0, 3)) == 0:
        spec["deny"] = [{"namespaces": ["web-*"], "message": "no GPUs in web namespaces"}]
    return {"apiVersion": names.POLICY_API_VERSION, "kind": names.POLICY_KIND, "metadata": {"name": name},
            "spec": spec}


@st.composite
def policy_sets(draw) -> PolicySet:
    """1-3 policies with distinct priorities (equal ones may be refused as overlapping), in 1-2 files."""
    priorities = draw(st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True))
    documents = [draw(policy_documents(f"policy-{i}", p)) for i, p in enumerate(priorities)]
    split = draw(st.integers(0, len(documents)))
    texts = [(f"f{i}.yaml", yaml.safe_dump_all(part, sort_keys=False))
             for i, part in enumerate((documents[:split], documents[split:])) if part]
    return parsing.parse(texts)


# --- pods ---------------------------------------------------------------------------------------

quantities = st.one_of(st.integers(1, 4).map(str), st.integers(1, 4))


@st.composite
def resource_blocks(draw) -> dict[str, Any] | None:
    if draw(st.integers(0, 3)) == 0:
        return None
    out: dict[str, Any] = copy.deepcopy(draw(st.sampled_from([{}, {}, {}, {"requests": {}}, {"limits": None}])))

    def section(name: str) -> dict[str, Any]:
        if out.get(name) is None:
            out[name] = {}
        return out[name]

    if draw(st.booleans()):
        section("requests").update({"cpu": draw(st.sampled_from(["100m", "2", 1])), "memory": "1Gi"})
    if draw(st.booleans()):
        section("limits")["memory"] = "2Gi"
    if draw(st.booleans()):
        resource = draw(st.sampled_from(RESOURCES))
        count = draw(quantities)
        shape = draw(st.sampled_from(["both", "both", "limits", "requests", "mismatch"]))
        if shape in ("both", "requests", "mismatch"):
            section("requests")[resource] = count
        if shape in ("both", "limits"):
            section("limits")[resource] = count
        if shape == "mismatch":
            section("limits")[resource] = str(int(count) + 1)
    return out


@st.composite
def containers(draw, prefix: str, min_size: int, max_size: int) -> list[dict[str, Any]]:
    n = draw(st.integers(min_size, max_size))
    out = []
    for i in range(n):
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "registry.example/app:1"}
        resources = draw(resource_blocks())
        if resources is not None:
            c["resources"] = resources
        out.append(c)
    return out


pod_tolerations = st.lists(st.sampled_from([
    {"operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu.shared", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"operator": "Exists", "effect": "NoExecute"},
]), min_size=1, max_size=3)

NODE_KEYS = ["pool", "zone", names.NVIDIA_PRODUCT_LABEL, names.NVIDIA_FAMILY_LABEL, names.GPU_LOAD_LABEL]
node_expressions = st.one_of(
    selector_expressions(NODE_KEYS, ["a", "b", "congested", *PRODUCTS[:1], *FAMILIES[:1]]),
    st.just({"key": names.NVIDIA_MEMORY_LABEL, "operator": "Gt", "values": ["39999"]}),
    st.just({"key": names.GPU_FREE_LABEL, "operator": "Lt", "values": ["3"]}),
)
node_terms = st.fixed_dictionaries({"matchExpressions": st.lists(node_expressions, min_size=1, max_size=2)})
pod_terms = st.builds(lambda k, v, t: {"labelSelector": {"matchLabels": {k: v}}, "topologyKey": t},
                      st.sampled_from(["app", names.GROUP_LABEL]), st.sampled_from(["db", "job-1"]),
                      st.sampled_from(["kubernetes.io/hostname", names.NVIDIA_CLIQUE_LABEL]))
affinities = st.fixed_dictionaries({}, optional={
    "nodeAffinity": st.fixed_dictionaries({}, optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
            {"nodeSelectorTerms": st.lists(node_terms, min_size=1, max_size=2)}),
        "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
            st.fixed_dictionaries({"weight": st.integers(1, 100), "preference": node_terms}), min_size=1, max_size=2),
    }),
    "podAffinity": st.fixed_dictionaries({}, optional={
        "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
            st.fixed_dictionaries({"weight": st.integers(1, 100), "podAffinityTerm": pod_terms}), min_size=1,
            max_size=2),
        "requiredDuringSchedulingIgnoredDuringExecution": st.lists(pod_terms, min_size=1, max_size=1),
    }),
    "podAntiAffinity": st.fixed_dictionaries({"requiredDuringSchedulingIgnoredDuringExecution": st.lists(
        pod_terms, min_size=1, max_size=1)}),
})

pod_labels = st.dictionaries(
    st.sampled_from([*SELECTOR_KEYS, names.GPUS_LABEL, *names.JOB_LABELS, names.SKIP_LABEL]),
    st.sampled_from(["", "0", "1", "2", "8", "two", "job-1", "true", "false", *SELECTOR_VALUES]),
    max_size=4,
)


@st.composite
def gpu_pods(draw) -> dict[str, Any]:
    regular = draw(containers("c", 1, 3))
    init = draw(containers("init", 0, 2))
    metadata: dict[str, Any] = {}
    if draw(st.booleans()):
        metadata["name"] = "pod-1"
    else:
        metadata["generateName"] = "job-"
    if draw(st.booleans()):
        metadata["namespace"] = draw(st.sampled_from(NAMESPACES))
    labels = draw(pod_labels)
    if labels:
        metadata["labels"] = labels
    if draw(st.integers(0, 3)) == 0:
        metadata["annotations"] = {names.CONTAINER_ANNOTATION: draw(st.sampled_from(["c0", "c1", "init0", "nope"])),
                                   "team": "vision"}
    spec: dict[str, Any] = {"containers": regular}
    if init:
        spec["initContainers"] = init
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.one_of(pod_tolerations, st.just([])))
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(st.dictionaries(st.sampled_from(["pool", names.NVIDIA_PRODUCT_LABEL]),
                                                    st.sampled_from(["a", PRODUCTS[2]]), min_size=1))
    if draw(st.booleans()):
        spec["affinity"] = draw(st.one_of(affinities, st.just({"nodeAffinity": {}}), st.just({"podAffinity": None})))
    for field, values in (("schedulerName", ["default-scheduler", "volcano"]), ("runtimeClassName", ["kata"]),
                          ("priorityClassName", ["urgent"])):
        if draw(st.integers(0, 3)) == 0:
            spec[field] = draw(st.sampled_from(values))
    if draw(st.integers(0, 3)) == 0:
        spec["priority"] = 0
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def valid_pod(p: dict[str, Any]) -> bool:
    try:
        kubernetes_validate.validate(copy.deepcopy(p), K8S, strict=True)
    except kubernetes_validate.ValidationError:
        return False
    return True


cases = st.tuples(gpu_pods(), policy_sets(), st.sampled_from(NAMESPACES))


# --- the properties ------------------------------------------------------------------------------

SET_LIKE = {"tolerations", "nodeSelectorTerms", "matchExpressions", "preferredDuringSchedulingIgnoredDuringExecution",
            "requiredDuringSchedulingIgnoredDuringExecution"}


def contained(original: Any, result: Any, key: str | None = None) -> bool:
    """Every value of ``original`` is still in ``result``: dict members by key, set-like lists by membership
    (tolerations and affinity terms may gain members; a kept term may gain expressions), other lists by position.
    An explicit null is "not set", so a step may fill it."""
    if original is None:
        return True
    if isinstance(original, dict):
        return isinstance(result, dict) and all(k in result and contained(v, result[k], k) for k, v in original.items())
    if isinstance(original, list):
        if not isinstance(result, list):
            return False
        if key in SET_LIKE:
            return all(any(contained(item, candidate) for candidate in result) for item in original)
        return len(result) >= len(original) and all(contained(a, b) for a, b in zip(original, result, strict=False))
    return type(original) is type(result) and original == result


def overridable(p: dict[str, Any], policies: PolicySet, namespace: str, final: str | None = None) -> dict[str, Any]:
    """The input minus the values a policy may legitimately replace: 'default-scheduler' (the API server's
    default, i.e. not chosen) and spec.priority when the policy sets the priority class. Both the policy
    selected for the input and the one the shaped pod converged on (``final``) count."""
    applied = [matching.select(policies, p, namespace=namespace), policies.get(final) if final else None]
    out = copy.deepcopy(p)
    spec = out["spec"]
    for chosen in filter(None, applied):
        if chosen.scheduler_name and spec.get("schedulerName") == "default-scheduler":
            del spec["schedulerName"]
        if chosen.priority_class_name and not spec.get("priorityClassName"):
            spec.pop("priority", None)
    return out


def check_patch_applies(p, result) -> None:
    """(1) The patch, applied with jsonpatch to the input, gives exactly the desired pod."""
    patched = jsonpatch.apply_patch(p, list(result.patch))
    if result.mode == "audit" or result.policy is None:
        assert result.patch == () and result.desired == p
    else:
        assert patched == result.desired, "(1) patch applied to the input differs from desired"


def check_idempotent(result, policies, namespace, inventory: Inventory = EMPTY) -> None:
    """(3) Mutating the result again yields an empty patch (reinvocationPolicy: IfNeeded is safe),
    also when the shaped pod matches another policy than the input did (TestIdempotence)."""
    second = mutation.mutate(result.desired, namespace=namespace, policies=policies, inventory=inventory)
    assert second.patch == (), f"(3) second mutation still patches: {second.patch}"


def check_user_fields_kept(p, result, policies, namespace) -> None:
    """(4) Every field the user set is still there with its value."""
    final = result.policy.name if result.policy else None
    assert contained(overridable(p, policies, namespace, final), result.desired), "(4) a user field was lost or changed"


def check_requests_equal_limits(p, result) -> None:
    """GPU requests == limits after mutation, except a mismatch the user wrote (left for validation to deny)."""
    if not result.patch:
        return
    for (_, before), (kind, after) in zip(pods.all_containers(p), pods.all_containers(result.desired), strict=True):
        for resource in pods.gpu_resources(after):
            requests = pods.resource_section(after, "requests").get(resource)
            limits = pods.resource_section(after, "limits").get(resource)
            written = (pods.resource_section(before, "requests").get(resource),
                       pods.resource_section(before, "limits").get(resource))
            if None not in written:
                assert (requests, limits) == written, "a user's own pair is never rewritten"
            else:
                assert requests == limits, (kind, after["name"], resource)


# One generated case feeds several properties: generating and loading policies costs more than checking.
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.sampled_from([EMPTY, PRESSURED]))
def test_mutation_properties_over_generated_pods_and_policies(case, inventory):
    """(1) patch applies, (3) idempotent, (4) user fields kept, requests == limits, validation answers;
    with and without a GPUInventory whose type pressure adds the pack strategy's product relief."""
    p, policies, namespace = case
    original = copy.deepcopy(p)
    result = mutation.mutate(p, namespace=namespace, policies=policies, inventory=inventory)
    assert p == original, "mutate edited its input"
    check_patch_applies(p, result)
    check_idempotent(result, policies, namespace, inventory)
    check_user_fields_kept(p, result, policies, namespace)
    check_requests_equal_limits(p, result)
    verdict = validation.validate(result.desired, namespace=namespace, policies=policies)
    assert verdict.allowed or verdict.reasons


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.sampled_from([EMPTY, PRESSURED]))
def test_the_desired_pod_passes_kubernetes_validation(case, inventory):
    """(2) A valid pod stays valid for the target cluster's Pod schema in strict mode (no unknown or mistyped field)."""
    p, policies, namespace = case
    assume(valid_pod(p))
    result = mutation.mutate(p, namespace=namespace, policies=policies, inventory=inventory)
    kubernetes_validate.validate(copy.deepcopy(result.desired), K8S, strict=True)


def test_the_strategies_reach_the_interesting_cases():
    """Guard against a strategy that silently never produces a patch or never loads a policy."""
    quick = settings(max_examples=500, database=None, phases=[Phase.generate])   # no shrinking: any hit will do

    def outcome(case):
        return mutation.mutate(case[0], namespace=case[2], policies=case[1])

    find(cases, lambda c: len(outcome(c).patch) >= 4, settings=quick)
    find(cases, lambda c: outcome(c).mode == "audit" and bool(outcome(c).warnings), settings=quick)
    find(cases, lambda c: any("kept the pod's" in w for w in outcome(c).warnings), settings=quick)
    relieved = "pinned to a GPU product need most"
    find(cases, lambda c: any(relieved in w for w in mutation.mutate(
        c[0], namespace=c[2], policies=c[1], inventory=PRESSURED).warnings), settings=quick)


# --- the patch helper on its own ------------------------------------------------------------------

scalars = st.one_of(st.integers(0, 3), st.sampled_from(["a", "b", "nvidia.com/gpu"]))
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["x", "y", "a/b", "~t"]), inner,
                                                                 max_size=3),
    max_leaves=12,
)


@st.composite
def grown(draw) -> tuple[Any, Any]:
    """A document and a copy that only GREW (keys added, list members appended), as the mutation steps do."""
    source = draw(documents)
    desired = copy.deepcopy(source)
    for _ in range(draw(st.integers(1, 3))):
        node = desired
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            node = node[draw(st.sampled_from(sorted(node)))] if isinstance(node, dict) else node[
                draw(st.integers(0, len(node) - 1))]
        if isinstance(node, dict):
            key = draw(st.sampled_from(["n", "m/1", "x"]))
            if key not in node:
                node[key] = draw(documents.filter(lambda v: v not in ({}, [])))
        elif isinstance(node, list):
            node.append(draw(documents.filter(lambda v: v not in ({}, []))))
    return source, desired


@settings(max_examples=300, deadline=None)
@given(grown())
def test_make_patch_turns_the_source_into_a_grown_desired(pair):
    source, desired = pair
    assert jsonpatch.apply_patch(source, list(patches.make_patch(source, desired))) == desired


TWO_CONTAINERS = {"spec": {"containers": [
    {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def _recount(counts: tuple[str, str]) -> dict[str, Any]:
    desired = copy.deepcopy(TWO_CONTAINERS)
    for container_, count in zip(desired["spec"]["containers"], counts, strict=True):
        container_["resources"]["limits"]["nvidia.com/gpu"] = count
    return desired


@pytest.mark.parametrize(("source", "desired"), [
    (TWO_CONTAINERS, _recount(("2", "3"))),
    ({"a": [0, []]}, {"a": [[], [[]]]}),
], ids=["two containers' counts change: container a is removed, a stub without name is added",
        "a nested new value: the marker string leaks into the patch"])
def test_make_patch_changing_two_members_of_an_equal_length_list(source, desired):
    patch = list(patches.make_patch(source, desired))
    assert "\0new-" not in repr(patch)
    assert jsonpatch.apply_patch(source, patch) == desired


# --- pods that ask GPUs only through ResourceClaims -----------------------------------

CLAIM_TEMPLATE = "train-gpus"
GPU_LABELS = {names.GPUS_LABEL, names.GPU_MEMORY_LABEL, names.GPU_FRACTION_LABEL}


def _without_gpus(p: dict[str, Any]) -> dict[str, Any]:
    """The pod with no NVIDIA resource in any container and no gpugate label asking for GPUs."""
    out = copy.deepcopy(p)
    for _, container in pods.all_containers(out):
        for section in ("requests", "limits"):
            found = pods.resource_section(container, section)
            for resource in [r for r in found if r.startswith(names.NVIDIA_PREFIX)]:
                del found[resource]
    labels = out["metadata"].get("labels")
    if labels:
        out["metadata"]["labels"] = {k: v for k, v in labels.items() if k not in GPU_LABELS}
    return out


def _template(count: int) -> dict[str, Any]:
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND, "metadata": {"name": CLAIM_TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": names.DRA_GPU_CLASS, "count": count}}]}}}}


@st.composite
def claim_pods(draw) -> tuple[dict[str, Any], dict[str, Any], dict[tuple[str, str], claims.ClaimAsk]]:
    """(a pod asking ``count`` GPUs only through a claim template, its twin asking ``nvidia.com/gpu: count``
    of the device plugin on its first container instead, what the template asks)."""
    base = _without_gpus(draw(gpu_pods()))
    count = draw(st.integers(1, 4))
    claimed = copy.deepcopy(base)
    claimed["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": CLAIM_TEMPLATE}]
    first = claimed["spec"]["containers"][0]
    first["resources"] = {**(first.get("resources") or {}), "claims": [{"name": "gpus"}]}
    twin = copy.deepcopy(base)
    resources = twin["spec"]["containers"][0].setdefault("resources", {})
    for section in ("requests", "limits"):
        if resources.get(section) is None:
            resources[section] = {}
        resources[section][names.GPU_RESOURCE] = str(count)
    return claimed, twin, dra.resolve_documents([_template(count)])


claim_cases = st.tuples(claim_pods(), policy_sets(), st.sampled_from(NAMESPACES))


def _tolerations_and_preferences(p: dict[str, Any]) -> tuple[Any, Any]:
    spec = p["spec"]
    return spec.get("tolerations"), ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claim_cases, st.sampled_from([EMPTY, PRESSURED]))
def test_a_claim_only_pod_is_shaped_as_its_device_plugin_twin(case, inventory):
    """(1) patch applies, (3) idempotent (with the same claims read), (4) user fields kept, and the
    tolerations and preferred node affinity the claim-only pod gets are exactly its twin's, the pod
    asking the same count of ``nvidia.com/gpu`` from a device plugin."""
    (claimed, twin, resolved), policies, namespace = case
    original = copy.deepcopy(claimed)
    result = mutation.mutate(claimed, namespace=namespace, policies=policies, inventory=inventory, resolved=resolved)
    assert claimed == original, "mutate edited its input"
    check_patch_applies(claimed, result)
    again = mutation.mutate(result.desired, namespace=namespace, policies=policies, inventory=inventory,
                            resolved=resolved)
    assert again.patch == (), f"(3) second mutation still patches: {again.patch}"
    check_user_fields_kept(claimed, result, policies, namespace)
    assert not pods.requested_gpu_resources(result.desired), "a GPU resource was added to a pod a claim serves"
    expected = mutation.mutate(twin, namespace=namespace, policies=policies, inventory=inventory)
    assert (result.policy, result.mode) == (expected.policy, expected.mode)
    assert _tolerations_and_preferences(result.desired) == _tolerations_and_preferences(expected.desired)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claim_cases, st.sampled_from([EMPTY, PRESSURED]))
def test_a_shaped_claim_only_pod_passes_kubernetes_validation(case, inventory):
    """(2) for claim-only pods: the desired pod is a valid Pod of the target cluster, strict."""
    (claimed, _, resolved), policies, namespace = case
    assume(valid_pod(claimed))
    result = mutation.mutate(claimed, namespace=namespace, policies=policies, inventory=inventory, resolved=resolved)
    kubernetes_validate.validate(copy.deepcopy(result.desired), K8S, strict=True)


def test_claim_only_pods_reach_tolerations_and_placement() -> None:
    """Guard: the claim strategy produces shaped pods (a toleration of the GPU taint, a pack term)."""
    quick = settings(max_examples=400, database=None, phases=[Phase.generate])

    def shaped(case) -> dict[str, Any]:
        (claimed, _, resolved), policies, namespace = case
        return mutation.mutate(claimed, namespace=namespace, policies=policies, resolved=resolved).desired

    gpu_taint = {"key": names.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    find(claim_cases, lambda c: gpu_taint in (shaped(c)["spec"].get("tolerations") or []), settings=quick)
    find(claim_cases, lambda c: names.GPU_FREE_LABEL in str(_tolerations_and_preferences(shaped(c))[1]),
         settings=quick)
