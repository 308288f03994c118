"""Right-sizing through DRA: an ask becomes a ResourceClaimTemplate whose
``firstAvailable`` sub-requests are the ladder's fitting rungs, smallest first.

What kube-scheduler does with the template is tests/e2e/test_rightsizing.py's (the real allocator);
here: which sub-requests, in which order, with which selectors and capacity; the pod's reference,
label and annotation; the template the balancer rebuilds from the annotation; and the mutation
rules (patch applies, strict schema, idempotent, what the user set is kept).
"""

from __future__ import annotations

import copy
import json

import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.ladders import rightsizing
from tests.kubeversion import KUBERNETES_VERSION
from tests.policy.kit import container, load, pod, policy
from webhook import names
from webhook.admission import claimladder, dra, mutation, validation
from webhook.errors import PolicyLoadError
from webhook.kube import claims, rightsizedclaims
from webhook.kube.demand import Size as Ask

LADDER = 'match: {namespaces: ["ml-*"]}\ngpu: {max: 2}\n' + rightsizing(
    "{resource: nvidia.com/gpu.shared, memory: 80Gi, compute: 1}", through="dra")
POLICIES = load(policy("serving", LADDER))
SIZING = POLICIES.policies[0].rightsizing
GIB = 2**30


def asking(memory: str | None = None, fraction: str | None = None, *extra, **kwargs) -> dict:
    labels = dict(kwargs.pop("labels", {}))
    if memory is not None:
        labels[names.GPU_MEMORY_LABEL] = memory
    if fraction is not None:
        labels[names.GPU_FRACTION_LABEL] = fraction
    return pod(container("model"), *extra, labels=labels, **kwargs)


def shaped(p: dict, policies=POLICIES) -> tuple[mutation.Mutation, dict]:
    result = mutation.mutate(p, namespace="ml-a", policies=policies)
    return result, jsonpatch.apply_patch(p, list(result.patch))


def subs(template: dict) -> list[dict]:
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    return request["firstAvailable"]


def made(ask: Ask, sizing=SIZING, **kwargs) -> claimladder.ClaimLadder:
    found = claimladder.ladder(ask, sizing, **kwargs)
    assert isinstance(found, claimladder.ClaimLadder), found
    return found


class TestLadder:
    def test_20gi_is_the_mig_profiles_that_hold_it_then_a_share_then_a_whole_gpu(self):
        ladder = made(Ask(memory_bytes=20 * GIB))
        # 2g.20gb holds 20 GB (decimal), less than 20 GiB: the first MIG rung is 3g.40gb.
        assert ladder.rungs == ("mig-3g-40gb", "share", "gpu")
        mig, share, whole = subs(ladder.template)
        assert mig["deviceClassName"] == names.DRA_MIG_CLASS
        assert [s["cel"]["expression"] for s in mig["selectors"]] == [
            claimladder.profile_selector("3g.40gb"), claims.memory_selector(20480)]
        assert share["deviceClassName"] == names.DRA_GPU_CLASS
        assert share["capacity"] == {"requests": {"memory": "20Gi"}}
        assert share["selectors"] == [{"cel": {"expression": names.DRA_SHARE_SELECTOR}}]
        assert whole["deviceClassName"] == names.DRA_GPU_CLASS and "capacity" not in whole
        assert [s["cel"]["expression"] for s in whole["selectors"]] == [claims.memory_selector(20480)]

    def test_a_small_ask_starts_at_the_smallest_profile(self):
        assert made(Ask(memory_bytes=10**10)).rungs == ("mig-1g-10gb", "mig-2g-20gb", "mig-3g-40gb", "share", "gpu")

    def test_a_fraction_is_sized_against_the_ladders_whole_gpu_and_picks_by_compute(self):
        ladder = made(Ask(fraction=0.25))
        # 2/7 of the compute is the first MIG profile with at least a quarter; 20 GiB of 80.
        assert ladder.rungs == ("mig-2g-20gb", "mig-3g-40gb", "share", "gpu")
        assert subs(ladder.template)[2]["capacity"] == {"requests": {"memory": "20Gi"}}

    def test_an_ask_above_the_largest_rung_is_denied_naming_it(self):
        found = claimladder.ladder(Ask(memory_bytes=100 * GIB), SIZING)
        assert isinstance(found, str) and "nvidia.com/gpu" in found and "Ask for less" in found

    def test_a_share_rung_caps_the_share(self):
        capped = load(policy("nb", LADDER.replace("memory: 80Gi, compute: 1", "memory: 20Gi, compute: 0.25")))
        assert made(Ask(memory_bytes=30 * GIB), capped.policies[0].rightsizing).rungs == ("mig-3g-40gb", "gpu")

    def test_the_policys_selectors_go_on_every_rung_and_a_profile_below_min_memory_is_left_out(self):
        pinned = load(policy("pinned", LADDER.replace(
            "gpu: {max: 2}", "gpu: {max: 2, products: [NVIDIA-H100-80GB-HBM3], minMemoryMiB: 30000}")))
        required = dra.required_selectors(pinned.policies[0])
        ladder = made(Ask(memory_bytes=10**10), pinned.policies[0].rightsizing, selectors=required,
                      min_memory_mib=30000)
        assert ladder.rungs == ("mig-3g-40gb", "share", "gpu")
        assert "1g.10gb left out" in ladder.why and "2g.20gb left out" in ladder.why
        for sub in subs(ladder.template):
            expressions = [s["cel"]["expression"] for s in sub["selectors"]]
            assert all(e in expressions for e in required), sub

    def test_the_name_is_the_hash_of_labels_and_spec(self):
        one = made(Ask(memory_bytes=20 * GIB))
        assert one.name == made(Ask(memory_bytes=20 * GIB)).name
        assert one.name != made(Ask(memory_bytes=21 * GIB)).name
        assert one.name != made(Ask(memory_bytes=20 * GIB), labels={names.PROFILE_LABEL: "x"}).name
        assert one.name.startswith(names.RIGHTSIZED_TEMPLATE_PREFIX) and len(one.name) <= 63

    def test_the_template_is_valid_for_the_api_server(self):
        for ask in (Ask(memory_bytes=20 * GIB), Ask(memory_bytes=12345678), Ask(fraction=0.5)):
            kubernetes_validate.validate(copy.deepcopy(made(ask).template), KUBERNETES_VERSION, strict=True)

    def test_the_policy_admits_the_template_it_made_and_has_no_selector_to_add(self):
        pinned = load(policy("pinned", LADDER.replace("gpu: {max: 2}", "gpu: {max: 2, families: [hopper]}")))
        template = made(Ask(memory_bytes=20 * GIB), pinned.policies[0].rightsizing,
                        selectors=dra.required_selectors(pinned.policies[0])).template
        _, stored = shaped(asking("20Gi"), pinned)
        naming = dra.ClaimContext(naming=((stored, {}),))
        verdict = dra.validate_claim(template, namespace="ml-a", policies=pinned, context=naming)
        assert verdict.allowed, verdict.reasons
        # Without a pod that names it and recomputes to it, the balancer's create is refused.
        alone = dra.validate_claim(template, namespace="ml-a", policies=pinned)
        assert not alone.allowed and "no pod that names it recomputes to exactly it" in alone.message
        # Through the API the webhook shapes the template too: only its policy annotation is added.
        patch = dra.mutate_claim(template, namespace="ml-a", policies=pinned).patch
        assert patch and all(op["path"].startswith("/metadata") for op in patch), patch

    def test_a_non_dra_rung_is_refused_at_load(self):
        with pytest.raises(PolicyLoadError, match="cannot be asked through DRA"):
            load(policy("bad", LADDER.replace("nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb")))


class TestPod:
    def test_the_pod_references_the_template_labels_its_name_and_carries_it(self):
        result, stored = shaped(asking("20Gi"))
        assert not result.denials
        name = stored["metadata"]["labels"][names.CLAIM_TEMPLATE_LABEL]
        assert stored["spec"]["resourceClaims"] == [{"name": names.RIGHTSIZED_CLAIM,
                                                     "resourceClaimTemplateName": name}]
        assert stored["spec"]["containers"][0]["resources"]["claims"] == [{"name": names.RIGHTSIZED_CLAIM}]
        template = rightsizedclaims.wanted(stored)
        assert template is not None and template["metadata"]["name"] == name
        assert [s["name"] for s in subs(template)] == ["mig-3g-40gb", "share", "gpu"]
        assert "ResourceClaimTemplate " + name in result.warnings[0]
        assert not stored["spec"]["containers"][0]["resources"].get("limits")

    def test_the_validated_pod_is_allowed(self):
        _, stored = shaped(asking("20Gi"))
        verdict = validation.validate(stored, namespace="ml-a", policies=POLICIES)
        assert verdict.allowed, verdict.reasons

    def test_a_pod_with_claims_of_its_own_is_kept(self):
        own = asking("20Gi")
        own["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimTemplateName": "t"}]
        own["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mine"}]}
        result, stored = shaped(own)
        assert stored["spec"] == own["spec"] and stored["metadata"]["labels"] == own["metadata"]["labels"]
        assert any("claims of its own" in w for w in result.warnings), result.warnings

    def test_a_gpu_resource_of_its_own_is_kept(self):
        own = pod(container("model", gpus=1), labels={names.GPU_MEMORY_LABEL: "20Gi"})
        _, stored = shaped(own)
        assert "resourceClaims" not in stored["spec"]


class TestAnnotation:
    def test_a_tampered_annotation_is_refused(self):
        _, stored = shaped(asking("20Gi"))
        document = json.loads(stored["metadata"]["annotations"][names.CLAIM_TEMPLATE_ANNOTATION])
        subs(document)[0]["deviceClassName"] = "other.example.com"
        stored["metadata"]["annotations"][names.CLAIM_TEMPLATE_ANNOTATION] = json.dumps(document)
        with pytest.raises(rightsizedclaims.TemplateError, match="hashes to"):
            rightsizedclaims.wanted(stored)

    @pytest.mark.parametrize(("annotation", "says"), [(None, "without the annotation"), ("{", "not JSON"),
                                                      ('{"kind": "Pod"}', "not a ResourceClaimTemplate")])
    def test_a_label_without_a_good_annotation_is_refused_naming_why(self, annotation, says):
        p = asking("20Gi", labels={names.CLAIM_TEMPLATE_LABEL: "gpugate-rightsized-0"})
        if annotation is not None:
            p["metadata"]["annotations"] = {names.CLAIM_TEMPLATE_ANNOTATION: annotation}
        with pytest.raises(rightsizedclaims.TemplateError, match=says):
            rightsizedclaims.wanted(p)

    def test_a_pod_without_the_label_needs_nothing(self):
        assert rightsizedclaims.wanted(asking("20Gi")) is None


@settings(max_examples=150, deadline=None)
@given(memory_mib=st.integers(1, 90_000), fraction=st.one_of(st.none(), st.sampled_from(["0.1", "0.3", "0.5", "1"])),
       profile=st.one_of(st.none(), st.sampled_from(["inference", "batch"])),
       tolerations=st.booleans(), other_label=st.booleans())
def test_any_ask_patch_applies_strict_valid_idempotent_and_keeps_the_users_fields(memory_mib, fraction, profile,
                                                                                tolerations, other_label):
    labels = {names.PROFILE_LABEL: profile} if profile else {}
    if other_label:
        labels["team"] = "a"
    p = asking(f"{memory_mib}Mi", fraction, labels=labels)
    if tolerations:
        p["spec"]["tolerations"] = [{"key": "own", "operator": "Exists", "effect": "NoSchedule"}]
    p["spec"]["containers"][0]["env"] = [{"name": "KEEP", "value": "1"}]
    before = copy.deepcopy(p)
    result, stored = shaped(p)
    assert p == before  # mutate() never changes its input
    expected = claimladder.ladder(Ask(memory_bytes=memory_mib * 2**20, fraction=float(fraction) if fraction else None),
                                  SIZING, labels={names.PROFILE_LABEL: profile} if profile else None)
    if isinstance(expected, str):
        assert result.denials and not result.patch
        return
    assert stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == expected.name
    assert rightsizedclaims.wanted(stored) == expected.template
    # What the user set is kept.
    assert {k: v for k, v in stored["metadata"]["labels"].items() if k != names.CLAIM_TEMPLATE_LABEL} == \
        before["metadata"]["labels"]
    assert stored["spec"]["containers"][0]["env"] == before["spec"]["containers"][0]["env"]
    if tolerations:
        assert before["spec"]["tolerations"][0] in stored["spec"]["tolerations"]
    again = mutation.mutate(stored, namespace="ml-a", policies=POLICIES)
    assert again.patch == (), again.patch
    assert validation.validate(stored, namespace="ml-a", policies=POLICIES).allowed
    kubernetes_validate.validate(copy.deepcopy(stored), KUBERNETES_VERSION, strict=True)
    kubernetes_validate.validate(copy.deepcopy(expected.template), KUBERNETES_VERSION, strict=True)


def test_the_template_as_the_api_server_hands_it_to_admission_still_recomputes() -> None:
    """The API server adds metadata and writes an empty ``spec.metadata`` (Go's encoding of an empty
    ObjectMeta); a template carrying claim metadata of its own is not what right-sizing wrote."""
    from webhook.admission import rightsizedtemplate

    _, stored = shaped(asking("20Gi"))
    template = rightsizedclaims.wanted(stored)
    assert template is not None
    served = copy.deepcopy(template)
    served["metadata"].update(namespace="ml-a", uid="u", creationTimestamp="2026-12-07T00:00:00Z",
                              annotations={names.POLICY_ANNOTATION: "serving@x"})
    served["spec"]["metadata"] = {}
    policy_ = POLICIES.policies[0]
    assert rightsizedtemplate.recomputes_to(stored, policy_, served)
    served["spec"]["metadata"] = {"labels": {"gpugate.io/profile": "training"}}
    assert not rightsizedtemplate.recomputes_to(stored, policy_, served)
