"""Policies govern DRA claims: a claim or template asking an NVIDIA DeviceClass is judged
as an extended-resource ask is, and mutation keeps the pod rules (patch applies, strict schema,
idempotent, the author's fields kept) for claims too."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kubeversion import KUBERNETES_VERSION
from tests.policy.kit import container, load, pod, policy
from webhook import names
from webhook.admission import chain, dra, validation
from webhook.kube import claims, units
from webhook.policy import PolicySet


def template(*requests: dict[str, Any], name: str = "gpus", labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": claims.API_VERSION, "kind": claims.TEMPLATE_KIND, "metadata": meta,
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def resource_claim(*requests: dict[str, Any], name: str = "gpus") -> dict[str, Any]:
    return {"apiVersion": claims.API_VERSION, "kind": claims.CLAIM_KIND, "metadata": {"name": name},
            "spec": {"devices": {"requests": list(requests)}}}


def exactly(name: str = "gpu", cls: str = "gpu.nvidia.com", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, **fields}}


POLICIES = load(
    policy("web", """
        match: {namespaces: ["web-*"]}
        deny: [{message: "GPUs are not available in web namespaces"}]
    """, priority=1000),
    policy("training", """
        match: {namespaces: ["ml-*"]}
        gpu: {max: 8, products: [NVIDIA-H100-80GB-HBM3], minMemoryMiB: 40000}
    """, priority=100),
    policy("admin", """
        match: {namespaces: ["ops"]}
        gpu: {max: 2}
        claims: {allowAllocationModeAll: true, allowAdminAccess: true, deviceClasses: [gpu.nvidia.com]}
    """, priority=100),
)


def verdict(document: dict[str, Any], namespace: str, policies: PolicySet = POLICIES) -> validation.Verdict:
    mutated = dra.mutate_claim(document, namespace=namespace, policies=policies).desired
    return dra.validate_claim(mutated, namespace=namespace, policies=policies)


def test_a_template_in_a_web_namespace_is_refused_with_the_policys_message() -> None:
    result = verdict(template(exactly(count=8), name="eight"), "web-shop")
    assert not result.allowed
    assert result.message.startswith("ResourceClaimTemplate 'eight' in namespace 'web-shop': request 'gpu' asks 8 "
                                     "gpu.nvidia.com; GPUs are not available in web namespaces (policy web@")


def test_a_claim_for_other_devices_is_not_a_gpu_ask() -> None:
    assert verdict(template(exactly(cls="fpga.example.com", count=8)), "web-shop").allowed


@pytest.mark.parametrize(("request_", "fragment"), [
    (exactly(count=9), "request 'gpu' asks 9 gpu.nvidia.com devices; policy training@"),
    (exactly(allocationMode="All"), "asks allocationMode: All"),
    (exactly(adminAccess=True), "asks adminAccess"),
    (exactly(cls="mig.nvidia.com"), "asks DeviceClass mig.nvidia.com, which policy training@"),
])
def test_the_policys_claim_rules(request_: dict[str, Any], fragment: str) -> None:
    result = verdict(resource_claim(request_), "ml-team")
    assert not result.allowed and fragment in result.message, result.message
    assert "ResourceClaim 'gpus' in namespace 'ml-team'" in result.message


def test_the_requests_of_one_claim_add_up_and_the_largest_alternative_counts() -> None:
    claim = resource_claim(exactly("a", count=4), {"name": "b", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 5},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]})
    result = verdict(claim, "ml-team")
    assert not result.allowed and "asks up to 9 GPU devices across its requests" in result.message


def test_a_policy_may_allow_all_and_admin_access() -> None:
    assert verdict(resource_claim(exactly(allocationMode="All", adminAccess=True)), "ops").allowed


def test_mutation_adds_the_policys_selectors_to_every_gpu_ask_and_keeps_the_authors() -> None:
    own = {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].type == "gpu"'}}
    claim = resource_claim({"name": "g", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": [own]},
        {"name": "nic", "deviceClassName": "nic.example.com"}]})
    result = dra.mutate_claim(claim, namespace="ml-team", policies=POLICIES)
    first, nic = result.desired["spec"]["devices"]["requests"][0]["firstAvailable"]
    expressions = [s["cel"]["expression"] for s in first["selectors"]]
    assert expressions == [own["cel"]["expression"], claims.product_selector(("NVIDIA-H100-80GB-HBM3",)),
                           claims.memory_selector(40000)]
    assert "selectors" not in nic  # another driver's device is not a GPU
    assert result.desired["metadata"]["annotations"][names.POLICY_ANNOTATION] == f"training@{POLICIES.revision}"
    assert dra.validate_claim(result.desired, namespace="ml-team", policies=POLICIES).allowed


def test_the_skip_label_opts_a_claim_out_of_shaping_never_out_of_the_rules() -> None:
    claim = resource_claim(exactly())
    claim["metadata"]["labels"] = {names.SKIP_LABEL: "true"}
    assert dra.mutate_claim(claim, namespace="ml-team", policies=POLICIES).patch == ()
    result = dra.validate_claim(claim, namespace="ml-team", policies=POLICIES)
    assert not result.allowed and "lacks the selector" in result.message


def test_a_sub_request_without_the_selector_escapes_the_requirement_and_is_denied() -> None:
    shaped = dra.mutate_claim(resource_claim(exactly()), namespace="ml-team", policies=POLICIES).desired
    escaped = copy.deepcopy(shaped)
    request = escaped["spec"]["devices"]["requests"][0]
    escaped["spec"]["devices"]["requests"][0] = {"name": "gpu", "firstAvailable": [
        {"name": "h100", **request["exactly"]}, {"name": "any", "deviceClassName": "gpu.nvidia.com"}]}
    result = dra.validate_claim(escaped, namespace="ml-team", policies=POLICIES)
    assert not result.allowed
    assert "request 'gpu/any' may get devices outside the policy's requirement (products NVIDIA-H100-80GB-HBM3; " \
           "at least 40000 MiB of GPU memory)" in result.message


def test_a_pod_over_max_through_the_claims_it_references_is_refused() -> None:
    four = claims.parse(template(exactly(count=4), name="four"))
    p = pod(container("trainer"))
    p["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimTemplateName": "four"},
                                   {"name": "b", "resourceClaimTemplateName": "four"}]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "a"}, {"name": "b"}]}
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    resolved = {("ResourceClaimTemplate", "four"): four}
    result = dra.validate_pod_claims(p, namespace="ml-team", policies=POLICIES, resolved=resolved)
    assert not result.allowed
    # What was counted, by the names the pod itself wrote: never what a referenced object asks.
    assert result.message == (
        f"pod 'pod-1' in namespace 'ml-team' asks more than 8 GPUs in all (container 'trainer' nvidia.com/gpu: 1; "
        f"the ResourceClaims and templates its claims 'a', 'b' name, counted by their devices and capacity); "
        f"policy training@{POLICIES.revision} allows 8 per pod. Reference fewer or smaller claims, or split the "
        f"job into several pods")
    assert "four" not in result.message and "4" not in result.message
    p["spec"]["containers"][0]["resources"]["limits"] = {}
    assert dra.validate_pod_claims(p, namespace="ml-team", policies=POLICIES, resolved=resolved).allowed


def test_a_pod_naming_a_claim_that_cannot_be_read_is_refused_at_creation() -> None:
    """A claim created after the pod that names it would never be counted with the pod: such a pod
    is refused, and the message reads the same whether the claim is absent or could not be read."""
    p = pod(container("trainer"))
    p["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "later"}]
    result = dra.validate_pod_claims(p, namespace="ml-team", policies=POLICIES, resolved={})
    assert not result.allowed
    assert result.message == (
        "pod 'pod-1' in namespace 'ml-team': its claim 'c' names ResourceClaim 'later', which gpugate could not "
        "read (it does not exist yet, or reading it failed), so its GPUs cannot be counted. Create claims and "
        "templates before the pods that use them")


def test_max_counts_claims_in_gpu_units_by_their_devices_and_capacity() -> None:
    """A MIG device pinned by its profile is g/7 of a GPU; a share of a device that allows several
    allocations is its memory over the least memory its selectors allow; else a device is one GPU."""
    slices = claims.parse(template(exactly(cls="mig.nvidia.com", count=7, selectors=[{"cel": {"expression": (
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].profile == "1g.10gb"')}}]),
        name="slices"))
    share = claims.parse(template(exactly(count=2, selectors=[
        {"cel": {"expression": names.DRA_SHARE_SELECTOR}},
        {"cel": {"expression": claims.memory_selector(40960)}}], capacity={"requests": {"memory": "20Gi"}}),
        name="share"))
    unpinned = claims.parse(template(exactly(cls="mig.nvidia.com", count=2), name="unpinned"))
    gpus = units.gpu_names()
    assert units.claim_units(slices, gpus) == 1
    assert units.claim_units(share, gpus) == 1  # two halves
    assert units.claim_units(unpinned, gpus) == 2  # a MIG device of no known profile: at most a GPU each
    # A selector that only looks like a pin (a string holding "&&") proves nothing.
    tricked = claims.parse(template(exactly(cls="gpu.nvidia.com", count=2, selectors=[{"cel": {"expression": (
        "device.attributes[\"x\"].s == r'a && device.attributes[\"gpu.nvidia.com\"].profile == \"1g.10gb\" && b'")}}]),
        name="tricked"))
    assert units.claim_units(tricked, gpus) == 2


def test_a_pod_using_a_gpu_claim_in_a_web_namespace_meets_the_deny_rule() -> None:
    p = pod(container("web"))
    p["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "one"}]
    result = dra.validate_pod_claims(p, namespace="web-a", policies=POLICIES,
                                     resolved={("ResourceClaim", "one"): claims.parse(resource_claim(exactly(),
                                                                                                     name="one"))})
    assert not result.allowed and "GPUs are not available in web namespaces" in result.message


def claim_only_pod(*, labels: dict[str, str] | None = None) -> dict[str, Any]:
    p = pod(container("trainer"), labels=labels)
    p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two"}]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    return p


TWO = {("ResourceClaimTemplate", "two"): claims.parse(template(exactly(count=2), name="two"))}
SHAPING = load(policy("everyone", """
    match: {namespaces: ["ml-*"], gpuOnly: false}
    gpu: {default: 1, products: [NVIDIA-H100-80GB-HBM3]}
    placement: {strategy: pack, avoidCongested: preferred}
"""))


def test_a_pod_asking_gpus_only_through_claims_gets_tolerations_and_placement_terms() -> None:
    admitted = chain.admit(claim_only_pod(), namespace="ml-team", policies=SHAPING, resolved=TWO)
    spec = admitted.stored["spec"] if admitted.stored else {}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    preferred = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    # pack for two GPUs (the claim's count): fewer free GPUs than 3, 4, 6 and 10; then not congested
    assert [t["preference"]["matchExpressions"][0].get("values") for t in preferred] == [
        ["3"], ["4"], ["6"], ["10"], ["congested"]]
    # no device-plugin GPU on top of the claim's (the policy's default would add one to a CPU pod), and no
    # required node affinity: the claim's CEL selectors carry the product requirement
    assert not any("nvidia.com/gpu" in (c.get("resources") or {}).get("limits", {}) for c in spec["containers"])
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["nodeAffinity"]


def test_claims_not_read_get_no_default_gpu_and_a_gpus_label_adds_nothing_to_a_claim_pod() -> None:
    unread = chain.mutate(claim_only_pod(), namespace="ml-team", policies=SHAPING, resolved={})
    assert "limits" not in unread.desired["spec"]["containers"][0]["resources"]
    assert any("--resolve-claims" in w for w in unread.warnings)
    cpu_pod = chain.mutate(pod(container("trainer")), namespace="ml-team", policies=SHAPING)
    assert cpu_pod.desired["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    labelled = chain.mutate(claim_only_pod(labels={names.GPUS_LABEL: "4"}), namespace="ml-team", policies=SHAPING,
                            resolved=TWO)
    assert any("holds GPUs through its ResourceClaims" in w for w in labelled.warnings)
    assert "limits" not in labelled.desired["spec"]["containers"][0]["resources"]


def scheduler_made(count: int = 6, **changes: Any) -> dict[str, Any]:
    """The claim kube-scheduler v1.36 creates for a pod's mapped nvidia.com/gpu (as seen on the e2e plane)."""
    claim = {"apiVersion": claims.API_VERSION, "kind": claims.CLAIM_KIND,
             "metadata": {"generateName": "mapped-extended-resources-",
                          "annotations": {claims.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
                          "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "mapped", "uid": "u-1",
                                               "controller": True}]},
             "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}}]}}}
    for path, value in changes.items():
        target = claim
        *parents, last = path.split(".")
        for key in parents:
            target = target[key] if not key.isdigit() else target[int(key)]  # type: ignore[index]
        target[last] = value
    return claim


def owner_pod(count: int = 6, *, uid: str = "u-1", resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    p = pod(container("main", limits={resource: str(count)}), name="mapped")
    p["metadata"]["uid"] = uid
    return p


def test_a_claim_kube_scheduler_made_for_a_pods_extended_resources_is_judged_by_its_pod() -> None:
    """Over training's max per claim and with no product selector, yet allowed and left as it is: the
    pod's nvidia.com/gpu was judged when it was admitted, and kube-scheduler allocated it already."""
    document = scheduler_made(count=9)
    owner = dra.ClaimContext(owner=owner_pod(9))
    assert claims.parse(document).scheduler_made
    assert dra.mutate_claim(document, namespace="ml-team", policies=POLICIES).patch == ()
    assert dra.validate_claim(document, namespace="ml-team", policies=POLICIES, context=owner).allowed
    assert dra.validate_claim(document, namespace="web-a", policies=POLICIES, context=owner).allowed


@pytest.mark.parametrize("owner", [
    None,
    owner_pod(9, uid="u-2"),
    owner_pod(2),
    owner_pod(9, resource="deviceclass.resource.kubernetes.io/mig.nvidia.com"),
], ids=["no such pod", "another uid", "the pod asks fewer", "the pod asks another class"])
def test_a_claim_in_the_schedulers_shape_is_trusted_only_as_what_its_pod_asks(owner: dict[str, Any] | None) -> None:
    """Owner references are not authenticated: unless the pod exists with that UID and asks exactly
    those devices, the claim is judged as a user's claim (here over max, and denied in web)."""
    document = scheduler_made(count=9)
    context = dra.ClaimContext(owner=owner)
    assert not dra.validate_claim(document, namespace="ml-team", policies=POLICIES, context=context).allowed
    web = dra.validate_claim(document, namespace="web-a", policies=POLICIES, context=context)
    assert not web.allowed and "GPUs are not available in web namespaces" in web.message


def generated(count: int, *, entry: str = "gpus", uid: str = "u-1") -> dict[str, Any]:
    """A claim as the resourceclaim controller makes it from a pod's template (e2e-observed shape)."""
    shaped = [{"cel": {"expression": e}} for e in (claims.product_selector(("NVIDIA-H100-80GB-HBM3",)),
                                                    claims.memory_selector(40000))]
    claim = resource_claim(exactly(count=count, selectors=shaped), name="trainer-gpus-x7k2p")
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": entry}
    claim["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": uid,
                                             "controller": True, "blockOwnerDeletion": True}]
    return claim


def template_pod(own_gpus: int = 0) -> dict[str, Any]:
    p = pod(container("trainer", gpus=own_gpus or None), name="trainer")
    p["metadata"]["uid"] = "u-1"
    p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "small"}]
    return p


@pytest.mark.parametrize(("count", "own", "allowed"), [(2, 1, True), (9, 0, False), (2, 7, False)])
def test_a_claim_made_from_a_template_is_judged_with_its_pod(count: int, own: int, allowed: bool) -> None:
    """The controller copies the template as it is when it makes the claim: the claim, not the
    template the pod was admitted with, is what the pod gets, so it is judged with the pod."""
    context = dra.ClaimContext(owner=template_pod(own))
    result = dra.validate_claim(generated(count), namespace="ml-team", policies=POLICIES, context=context)
    assert result.allowed is allowed, result.reasons
    if not allowed:
        assert "the pod it is made for would then hold GPUs its policy does not allow" in result.message \
            or "allows 8" in result.message


def test_a_claim_whose_owner_is_another_pod_is_judged_as_a_users_claim() -> None:
    context = dra.ClaimContext(owner=template_pod())
    forged = generated(2, uid="u-other")
    web = dra.validate_claim(forged, namespace="web-a", policies=POLICIES, context=context)
    assert not web.allowed and "GPUs are not available in web namespaces" in web.message


@pytest.mark.parametrize(("count", "allowed"), [(7, True), (8, False)])
def test_a_claim_created_after_the_pods_that_name_it_is_judged_with_them(count: int, allowed: bool) -> None:
    """Delete a claim a pod names and create it again larger: the pod already asks one GPU of its
    own, so 8 more is over training's max of 8 per pod. The message names no pod."""
    naming = pod(container("trainer", gpus=1), name="secret-pod")
    naming["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "gpus"}]
    context = dra.ClaimContext(naming=((naming, {}),))
    claim = resource_claim(exactly(count=count, selectors=[{"cel": {"expression": e}} for e in (
        claims.product_selector(("NVIDIA-H100-80GB-HBM3",)), claims.memory_selector(40000))]))
    result = dra.validate_claim(claim, namespace="ml-team", policies=POLICIES, context=context)
    assert result.allowed is allowed, result.reasons
    if not allowed:
        assert result.message == (
            "ResourceClaim 'gpus' in namespace 'ml-team': a pod that already names it would then hold GPUs its "
            "policy does not allow (more than its max per pod, or where a deny rule forbids GPUs); delete the pods "
            "that name it first, or create a claim they may hold")


@pytest.mark.parametrize("changes", [
    {"metadata.annotations": {}},
    {"metadata.ownerReferences": []},
    {"metadata.ownerReferences.0.kind": "Job"},
    {"metadata.ownerReferences.0.controller": False},
    {"spec.devices.requests.0.name": "gpu"},
    {"spec.devices.requests.0.exactly.selectors": [{"cel": {"expression": "true"}}]},
    {"spec.devices.requests.0.exactly.adminAccess": True},
    {"spec.devices.requests.0.exactly.allocationMode": "All"},
    {"spec.devices.config": []},
    {"kind": claims.TEMPLATE_KIND},
], ids=lambda c: next(iter(c)))
def test_a_claim_of_any_other_shape_is_judged_on_its_own(changes: dict[str, Any]) -> None:
    document = scheduler_made(count=9, **changes)
    if document["kind"] == claims.TEMPLATE_KIND:
        document["spec"] = {"spec": document["spec"]}
    assert not claims.parse(document).scheduler_made
    assert not dra.validate_claim(document, namespace="ml-team", policies=POLICIES).allowed


def test_a_pod_may_not_reference_a_claim_kube_scheduler_made_for_another() -> None:
    p = pod(container("borrower"))
    p["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "mapped-extended-resources-x"}]
    made = claims.parse({**scheduler_made(), "metadata": {**scheduler_made()["metadata"],
                                                          "name": "mapped-extended-resources-x"}})
    result = dra.validate_pod_claims(p, namespace="ml-team", policies=POLICIES,
                                     resolved={("ResourceClaim", "mapped-extended-resources-x"): made})
    assert not result.allowed and "which only the pod kube-scheduler made it for may use" in result.message


# --- properties: the pod rules hold for claims ---------------------------------------------------

CLASSES = ["gpu.nvidia.com", "mig.nvidia.com", "nic.example.com"]
USER_SELECTOR = {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].type == "gpu"'}}
label_values = st.sampled_from(["training", "a"])


@st.composite
def ask_bodies(draw: st.DrawFn, sub: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceClassName": draw(st.sampled_from(CLASSES))}
    if draw(st.booleans()):
        out["count"] = draw(st.integers(1, 4))
    if draw(st.booleans()):
        out["selectors"] = [USER_SELECTOR]
    if draw(st.booleans()):
        out["capacity"] = {"requests": {"memory": "10Gi"}}
    if not sub and draw(st.booleans()):
        out["adminAccess"] = False
    return out


@st.composite
def claim_documents(draw: st.DrawFn) -> dict[str, Any]:
    requests = []
    for i in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            requests.append({"name": f"r{i}", "exactly": draw(ask_bodies(sub=False))})
        else:
            subs = [{"name": f"s{j}", **draw(ask_bodies(sub=True))} for j in range(draw(st.integers(1, 3)))]
            requests.append({"name": f"r{i}", "firstAvailable": subs})
    kind = draw(st.sampled_from([claims.CLAIM_KIND, claims.TEMPLATE_KIND]))
    meta: dict[str, Any] = {"name": "c", "annotations": {"team": "x"}}
    if draw(st.booleans()):
        meta["labels"] = {names.PROFILE_LABEL: draw(label_values)}
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    return {"apiVersion": claims.API_VERSION, "kind": kind, "metadata": meta,
            "spec": {"spec": spec} if kind == claims.TEMPLATE_KIND else spec}


policy_sets = st.sampled_from([POLICIES, load(policy("fam", """
    match: {namespaces: ["*"], podSelector: {matchLabels: {gpugate.io/profile: training}}}
    gpu: {families: [hopper], allowedResources: [nvidia.com/mig-1g.10gb]}
"""), policy("audit", "gpu: {products: [Tesla-T4]}", mode="audit", priority=-1))])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claim_documents(), st.sampled_from(["ml-team", "web-a", "ops", "other"]), policy_sets)
def test_claim_mutation_applies_stays_valid_is_idempotent_and_keeps_the_authors_fields(
        document: dict[str, Any], namespace: str, policies: PolicySet) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    original = copy.deepcopy(document)
    result = dra.mutate_claim(document, namespace=namespace, policies=policies)
    assert document == original  # the input is never changed
    patched = jsonpatch.apply_patch(document, list(result.patch))
    assert patched == (result.desired if result.patch else document)
    kubernetes_validate.validate(patched, KUBERNETES_VERSION, strict=True)
    again = dra.mutate_claim(patched, namespace=namespace, policies=policies)
    assert again.patch == ()
    before, after = claims.parse(document), claims.parse(patched)
    for old, new in zip(before.asks(), after.asks(), strict=True):
        assert (old.device_class, old.count, old.capacity, old.admin_access) == \
               (new.device_class, new.count, new.capacity, new.admin_access)
        assert new.selectors[:len(old.selectors)] == old.selectors  # the author's selectors first, kept
    # What mutation shaped, validation accepts as far as selectors go.
    verdict_ = dra.validate_claim(patched, namespace=namespace, policies=policies)
    assert not any("outside the policy's requirement" in r for r in verdict_.reasons)


def test_a_pod_asking_a_dra_extended_resource_name_is_shaped_as_a_gpu_pod() -> None:
    """Tolerations and the policy's node requirements apply to ``deviceclass.resource.kubernetes.io/<class>``
    as to ``nvidia.com/gpu`` (a taint is tolerated by its NVIDIA name only), and the gpus label adds
    no device-plugin GPU on top of it."""
    asking = pod(container("trainer", limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"}),
                 labels={names.GPUS_LABEL: "4"})
    admitted = chain.admit(asking, namespace="ml-team", policies=POLICIES)
    assert admitted.stored is not None, admitted.reasons
    spec = admitted.stored["spec"]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"]} >= {"nvidia.com/gpu.product"}
    assert "nvidia.com/gpu" not in spec["containers"][0]["resources"]["limits"]
