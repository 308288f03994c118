"""Which policy applies to a pod: namespace globs, LabelSelector, gpuOnly, opt-out, priority."""

from __future__ import annotations

import pytest

from tests.policy.kit import container, load, pod, policy
from webhook.admission import mutation
from webhook.errors import PolicyLoadError
from webhook.kube.affinity import Requirement
from webhook.policy import matching
from webhook.policy.model import LabelSelector

GPU_POD = pod(container(gpus=1))


def selected(policies, p, namespace):
    found = matching.select(policies, p, namespace=namespace)
    return found.name if found else None


@pytest.mark.parametrize(("namespace", "include", "exclude", "matches"), [
    ("ml-train", ("ml-*",), (), True),
    ("ml", ("ml-*",), (), False),
    ("web-a", ("ml-*", "web-*"), (), True),
    ("team-a", ("team-?",), (), True),
    ("team-ab", ("team-?",), (), False),
    ("ML-train", ("ml-*",), (), False),
    ("anything", ("*",), (), True),
    ("kube-system", ("*",), ("kube-*",), False),
    ("ml-secret", ("ml-*",), ("ml-secret",), False),
    ("ml-train", ("ml-*",), ("ml-secret",), True),
], ids=[
    "glob prefix", "the prefix alone does not match ml-*", "any of several globs", "? is one character",
    "? is exactly one character", "globs are case-sensitive", "* matches all", "excludes win over *",
    "an exact exclude", "an exclude of another name leaves the rest",
])
def test_namespace_globs(namespace, include, exclude, matches):
    assert matching.namespace_matches(namespace, include, exclude) is matches


def test_an_empty_include_list_matches_no_namespace():
    assert matching.namespace_matches("ml-a", ()) is False


def req(key, op, *values):
    return Requirement(key, op, values)


@pytest.mark.parametrize(("selector", "labels", "matches"), [
    (LabelSelector(), {}, True),
    (LabelSelector(match_labels=(("app", "a"),)), {"app": "a", "x": "y"}, True),
    (LabelSelector(match_labels=(("app", "a"),)), {"app": "b"}, False),
    (LabelSelector(match_labels=(("app", "a"),)), {}, False),
    (LabelSelector(match_labels=(("app", "a"), ("tier", "t"))), {"app": "a"}, False),
    (LabelSelector(match_expressions=(req("app", "In", "a", "b"),)), {"app": "b"}, True),
    (LabelSelector(match_expressions=(req("app", "In", "a", "b"),)), {"app": "c"}, False),
    (LabelSelector(match_expressions=(req("app", "In", "a"),)), {}, False),
    (LabelSelector(match_expressions=(req("app", "NotIn", "a"),)), {"app": "b"}, True),
    (LabelSelector(match_expressions=(req("app", "NotIn", "a"),)), {"app": "a"}, False),
    (LabelSelector(match_expressions=(req("app", "NotIn", "a"),)), {}, True),
    (LabelSelector(match_expressions=(req("app", "Exists"),)), {"app": ""}, True),
    (LabelSelector(match_expressions=(req("app", "Exists"),)), {}, False),
    (LabelSelector(match_expressions=(req("app", "DoesNotExist"),)), {}, True),
    (LabelSelector(match_expressions=(req("app", "DoesNotExist"),)), {"app": "a"}, False),
    (LabelSelector(match_labels=(("app", "a"),), match_expressions=(req("tier", "NotIn", "web"),)),
     {"app": "a", "tier": "web"}, False),
    (LabelSelector(match_labels=(("app", "a"),), match_expressions=(req("tier", "NotIn", "web"),)),
     {"app": "a", "tier": "batch"}, True),
], ids=[
    "the empty selector matches every pod", "matchLabels ignores other labels", "matchLabels value differs",
    "matchLabels key absent", "every matchLabels pair must hold", "In one of the values", "In none of the values",
    "In needs the key", "NotIn another value", "NotIn the value", "NotIn holds when the key is absent",
    "Exists with an empty value", "Exists needs the key", "DoesNotExist without the key",
    "DoesNotExist with the key", "matchLabels AND matchExpressions: one fails",
    "matchLabels AND matchExpressions: both hold",
])
def test_label_selector(selector, labels, matches):
    assert matching.selector_matches(selector, labels) is matches


def test_a_selector_written_in_yaml_selects_pods_as_kubernetes_would():
    policies = load(policy("sel", """
        match:
          podSelector:
            matchLabels: {gpugate.io/profile: training}
            matchExpressions:
              - {key: team, operator: In, values: [vision, nlp]}
              - {key: tier, operator: NotIn, values: [web]}
              - {key: owner, operator: Exists}
              - {key: legacy, operator: DoesNotExist}
    """))
    base = {"gpugate.io/profile": "training", "team": "nlp", "owner": "ana"}
    assert selected(policies, pod(container(gpus=1), labels=base), "ml-a") == "sel"
    for change in ({"team": "audio"}, {"tier": "web"}, {"legacy": "1"}, {"gpugate.io/profile": "inference"}):
        assert selected(policies, pod(container(gpus=1), labels={**base, **change}), "ml-a") is None, change
    without_owner = {k: v for k, v in base.items() if k != "owner"}
    assert selected(policies, pod(container(gpus=1), labels=without_owner), "ml-a") is None


class TestGpuOnly:
    POLICIES = load(policy("gpu", 'match: {namespaces: ["ml-*"]}'))

    @pytest.mark.parametrize(("p", "applies"), [
        (pod(container()), False),
        (pod(container(requests={"cpu": "1"})), False),
        (pod(container(gpus=1)), True),
        (pod(container(limits={"nvidia.com/gpu": "1"})), True),
        (pod(container(gpus=1, resource="nvidia.com/gpu.shared")), True),
        (pod(container(gpus=1, resource="nvidia.com/mig-1g.10gb")), True),
        (pod(container(), labels={"gpugate.io/gpus": "2"}), True),
        (pod(container(), labels={"gpugate.io/gpus": ""}), True),
        (pod(container(), init=[container("setup", gpus=1)]), True),
        (pod(container(limits={"amd.com/gpu": "1"})), False),
    ], ids=["a CPU pod without resources", "a CPU pod with cpu requests", "nvidia.com/gpu requested",
            "nvidia.com/gpu as a limit only", "a shared GPU", "a MIG slice", "the gpus label",
            "the gpus label without a value", "an init container asking a GPU", "another vendor's GPU"])
    def test_gpu_only_policies_apply_to_gpu_pods_only(self, p, applies):
        assert (selected(self.POLICIES, p, "ml-a") == "gpu") is applies

    def test_gpu_only_false_applies_to_cpu_pods_too(self):
        policies = load(policy("all", 'match: {namespaces: ["ml-*"], gpuOnly: false}'))
        assert selected(policies, pod(container()), "ml-a") == "all"


class TestOptOut:
    POLICIES = load(policy("gpu", "priority: 1"))

    def test_the_skip_label_opts_out(self):
        assert selected(self.POLICIES, pod(container(gpus=1), labels={"gpugate.io/skip": "true"}), "ml") is None

    @pytest.mark.parametrize("value", ["false", "True", "yes", ""])
    def test_only_the_value_true_opts_out(self, value):
        assert selected(self.POLICIES, pod(container(gpus=1), labels={"gpugate.io/skip": value}), "ml") == "gpu"

    def test_an_opted_out_pod_is_not_mutated(self):
        p = pod(container(), labels={"gpugate.io/gpus": "1", "gpugate.io/skip": "true"})
        result = mutation.mutate(p, namespace="ml", policies=self.POLICIES)
        assert result.patch == () and result.policy is None and result.desired == p


class TestPriority:
    POLICIES = load(
        policy("catch-all", "", priority=0),
        policy("ml", 'match: {namespaces: ["ml-*"]}', priority=10),
        policy("training", 'match: {namespaces: ["ml-*"], podSelector: {matchLabels: {gpugate.io/profile: training}}}',
               priority=100),
    )

    @pytest.mark.parametrize(("namespace", "labels", "expected"), [
        ("ml-a", {"gpugate.io/profile": "training"}, "training"),
        ("ml-a", {"gpugate.io/profile": "notebook"}, "ml"),
        ("ml-a", {}, "ml"),
        ("web-a", {"gpugate.io/profile": "training"}, "catch-all"),
    ], ids=["the most specific, highest priority wins", "the next priority when the selector misses",
            "no labels fall to the namespace policy", "other namespaces fall to the catch-all"])
    def test_the_highest_priority_matching_policy_applies(self, namespace, labels, expected):
        assert selected(self.POLICIES, pod(container(gpus=1), labels=labels), namespace) == expected

    def test_nothing_matches_gives_none(self):
        policies = load(policy("ml", 'match: {namespaces: ["ml-*"]}'))
        assert selected(policies, GPU_POD, "web") is None

    def test_a_higher_priority_policy_wins_regardless_of_file_order(self):
        low = policy("aaa-low", "", priority=1)
        high = policy("zzz-high", "", priority=2)
        for documents in ((low, high), (high, low)):
            assert selected(load(*documents), GPU_POD, "x") == "zzz-high"

    def test_an_off_policy_at_equal_priority_does_not_make_the_outcome_depend_on_names(self):
        outcomes = set()
        for off_name in ("aaa-paused", "zzz-paused"):
            try:
                policies = load(policy(off_name, "", priority=5, mode="off"), policy("main", "", priority=5))
            except PolicyLoadError:
                outcomes.add("refused")
                continue
            result = mutation.mutate(pod(container(), labels={"gpugate.io/gpus": "1"}), namespace="ml",
                                     policies=policies)
            outcomes.add(len(result.patch) > 0)
        assert len(outcomes) == 1, outcomes


    def test_an_off_policy_is_as_if_absent(self):
        policies = load(policy("paused", "", priority=50, mode="off"), policy("low", "", priority=1))
        assert selected(policies, GPU_POD, "x") == "low"
        assert selected(load(policy("paused", "", mode="off")), GPU_POD, "x") is None

    def test_an_audit_policy_is_selected_like_an_enforcing_one(self):
        policies = load(policy("watch", "", priority=50, mode="audit"), policy("low", "", priority=1))
        assert selected(policies, GPU_POD, "x") == "watch"


class TestNamespaceFromTheRequest:
    POLICIES = load(policy("ml", 'match: {namespaces: ["ml-*"]}'))

    def test_the_request_namespace_is_used_when_the_object_has_none(self):
        assert selected(self.POLICIES, pod(container(gpus=1), generate_name="job-"), "ml-a") == "ml"

    def test_the_request_namespace_wins_over_the_object(self):
        p = pod(container(gpus=1), namespace="web-a")
        assert selected(self.POLICIES, p, "ml-a") == "ml"
        assert selected(self.POLICIES, pod(container(gpus=1), namespace="ml-a"), "web-a") is None
