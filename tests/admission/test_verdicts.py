"""Verdicts on the pod as it will be stored: each denial names the container, the resource,
the policy and the fix."""

from __future__ import annotations

import pytest

from tests.policy.kit import container, load, pod, policy
from webhook import names
from webhook.admission import validation
from webhook.kube import units

NS = "ml-a"


def verdict(p, *documents: str, namespace: str = NS):
    policies = load(*documents)
    return validation.validate(p, namespace=namespace, policies=policies), policies.revision


def only_reason(p, *documents: str, namespace: str = NS) -> tuple[str, str]:
    result, revision = verdict(p, *documents, namespace=namespace)
    assert result.allowed is False
    (reason,) = result.reasons
    assert result.message == reason
    return reason, revision


MAX4 = policy("capped", "gpu: {max: 4}")


class TestGpuMax:
    def test_one_container_over_max_is_denied_with_the_fix(self):
        reason, rev = only_reason(pod(container("trainer", gpus=12)), MAX4)
        assert reason == (f"container 'trainer' asks nvidia.com/gpu: 12; policy capped@{rev} allows 4. "
                          f"Ask for 4 or fewer, or use a profile whose policy allows more")

    def test_exactly_max_is_allowed(self):
        result, _ = verdict(pod(container("trainer", gpus=4)), MAX4)
        assert result.allowed and result.reasons == ()

    def test_the_pod_total_over_max_is_denied_even_when_each_container_fits(self):
        reason, rev = only_reason(pod(container("a", gpus=3), container("b", gpus=2), name="job-0"), MAX4)
        assert ("pod 'job-0' asks 5 GPUs in all (container 'a' nvidia.com/gpu: 3; container 'b' nvidia.com/gpu: 2)"
                in reason)
        assert f"policy capped@{rev} allows 4 per pod" in reason
        assert "Ask for 4 or fewer in total, or split the job into several pods" in reason

    def test_the_total_counts_limits_only_once_per_container(self):
        result, _ = verdict(pod(container("a", gpus=2), container("b", gpus=2)), MAX4)
        assert result.allowed

    def test_init_containers_do_not_add_to_the_pod_total(self):
        """Init containers run before the regular ones; their GPUs are reused, not added."""
        p = pod(container("a", gpus=2), container("b", gpus=2), init=[container("setup", gpus=2)])
        assert verdict(p, MAX4)[0].allowed

    def test_an_init_container_over_max_is_named_as_one(self):
        reason, _ = only_reason(pod(container("a"), init=[container("setup", gpus=5)]), MAX4)
        assert reason.startswith("initContainer 'setup' asks nvidia.com/gpu: 5;")

    def test_a_generate_name_pod_is_named_by_its_prefix(self):
        reason, _ = only_reason(pod(container("a", gpus=3), container("b", gpus=3), name=None,
                                    generate_name="trainer-"), MAX4)
        assert "pod 'trainer-' asks" in reason

    def test_max_applies_to_the_limit_when_requests_are_absent(self):
        c = container("trainer", limits={"nvidia.com/gpu": "6"})
        reason, _ = only_reason(pod(c), MAX4)
        assert "asks nvidia.com/gpu: 6" in reason


class TestDenyRules:
    WEB = policy("web-no-gpus", """
        priority: 1000
        match: {namespaces: ["web-*", "frontend-*"]}
        tolerations: none
        deny:
          - message: GPUs are not available in web namespaces; run GPU work in an ml-* namespace
    """)

    @pytest.mark.parametrize("p", [
        pod(container("app", gpus=1)),
        pod(container("app"), labels={names.GPUS_LABEL: "1"}),
        pod(container("app", gpus=1, resource="nvidia.com/gpu.shared")),
    ], ids=["a GPU request", "the gpus label", "a shared GPU"])
    def test_a_gpu_pod_in_a_denied_namespace_family_is_denied(self, p):
        result, rev = verdict(p, self.WEB, namespace="web-shop")
        assert not result.allowed
        (reason,) = [r for r in result.reasons if r.startswith("pod ")]
        assert reason.startswith("pod 'pod-1' in namespace 'web-shop': ")
        assert "GPUs are not available in web namespaces; run GPU work in an ml-* namespace" in reason
        assert f"(policy web-no-gpus@{rev})" in reason

    def test_the_denial_names_the_container_and_the_resource_asked(self):
        reason, _ = only_reason(pod(container("app", gpus=1)), self.WEB, namespace="frontend-a")
        assert "container 'app' asks nvidia.com/gpu;" in reason

    def test_the_denial_names_the_label_when_no_resource_is_asked(self):
        reason, _ = only_reason(pod(container("app"), labels={names.GPUS_LABEL: "1"}), self.WEB,
                                namespace="web-a")
        assert "it asks for GPUs with label gpugate.io/gpus;" in reason

    def test_a_deny_rule_binds_only_the_pods_its_policy_selects(self):
        """A rule written in a profile's policy does not deny the other profiles' pods."""
        training = policy("training", """
            match: {namespaces: ["ml-*"], podSelector: {matchLabels: {gpugate.io/profile: training}}}
            deny: [{message: training needs a reservation}]
        """, priority=10)
        inference = pod(container("app", gpus=1), labels={"gpugate.io/profile": "inference"})
        trainer = pod(container("app", gpus=1), labels={"gpugate.io/profile": "training"})
        assert verdict(inference, training, namespace="ml-a")[0].allowed
        assert "training needs a reservation" in verdict(trainer, training, namespace="ml-a")[0].message

    @pytest.mark.parametrize(("p", "namespace"), [
        (pod(container("app")), "web-shop"),
        (pod(container("app", gpus=1)), "ml-a"),
    ], ids=["a CPU pod in a web namespace", "a GPU pod elsewhere"])
    def test_pods_outside_the_rule_are_allowed(self, p, namespace):
        assert verdict(p, self.WEB, namespace=namespace)[0].allowed

    def test_the_skip_label_opts_out_of_mutation_not_out_of_deny_rules(self):
        p = pod(container("app", gpus=1), labels={names.SKIP_LABEL: "true"})
        assert not verdict(p, self.WEB, namespace="web-shop")[0].allowed

    def test_the_skip_label_does_not_skip_the_policy_limits(self):
        """Opted-out pods are not shaped, but a label their author writes must not lift max."""
        p = pod(container("app", gpus=9), labels={names.SKIP_LABEL: "true"})
        result = verdict(p, MAX4)[0]
        assert not result.allowed and "allows 4" in result.message

    def test_sidecar_gpus_count_toward_the_pod_total(self):
        """Init containers with restartPolicy Always run all along: their GPUs add up."""
        sidecar = dict(container("s1", gpus=4), restartPolicy="Always")
        one_shot = container("setup", gpus=4)
        assert not verdict(pod(container("c", gpus=4), init=[sidecar]), MAX4)[0].allowed
        assert verdict(pod(container("c", gpus=4), init=[one_shot]), MAX4)[0].allowed

    def test_a_deny_rule_narrowed_by_namespace_and_selector(self):
        doc = policy("ml", """
            match: {namespaces: ["ml-*"]}
            deny:
              - namespaces: ["ml-sandbox-*"]
                podSelector: {matchExpressions: [{key: team, operator: NotIn, values: [platform]}]}
                message: sandboxes get no GPUs; ask the platform team
        """)
        assert not verdict(pod(container(gpus=1)), doc, namespace="ml-sandbox-1")[0].allowed
        assert verdict(pod(container(gpus=1), labels={"team": "platform"}), doc, namespace="ml-sandbox-1")[0].allowed
        assert verdict(pod(container(gpus=1)), doc, namespace="ml-prod")[0].allowed

    def test_a_deny_is_never_hidden_by_a_higher_priority_policy(self):
        high = policy("training", 'match: {namespaces: ["*"], podSelector: {matchLabels: {p: t}}}', priority=2000)
        reason, _ = only_reason(pod(container(gpus=1), labels={"p": "t"}), high, self.WEB, namespace="web-a")
        assert "policy web-no-gpus@" in reason

    def test_an_off_policy_denies_nothing(self):
        off = self.WEB.replace("priority: 1000", "priority: 1000\n  mode: off")
        assert verdict(pod(container(gpus=1)), off, namespace="web-a")[0].allowed


class TestRequestsEqualLimits:
    def test_requests_different_from_limits_are_denied_with_the_fix(self):
        c = container("trainer", requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "2"})
        reason, rev = only_reason(pod(c), policy("gp"))
        assert reason == (f"container 'trainer' asks nvidia.com/gpu requests 1 but limits 2 (policy gp@{rev}); "
                          f"set requests equal to limits")

    @pytest.mark.parametrize(("requests", "limits"), [("2", "2"), ("2", "2000m"), (None, "2"), ("2", None)],
                             ids=["equal strings", "equal quantities written differently", "limit only",
                                  "request only"])
    def test_equal_or_single_values_are_allowed(self, requests, limits):
        c = container("trainer", requests={"nvidia.com/gpu": requests} if requests else None,
                      limits={"nvidia.com/gpu": limits} if limits else None)
        assert verdict(pod(c), policy("gp"))[0].allowed

    @pytest.mark.parametrize(("value", "why"), [
        ("500m", "is not a whole number"), ("1.5", "is not a whole number"), ("abc", "is not a number"),
        ("-1", "is negative"), ("1e30", "is more than any node has"),  # "not a whole number" before
    ])
    def test_a_count_that_is_not_a_whole_number_is_denied_for_what_it_is(self, value, why):
        c = container("trainer", limits={"nvidia.com/gpu": value})
        reason, rev = only_reason(pod(c), policy("gp"))
        assert reason.startswith(f"container 'trainer' asks nvidia.com/gpu: {value}, which {why} (policy gp@{rev})")
        assert "GPUs are counted in whole devices" in reason


class TestSharedResource:
    SHARED = policy("notebooks", "gpu: {resource: nvidia.com/gpu.shared, max: 4}")

    def test_asking_a_shared_gpu_more_than_once_is_denied_with_the_fix(self):
        reason, rev = only_reason(pod(container("lab", gpus=2, resource="nvidia.com/gpu.shared")), self.SHARED)
        assert reason.startswith(f"container 'lab' asks nvidia.com/gpu.shared: 2; policy notebooks@{rev} allows "
                                 f"one shared GPU per container")
        assert "Ask for 1, or for nvidia.com/gpu if you need whole GPUs" in reason

    def test_one_shared_gpu_is_allowed(self):
        assert verdict(pod(container("lab", gpus=1, resource="nvidia.com/gpu.shared")), self.SHARED)[0].allowed

    def test_the_policy_may_allow_more_than_one_share(self):
        doc = policy("notebooks", "gpu: {resource: nvidia.com/gpu.shared, failRequestsGreaterThanOne: false}")
        assert verdict(pod(container("lab", gpus=2, resource="nvidia.com/gpu.shared")), doc)[0].allowed

    def test_a_shared_mig_slice_follows_the_same_rule(self):
        doc = policy("mig", "gpu: {resource: nvidia.com/mig-1g.5gb.shared}")
        reason, _ = only_reason(pod(container("lab", gpus=3, resource="nvidia.com/mig-1g.5gb.shared")), doc)
        assert "asks nvidia.com/mig-1g.5gb.shared: 3" in reason

    def test_whole_gpus_may_be_asked_more_than_once(self):
        assert verdict(pod(container("t", gpus=2)), policy("gp"))[0].allowed


class TestAllowedResources:
    def test_an_nvidia_resource_the_policy_does_not_allow_is_denied_with_the_alternatives(self):
        doc = policy("training", "gpu: {resource: nvidia.com/gpu, allowedResources: [nvidia.com/mig-3g.40gb]}")
        reason, rev = only_reason(pod(container("t", gpus=1, resource="nvidia.com/mig-1g.10gb")), doc)
        assert reason == (f"container 't' asks nvidia.com/mig-1g.10gb, which policy training@{rev} does not allow; "
                          f"ask for nvidia.com/gpu, nvidia.com/mig-3g.40gb instead, or use a profile whose policy "
                          f"offers nvidia.com/mig-1g.10gb")

    def test_an_allowed_extra_resource_is_accepted(self):
        doc = policy("training", "gpu: {allowedResources: [nvidia.com/mig-1g.10gb]}")
        assert verdict(pod(container("t", gpus=1, resource="nvidia.com/mig-1g.10gb")), doc)[0].allowed

    def test_the_policy_resource_is_always_allowed(self):
        doc = policy("shared", "gpu: {resource: nvidia.com/gpu.shared}")
        reason, _ = only_reason(pod(container("t", gpus=1)), doc)
        assert "asks nvidia.com/gpu, which policy shared@" in reason and "ask for nvidia.com/gpu.shared instead" \
            in reason

    def test_other_vendors_resources_are_not_judged(self):
        assert verdict(pod(container("t", limits={"example.com/fpga": "3"}),
                           labels={names.GPUS_LABEL: "1"}), policy("gp"))[0].allowed


class TestLabelAndAnnotation:
    @pytest.mark.parametrize(("label", "why"), [("two", "is not a number"), ("1.5", "is not a whole number"),
                                                ("-1", "is negative")])
    def test_a_gpus_label_that_is_not_a_whole_number_is_denied_with_an_example(self, label, why):
        reason, rev = only_reason(pod(container(), labels={names.GPUS_LABEL: label}), policy("gp"))
        assert reason == (f"label gpugate.io/gpus={label!r} {why} (policy gp@{rev}); "
                          f"write e.g. gpugate.io/gpus: \"1\"")

    @pytest.mark.parametrize("label", ["", "0", "3"])
    def test_whole_or_empty_labels_are_allowed(self, label):
        assert verdict(pod(container(), labels={names.GPUS_LABEL: label}), policy("gp"))[0].allowed

    def test_an_annotation_naming_no_container_is_denied_listing_the_containers(self):
        p = pod(container("a", gpus=1), container("b"), annotations={names.CONTAINER_ANNOTATION: "trainer"})
        reason, rev = only_reason(p, policy("gp"))
        assert reason == (f"annotation gpugate.io/container='trainer' names no regular container of pod 'pod-1' "
                          f"(policy gp@{rev}); name one of 'a', 'b'")


class TestEveryReasonIsListed:
    def test_several_problems_give_several_reasons(self):
        doc = policy("gp", "gpu: {max: 2}")
        bad = container("a", requests={"nvidia.com/gpu": "3"}, limits={"nvidia.com/gpu": "4"})
        result, _ = verdict(pod(bad, container("b", gpus=1, resource="nvidia.com/gpu.shared")), doc)
        assert not result.allowed and len(result.reasons) == 3
        assert any("container 'a' asks nvidia.com/gpu requests 3 but limits 4" in r for r in result.reasons)
        assert any("container 'a' asks nvidia.com/gpu: 3" in r for r in result.reasons)
        assert any("container 'b' asks nvidia.com/gpu.shared, which policy" in r for r in result.reasons)
        assert result.message == "; ".join(result.reasons)

    def test_the_verdict_names_the_policy(self):
        result, rev = verdict(pod(container(gpus=1)), policy("gp"))
        assert result.allowed and str(result.policy) == f"gp@{rev}"

    def test_no_matching_policy_allows(self):
        result, _ = verdict(pod(container(gpus=99)), policy("gp", 'match: {namespaces: ["other"]}'))
        assert result.allowed and result.policy is None


class TestAudit:
    AUDIT = policy("watch", "gpu: {max: 1}", mode="audit")

    def test_audit_never_denies_but_warns_what_enforce_would_deny(self):
        result, rev = verdict(pod(container("t", gpus=3)), self.AUDIT)
        assert result.allowed and result.reasons == ()
        assert result.warnings == (f"audit: would deny: container 't' asks nvidia.com/gpu: 3; policy watch@{rev} "
                                   f"allows 1. Ask for 1 or fewer, or use a profile whose policy allows more",)

    @pytest.mark.parametrize("p", [
        pod(container("t", requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "2"})),
        pod(container("t", gpus=1, resource="nvidia.com/mig-1g.10gb")),
        pod(container("t"), labels={names.GPUS_LABEL: "many"}),
        pod(container("a", gpus=1), container("b", gpus=1)),
    ], ids=["requests != limits", "a resource not allowed", "a bad label", "the pod total"])
    def test_audit_allows_every_rule_it_would_deny(self, p):
        result, _ = verdict(p, self.AUDIT)
        assert result.allowed and result.warnings and all(w.startswith("audit: would deny: ") for w in result.warnings)

    def test_an_audit_policy_does_not_hide_an_enforcing_deny(self):
        web = policy("web-no-gpus", 'match: {namespaces: ["web-*"]}\ndeny: [{message: no GPUs here}]', priority=0)
        watch = policy("watch", 'match: {namespaces: ["*"]}', priority=100, mode="audit")
        result, _ = verdict(pod(container(gpus=1)), web, watch, namespace="web-a")
        assert not result.allowed and "no GPUs here" in result.message

    def test_an_audit_deny_rule_warns_what_it_would_deny(self):
        web = policy("web-no-gpus", 'match: {namespaces: ["web-*"]}\ndeny: [{message: no GPUs here}]', mode="audit")
        result, _ = verdict(pod(container(gpus=1)), web, namespace="web-a")
        assert result.allowed
        assert any(w.startswith("audit: would deny: ") and "no GPUs here" in w for w in result.warnings)


MEM40 = policy("big", "gpu: {minMemoryMiB: 40000, products: [NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB]}")


def required(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key, operator, *values):
    return {"key": key, "operator": operator, "values": list(values)}


GOOD_TERM = {"matchExpressions": [expr(names.NVIDIA_MEMORY_LABEL, "Gt", "39999"),
                                  expr(names.NVIDIA_PRODUCT_LABEL, "In", "NVIDIA-H100-80GB-HBM3")]}


class TestNodeRequirementsHoldInEveryTerm:
    """Terms are ORed: a second, trivially true term used to lift the policy's GPU requirements."""

    def test_a_pod_whose_every_term_carries_the_requirements_is_allowed(self):
        result, _ = verdict(pod(container(gpus=1), affinity=required(GOOD_TERM, GOOD_TERM)), MEM40)
        assert result.allowed, result.reasons

    def test_a_second_term_without_the_requirement_is_denied_and_named(self):
        escape = {"matchExpressions": [expr("kubernetes.io/os", "In", "linux")]}
        result, rev = verdict(pod(container(gpus=1), affinity=required(GOOD_TERM, escape)), MEM40)
        assert not result.allowed
        assert any("nvidia.com/gpu.memory Gt 39999 (term 2)" in r and f"policy big@{rev}" in r
                   for r in result.reasons), result.reasons

    def test_a_pod_without_required_affinity_is_denied(self):
        result, _ = verdict(pod(container(gpus=1)), MEM40)
        assert not result.allowed and "no required node affinity" in result.message

    def test_a_contradicting_node_selector_is_denied(self):
        p = pod(container(gpus=1), affinity=required(GOOD_TERM),
                nodeSelector={names.NVIDIA_PRODUCT_LABEL: "Tesla-T4"})
        result, _ = verdict(p, MEM40)
        assert not result.allowed and "(nodeSelector)" in result.message

    def test_an_empty_term_needs_nothing_it_matches_no_node(self):
        result, _ = verdict(pod(container(gpus=1), affinity=required({}, GOOD_TERM)), MEM40)
        assert result.allowed, result.reasons

    def test_a_tighter_expression_than_the_policy_meets_it(self):
        tight = {"matchExpressions": [expr(names.NVIDIA_MEMORY_LABEL, "Gt", "81000"),
                                      expr(names.NVIDIA_PRODUCT_LABEL, "In", "NVIDIA-A100-SXM4-80GB")]}
        result, _ = verdict(pod(container(gpus=1), affinity=required(tight)), MEM40)
        assert result.allowed, result.reasons

    def test_mutation_output_always_passes(self):
        from webhook.admission import chain

        p = pod(container(gpus=1), affinity=required({"matchExpressions": [expr("zone", "In", "a")]},
                                                     {"matchExpressions": [expr("zone", "In", "b")]}, {}))
        outcome = chain.admit(p, namespace=NS, policies=load(MEM40))
        assert outcome.allowed, outcome.reasons


def test_a_gpus_label_too_large_to_be_a_count_is_called_too_large_not_malformed():
    p = pod(container(), labels={names.GPUS_LABEL: "99999999999999999999", names.SKIP_LABEL: "true"})
    result, _ = verdict(p, MAX4)
    assert not result.allowed and "asks for more GPUs than any node has" in result.message
    assert "not a whole number" not in result.message


class TestEveryGpuName:
    """``max`` in GPU units over every name a pod asks GPUs by: whole GPUs, MIG slices and slots as
    their share of a GPU, and the DRA extended-resource names kube-scheduler serves through a claim."""

    CLASS = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"

    def test_the_implicit_name_of_a_gpu_class_is_counted_against_max(self):
        reason, rev = only_reason(pod(container("t", limits={self.CLASS: "5"})), MAX4)
        assert reason == (f"container 't' asks {self.CLASS}: 5; policy capped@{rev} allows 4. Ask for 4 or fewer, "
                          f"or use a profile whose policy allows more")

    def test_every_name_adds_up_to_the_pod_total(self):
        reason, _ = only_reason(pod(container("a", limits={self.CLASS: "3"}), container("b", gpus=2)), MAX4)
        assert reason.startswith(f"pod 'pod-1' asks 5 GPUs in all (container 'a' {self.CLASS}: 3; "
                                 f"container 'b' nvidia.com/gpu: 2)")

    def test_slices_and_slots_count_as_their_share_of_a_gpu(self):
        slices = policy("slices", "gpu: {max: 1, allowedResources: [nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared]}")
        five = pod(container("a", limits={"nvidia.com/mig-1g.10gb": "5"}))
        assert verdict(five, slices)[0].allowed  # 5/7 of a GPU
        shared = {"nvidia.com/gpu.shared": "1"}
        assert verdict(pod(five["spec"]["containers"][0], container("b", limits=shared)), slices)[0].allowed  # 0.96
        over = pod(five["spec"]["containers"][0], container("b", limits=shared), container("c", limits=shared))
        reason, _ = only_reason(over, slices)
        assert reason.startswith("pod 'pod-1' asks 1.21 GPUs in all (container 'a' nvidia.com/mig-1g.10gb: 5 = "
                                 "0.71 GPU; container 'b' nvidia.com/gpu.shared: 1 = 0.25 GPU; ")

    def test_a_class_gpugate_does_not_know_is_judged_never_let_through(self):
        reason, _ = only_reason(pod(container("t", limits={"deviceclass.resource.kubernetes.io/accel": "1"})), MAX4)
        assert "the extended resource of DeviceClass accel, which gpugate does not know" in reason

    def test_a_classs_own_extended_resource_name_is_a_gpu_ask_once_the_class_is_known(self):
        mapped = units.DeviceClasses.from_documents([{"metadata": {"name": "gpu.nvidia.com"}, "spec": {
            "extendedResourceName": "example.com/gpu", "selectors": [{"cel": {"expression": (
                "device.driver == 'gpu.nvidia.com'")}}]}}])
        p = pod(container("t", limits={"example.com/gpu": "8"}))
        assert verdict(p, MAX4)[0].allowed  # not known as a GPU name without the class
        result = validation.validate(p, namespace=NS, policies=load(MAX4), classes=mapped)
        assert not result.allowed and "asks example.com/gpu: 8" in result.message
