"""Loading a folder of GPUPolicy YAML: all or nothing, with errors that point at the problem."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from tests.policy.kit import load, policy
from webhook.errors import PolicyLoadError
from webhook.policy import PolicySet, loading, parsing

TRAINING = policy("training", """
    priority: 100
    match: {namespaces: ["ml-*"], podSelector: {matchLabels: {gpugate.io/profile: training}}}
    gpu: {resource: nvidia.com/gpu, default: 1, max: 8}
""")
INFERENCE = policy("inference", """
    priority: 100
    match: {namespaces: ["ml-*"], podSelector: {matchLabels: {gpugate.io/profile: inference}}}
""")
FALLBACK = policy("fallback", "priority: 0")


def problems_of(*documents: str, name: str = "p.yaml") -> tuple[str, ...]:
    with pytest.raises(PolicyLoadError) as caught:
        load(*documents, name=name)
    return caught.value.problems


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


class TestFolder:
    def test_every_top_level_yaml_file_and_every_document_in_it_is_loaded(self, tmp_path):
        write(tmp_path, {"a.yaml": TRAINING + "---\n" + INFERENCE, "b.yml": FALLBACK})
        policies = loading.load_dir(tmp_path)
        assert {p.name for p in policies.policies} == {"training", "inference", "fallback"}

    def test_policies_are_kept_highest_priority_first(self, tmp_path):
        write(tmp_path, {"a.yaml": FALLBACK, "b.yaml": TRAINING})
        assert [p.priority for p in loading.load_dir(tmp_path).policies] == [100, 0]

    def test_each_policy_remembers_its_file_and_document(self, tmp_path):
        write(tmp_path, {"a.yaml": TRAINING + "---\n" + INFERENCE})
        sources = {p.name: p.source for p in loading.load_dir(tmp_path).policies}
        assert sources["training"].endswith("a.yaml, document 1")
        assert sources["inference"].endswith("a.yaml, document 2")

    def test_empty_documents_are_skipped_but_keep_the_numbering(self):
        problems = problems_of(FALLBACK, "# nothing here", policy("x", "priority: 'high'"))
        assert problems == ("p.yaml, document 3, spec.priority: 'high' is not of type 'integer'",)

    def test_kustomization_hidden_entries_and_the_tests_folder_are_ignored(self, tmp_path):
        write(tmp_path, {
            "training.yaml": TRAINING,
            "kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n",
            ".hidden.yaml": "not: a policy\n",
            "tests/case-1/pod.yaml": "apiVersion: v1\nkind: Pod\n",
            "tests/case-1/case.yaml": "namespace: ml-a\n",
            "README.md": "# notes\n",
        })
        policies = loading.load_dir(tmp_path)
        assert [p.name for p in policies.policies] == ["training"]

    def test_a_configmap_volume_with_its_data_symlink_swap_loads_once(self, tmp_path):
        """A mounted ConfigMap holds ..<timestamp>/ with the files, ..data -> it, and one symlink per key."""
        real = tmp_path / "..2026_11_30_01_00_00.123"
        write(real, {"training.yaml": TRAINING, "kustomization.yaml": "kind: Kustomization\n"})
        (tmp_path / "..data").symlink_to(real.name)
        for key in ("training.yaml", "kustomization.yaml"):
            (tmp_path / key).symlink_to(os.path.join("..data", key))
        policies = loading.load_dir(tmp_path)
        assert [p.name for p in policies.policies] == ["training"]
        assert policies.revision == load(TRAINING, name="training.yaml").revision

    def test_an_empty_folder_is_an_empty_set(self, tmp_path):
        assert loading.load_dir(tmp_path).policies == ()
        assert loading.load_dir(tmp_path).revision == PolicySet.empty().revision

    def test_a_missing_folder_is_a_load_error_naming_it(self, tmp_path):
        with pytest.raises(PolicyLoadError, match=re.escape(str(tmp_path / "nope"))):
            loading.load_dir(tmp_path / "nope")

    def test_the_shipped_starter_policies_load(self):
        policies = loading.load_dir(Path(__file__).resolve().parents[2] / "policies")
        assert {"training", "inference", "notebooks", "web-no-gpus", "default-gpu"} <= {
            p.name for p in policies.policies}


class TestImmutable:
    def test_a_policy_set_cannot_be_changed(self):
        import dataclasses
        policies = load(TRAINING)
        with pytest.raises(dataclasses.FrozenInstanceError):
            policies.revision = "0" * 12
        with pytest.raises(dataclasses.FrozenInstanceError):
            policies.policies[0].priority = 1
        assert isinstance(policies.policies, tuple)

    def test_get_finds_a_policy_by_name(self):
        policies = load(TRAINING, FALLBACK)
        assert policies.get("fallback").priority == 0 and policies.get("nope") is None


class TestRevision:
    def test_revision_is_twelve_hex_characters(self):
        assert re.fullmatch(r"[0-9a-f]{12}", load(TRAINING).revision)

    def test_same_content_gives_the_same_revision(self, tmp_path):
        write(tmp_path / "one", {"a.yaml": TRAINING, "b.yaml": FALLBACK})
        write(tmp_path / "two", {"b.yaml": FALLBACK, "a.yaml": TRAINING})
        assert loading.load_dir(tmp_path / "one").revision == loading.load_dir(tmp_path / "two").revision

    @pytest.mark.parametrize("edit", [
        lambda text: text.replace("max: 8", "max: 7"),
        lambda text: text + "# a comment is content too\n",
    ], ids=["a value changed", "a comment added"])
    def test_any_edit_changes_the_revision(self, tmp_path, edit):
        write(tmp_path, {"a.yaml": TRAINING})
        before = loading.load_dir(tmp_path).revision
        (tmp_path / "a.yaml").write_text(edit(TRAINING))
        assert loading.load_dir(tmp_path).revision != before

    def test_renaming_a_file_changes_the_revision(self, tmp_path):
        write(tmp_path, {"a.yaml": TRAINING})
        before = loading.load_dir(tmp_path).revision
        (tmp_path / "a.yaml").rename(tmp_path / "b.yaml")
        assert loading.load_dir(tmp_path).revision != before

    def test_ignored_files_do_not_change_the_revision(self, tmp_path):
        write(tmp_path, {"a.yaml": TRAINING})
        before = loading.load_dir(tmp_path).revision
        write(tmp_path, {"kustomization.yaml": "kind: Kustomization\n", "tests/x/case.yaml": "a: 1\n",
                         ".swap.yaml": "x"})
        assert loading.load_dir(tmp_path).revision == before


class TestErrorsPoint:
    def test_errors_name_the_file_the_document_and_the_field_path(self, tmp_path):
        write(tmp_path, {"training.yaml": FALLBACK + "---\n" + TRAINING.replace("max: 8", "max: eight")})
        with pytest.raises(PolicyLoadError) as caught:
            loading.load_dir(tmp_path)
        (problem,) = caught.value.problems
        assert re.search(r"training\.yaml, document 2, spec\.gpu\.max: 'eight' is not of type 'integer'$", problem)

    @pytest.mark.parametrize(("spec", "path", "says"), [
        ("gpu: {max: eight}", "spec.gpu.max", "'eight' is not of type 'integer'"),
        ("gpu: {default: 0}", "spec.gpu.default", "0 is less than the minimum of 1"),
        ("priority: [1]", "spec.priority", "is not of type 'integer'"),
        ("mode: sometimes", "spec.mode", "'sometimes' is not one of"),
        ("match: {namespaces: ml-*}", "spec.match.namespaces", "is not of type 'array'"),
        ("match: {gpuOnly: 'yes'}", "spec.match.gpuOnly", "is not of type 'boolean'"),
        ("match: {podSelector: {matchLabels: {gpugate.io/gpus: 2}}}",
         "spec.match.podSelector.matchLabels.gpugate.io/gpus", "2 is not of type 'string'"),
        ("match: {podSelector: {matchExpressions: [{key: a, operator: Equals}]}}",
         "spec.match.podSelector.matchExpressions[0].operator", "'Equals' is not one of"),
        ("placement: {strategy: scatter}", "spec.placement.strategy", "'scatter' is not one of"),
        ("placement: {topology: {mode: required}}", "spec.placement.topology", "'key' is a required property"),
        ("deny: [{namespaces: [web-*]}]", "spec.deny[0]", "'message' is a required property"),
        ("tolerations: sometimes", "spec.tolerations", "expected 'auto', 'none' or a list of tolerations"),
        # unknown fields: named at the object that holds them
        ("gpu: {maximum: 8}", "spec.gpu", "unknown field(s): 'maximum'"),
        ("priorty: 5", "spec", "unknown field(s): 'priorty'"),
        ("match: {namespace: [ml-*]}", "spec.match", "unknown field(s): 'namespace'"),
        ("placement: {topology: {key: k, weight: 3}}", "spec.placement.topology", "unknown field(s): 'weight'"),
        ("match: {podSelector: {matchLabel: {a: b}}}", "spec.match.podSelector", "unknown field(s): 'matchLabel'"),
    ], ids=lambda v: v if isinstance(v, str) and v.startswith("spec") else None)
    def test_wrong_types_values_and_unknown_fields_name_the_field(self, spec, path, says):
        (problem,) = problems_of(policy("x", spec))
        assert problem.startswith(f"p.yaml, document 1, {path}: ")
        assert says in problem

    def test_an_unknown_top_level_field_is_an_error(self):
        (problem,) = problems_of(policy("x") + "status: {}\n")
        assert "document 1" in problem and "unknown field(s)" in problem and "'status'" in problem

    def test_an_unknown_field_inside_a_toleration_is_named_with_its_position(self):
        (problem,) = problems_of(policy("x", "tolerations: [{key: a}, {key: b, opertor: Exists}]"))
        assert problem.startswith("p.yaml, document 1, spec.tolerations[1]") and "'opertor'" in problem

    @pytest.mark.parametrize(("spec", "path"), [
        ("gpu: {products: [NVIDIA H100 80GB HBM3]}", "spec.gpu.products[0]"),
        ("gpu: {families: [Hopper/Grace]}", "spec.gpu.families[0]"),
        ('placement: {topology: {key: "gpu clique"}}', "spec.placement.topology.key"),
        ("match: {podSelector: {matchExpressions: [{key: team, operator: In}]}}",
         "spec.match.podSelector.matchExpressions[0]"),
        ("match: {podSelector: {matchExpressions: [{key: team, operator: Exists, values: [a]}]}}",
         "spec.match.podSelector.matchExpressions[0]"),
        ('match: {podSelector: {matchLabels: {"team name": a}}}', "spec.match.podSelector.matchLabels"),
    ], ids=["a product name copied from nvidia-smi (spaces)", "a family with a slash",
            "a topology key that is not a label key", "In without values", "Exists with values",
            "a label key with a space"])
    def test_values_kubernetes_would_refuse_are_refused_at_load(self, spec, path):
        (problem,) = problems_of(policy("x", spec))
        assert problem.startswith(f"p.yaml, document 1, {path}")

    @pytest.mark.parametrize("resource", ["nvidia.com/gpus", "nvidia.com/GPU", "nvidia.com/mig-1g", "nvidia.com/"])
    def test_an_unknown_nvidia_resource_is_named_with_the_known_ones(self, resource):
        (problem,) = problems_of(policy("x", f"gpu: {{resource: {resource}}}"))
        assert problem.startswith("p.yaml, document 1, spec.gpu.resource: ")
        assert f"unknown NVIDIA resource {resource!r}" in problem
        assert "nvidia.com/gpu, nvidia.com/gpu.shared or nvidia.com/mig-<g>g.<mem>gb" in problem

    def test_an_unknown_allowed_resource_names_its_list_position(self):
        (problem,) = problems_of(policy("x", "gpu: {allowedResources: [nvidia.com/gpu.shared, nvidia.com/mig-1g.5g]}"))
        assert problem.startswith("p.yaml, document 1, spec.gpu.allowedResources[1]: unknown NVIDIA resource")

    def test_a_non_nvidia_resource_is_reported_as_an_unknown_resource(self):
        (problem,) = problems_of(policy("x", "gpu: {resource: amd.com/gpu}"))
        assert "resource" in problem.split(": ", 1)[1]

    @pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                                          "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.5gb.shared"])
    def test_known_nvidia_resources_load(self, resource):
        assert load(policy("x", f"gpu: {{resource: {resource}}}")).policies[0].gpu.resource == resource

    def test_malformed_yaml_names_the_line_and_column(self):
        text = policy("x", "gpu: {max: 8}") + "  placement: [strategy: pack\n"
        (problem,) = problems_of(text, name="broken.yaml")
        match = re.fullmatch(r"broken\.yaml, line (\d+), column (\d+): invalid YAML: .+", problem)
        assert match, problem
        assert int(match.group(1)) >= text.count("\n") - 1

    def test_bad_indentation_names_its_line(self):
        text = "apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata:\n  name: x\n bad: 1\n"
        (problem,) = problems_of(text)
        assert problem.startswith("p.yaml, line 5, column 2: invalid YAML")

    @pytest.mark.parametrize(("data", "says"), [
        (b"apiVersion: \x80\n", "invalid YAML: unacceptable character #x0080"),
        (b"!!python/object/apply:os.system [echo]\n",
         "line 1, column 1: invalid YAML: could not determine a constructor"),
        (b"spec: *missing\n", "line 1, column 7: invalid YAML: found undefined alias 'missing'"),
    ], ids=["a byte that is not UTF-8", "a Python tag is never constructed", "an undefined alias"])
    def test_unreadable_yaml_is_refused_naming_the_file(self, data, says):
        with pytest.raises(PolicyLoadError) as caught:
            parsing.parse([("bad.yaml", data)])
        (problem,) = caught.value.problems
        assert problem.startswith("bad.yaml") and says in problem

    @pytest.mark.parametrize(("text", "says"), [
        ("- a\n- b\n", "expected a GPUPolicy mapping, got list"),
        ("just a string\n", "expected a GPUPolicy mapping, got str"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "expected apiVersion gpugate.io/v1alpha1 and kind "
                                                                  "GPUPolicy, got 'v1' 'ConfigMap'"),
        ("apiVersion: gpugate.io/v1\nkind: GPUPolicy\nmetadata: {name: x}\nspec: {}\n", "got 'gpugate.io/v1'"),
    ], ids=["a list", "a scalar", "another kind", "another version"])
    def test_a_document_that_is_not_a_gpupolicy_is_refused(self, text, says):
        (problem,) = problems_of(text)
        assert problem.startswith("p.yaml, document 1: ") and says in problem

    @pytest.mark.parametrize(("name", "says"), [
        ("Training", "'Training' is not a valid name"),
        ("gpu_policy", "'gpu_policy' is not a valid name"),
        ("x" * 64, "is too long"),
    ])
    def test_policy_names_must_be_dns_labels(self, name, says):
        (problem,) = problems_of(policy(name))
        assert problem.startswith("p.yaml, document 1, metadata.name: ") and says in problem

    def test_a_missing_name_is_an_error(self):
        (problem,) = problems_of(policy("x").replace("metadata: {name: x}", "metadata: {}"))
        assert "metadata: 'name' is a required property" in problem

    def test_default_above_max_is_an_error(self):
        (problem,) = problems_of(policy("x", "gpu: {default: 4, max: 2}"))
        assert problem == "p.yaml, document 1, spec.gpu.default: 4 is above spec.gpu.max 2"

    def test_integer_fields_written_as_floats_load_as_ints(self):
        """JSON Schema's integer admits 8.0; messages and injected counts must still say 8."""
        (p,) = load(policy("x", "priority: 3.0\ngpu: {max: 8.0, default: 1.0, minMemoryMiB: 40000.0}")).policies
        assert [type(v) for v in (p.priority, p.gpu.max, p.gpu.default, p.gpu.min_memory_mib)] == [int] * 4
        assert (p.priority, p.gpu.max, p.gpu.default) == (3, 8, 1)

    def test_a_fractional_count_is_refused(self):
        (problem,) = problems_of(policy("x", "gpu: {max: 1.5}"))
        assert problem.startswith("p.yaml, document 1, spec.gpu.max: 1.5 is not of type 'integer'")


class TestAllOrNothing:
    def test_every_problem_is_listed_at_once(self, tmp_path):
        write(tmp_path, {"a.yaml": policy("a", "gpu: {max: x}"), "b.yaml": "key: [unclosed\n",
                         "c.yaml": TRAINING})
        with pytest.raises(PolicyLoadError) as caught:
            loading.load_dir(tmp_path)
        problems = caught.value.problems
        assert len(problems) == 2
        assert any("a.yaml, document 1, spec.gpu.max" in p for p in problems)
        assert any("b.yaml, line" in p for p in problems)
        assert str(caught.value) == "\n".join(problems)

    def test_one_bad_document_refuses_the_whole_set(self):
        with pytest.raises(PolicyLoadError):
            load(TRAINING, INFERENCE, policy("bad", "gpu: {max: 0}"))

    def test_the_error_is_a_gpugate_error_for_the_cli(self):
        from webhook.errors import GpugateError
        assert issubclass(PolicyLoadError, GpugateError)


class TestDuplicatesAndOverlap:
    def test_duplicate_names_are_an_error_naming_both_places(self, tmp_path):
        write(tmp_path, {"a.yaml": TRAINING, "b.yaml": FALLBACK + "---\n" + TRAINING.replace("priority: 100",
                                                                                           "priority: 5")})
        with pytest.raises(PolicyLoadError) as caught:
            loading.load_dir(tmp_path)
        (problem,) = caught.value.problems
        assert re.search(r"b\.yaml, document 2, metadata\.name: duplicate policy name 'training' "
                         r"\(first defined in .*a\.yaml, document 1\)", problem)

    @pytest.mark.parametrize(("a", "b"), [
        ('match: {namespaces: ["ml-*"]}', 'match: {namespaces: ["ml-train"]}'),
        ('match: {namespaces: ["*-prod"]}', 'match: {namespaces: ["ml-*"]}'),
        ("match: {podSelector: {matchLabels: {team: a}}}", "match: {podSelector: {matchLabels: {profile: x}}}"),
        ("match: {podSelector: {matchExpressions: [{key: p, operator: In, values: [a, b]}]}}",
         "match: {podSelector: {matchExpressions: [{key: p, operator: NotIn, values: [a]}]}}"),
        ("mode: audit", "mode: enforce"),
    ], ids=["glob covers a name", "prefix and suffix globs meet", "different label keys can both hold",
            "In a,b vs NotIn a leaves b", "audit still competes"])
    def test_equal_priorities_that_can_match_one_pod_are_refused(self, a, b):
        (problem,) = problems_of(policy("first", a, priority=7), policy("second", b, priority=7))
        assert problem.startswith("p.yaml, document 2, spec.priority: ")
        assert "'first' and 'second' both have priority 7" in problem
        assert "give one a higher priority" in problem

    @pytest.mark.parametrize(("a", "b"), [
        ('match: {namespaces: ["ml-*"]}', 'match: {namespaces: ["web-*"]}'),
        ('match: {namespaces: ["team-?"]}', 'match: {namespaces: ["team-ab"]}'),
        ("match: {podSelector: {matchLabels: {gpugate.io/profile: training}}}",
         "match: {podSelector: {matchLabels: {gpugate.io/profile: inference}}}"),
        ("match: {podSelector: {matchExpressions: [{key: p, operator: Exists}]}}",
         "match: {podSelector: {matchExpressions: [{key: p, operator: DoesNotExist}]}}"),
        ("match: {podSelector: {matchLabels: {p: a}}}",
         "match: {podSelector: {matchExpressions: [{key: p, operator: NotIn, values: [a]}]}}"),
    ], ids=["namespace globs apart", "one-character glob vs two characters", "profiles differ",
            "Exists vs DoesNotExist", "matchLabels vs NotIn the same value"])
    def test_equal_priorities_with_disjoint_matches_load(self, a, b):
        assert len(load(policy("first", a, priority=7), policy("second", b, priority=7)).policies) == 2

    def test_different_priorities_may_overlap(self):
        assert len(load(TRAINING, FALLBACK).policies) == 2

    @pytest.mark.parametrize(("rest", "other", "disjoint"), [
        ('["*"], excludeNamespaces: ["ml-*"]', '["ml-*"]', True),
        ('["*"], excludeNamespaces: ["ml-*"]', '["ml-train-*", "ml-serve"]', True),
        ('["ml-*", "web-*"], excludeNamespaces: ["web-*", "ml-a"]', '["ml-a", "web-b"]', True),
        ('["*"], excludeNamespaces: ["ml-a"]', '["ml-*"]', False),
        ('["*"], excludeNamespaces: ["ml-?"]', '["ml-*"]', False),
        ('["*"], excludeNamespaces: ["ml-*"]', '["ml-*", "research-*"]', False),
    ], ids=["an exclude equal to the other include", "an exclude prefix covering the other globs",
            "each of the other globs excluded", "an exclude of one name leaves the rest of the glob",
            "ml-? does not cover ml-long", "one glob of the other policy is not excluded"])
    def test_excludes_make_equal_priorities_disjoint_only_when_they_cover_the_other_policy(self, rest, other,
                                                                                           disjoint):
        """Covered: both load. A namespace left in common: refused, naming the shared priority."""
        documents = (policy("rest", f"match: {{namespaces: {rest}}}", priority=1),
                     policy("other", f"match: {{namespaces: {other}}}", priority=1))
        if disjoint:
            assert len(load(*documents).policies) == 2
        else:
            (problem,) = problems_of(*documents)
            assert "both have priority 1" in problem


class TestYaml11:
    def test_bare_off_is_the_mode_off(self):
        assert load(policy("x", "mode: off")).policies[0].mode == "off"

    def test_bare_no_is_avoid_congested_no(self):
        assert load(policy("x", "placement: {avoidCongested: no}")).policies[0].placement.avoid_congested == "no"

    @pytest.mark.parametrize("text", ['mode: "off"', "mode: 'off'"])
    def test_quoted_off_is_also_off(self, text):
        assert load(policy("x", text)).policies[0].mode == "off"

    def test_bare_on_is_still_an_error(self):
        (problem,) = problems_of(policy("x", "mode: on"))
        assert problem.startswith("p.yaml, document 1, spec.mode: True is not one of")


class TestDefaults:
    def test_an_empty_spec_gets_the_documented_defaults(self):
        (p,) = load(policy("x")).policies
        assert (p.priority, p.mode, p.tolerations) == (0, "enforce", "auto")
        assert p.match.namespaces == ("*",) and p.match.gpu_only is True
        assert p.gpu.resource == "nvidia.com/gpu" and p.gpu.default is None and p.gpu.max is None
        assert p.placement.strategy == "none" and p.placement.avoid_congested == "no"
        assert p.placement.topology is None

    def test_an_explicit_toleration_list_is_parsed(self):
        (p,) = load(policy("x", "tolerations: [{key: a, value: b, effect: NoSchedule}, {key: c}]")).policies
        assert [t.as_k8s() for t in p.tolerations] == [
            {"key": "a", "operator": "Equal", "value": "b", "effect": "NoSchedule"},
            {"key": "c", "operator": "Exists"},
        ]

    def test_the_topology_mode_defaults_to_preferred(self):
        (p,) = load(policy("x", "placement: {topology: {key: nvidia.com/gpu.clique}}")).policies
        assert (p.placement.topology.key, p.placement.topology.mode) == ("nvidia.com/gpu.clique", "preferred")


class TestValuesTheApiServerWouldRefuse:
    """A policy that loads must never shape a pod the API server then refuses as Invalid."""

    @pytest.mark.parametrize(("spec", "path", "says"), [
        ("tolerations: [{key: k, operator: Exists, value: v}]", "spec.tolerations[0]", "Exists takes no value"),
        ("tolerations: [{operator: Equal, value: v}]", "spec.tolerations[0]", "without a key needs operator Exists"),
        ("tolerations: [{key: x, operator: Exists, effect: NoSchedule, tolerationSeconds: 5}]",
         "spec.tolerations[0]", "tolerationSeconds needs effect NoExecute"),
        ("schedulerName: Bad Name", "spec.schedulerName", "is not a Kubernetes object name"),
        ("priorityClassName: High_Priority", "spec.priorityClassName", "is not a Kubernetes object name"),
        ("runtimeClassName: -nvidia", "spec.runtimeClassName", "is not a Kubernetes object name"),
    ], ids=["exists-with-value", "empty-key-equal", "seconds-without-noexecute", "scheduler-name",
            "priority-class", "runtime-class"])
    def test_refused_at_load_with_the_field(self, spec, path, says):
        (problem,) = problems_of(policy("x", spec))
        assert problem.startswith(f"p.yaml, document 1, {path}: ") and says in problem

    def test_valid_tolerations_and_names_load(self):
        loaded = load(policy("x", "tolerations: [{operator: Exists}, {key: a, operator: Equal, value: b, "
                                  "effect: NoExecute, tolerationSeconds: 30}]\nschedulerName: gpugate-binpack\n"
                                  "priorityClassName: ml.high"))
        assert loaded.policies[0].scheduler_name == "gpugate-binpack"
