"""Contracts of the mutation core that the speed-ups rely on.

``mutate`` copies only what its steps edit and derives the patch itself from the two documents; these
tests fail if either shortcut ever changes the input or yields a patch other than the truth.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import jsonpatch
import pytest
import yaml

from webhook.admission import mutation, patches
from webhook.policy import loading, parsing

ROOT = Path(__file__).resolve().parents[2]
POLICIES = loading.load_dir(ROOT / "policies")
CASES = sorted((ROOT / "policies" / "tests").glob("*/case.yaml"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import mutate_core  # noqa: E402  (the benchmark's realistic pod and 24 policies)


def golden_inputs() -> list[tuple[str, dict, str]]:
    out = []
    for case in CASES:
        spec = yaml.safe_load(case.read_text())
        pod = yaml.safe_load((case.parent / spec.get("pod", "pod.yaml")).read_text())
        out.append((case.parent.name, pod, spec["namespace"]))
    out.append(("example", yaml.safe_load((ROOT / "webhook/examples/pod-training.yaml").read_text()), "ml-team"))
    return out


INPUTS = golden_inputs()


@pytest.mark.parametrize(("name", "pod", "namespace"), INPUTS, ids=[i[0] for i in INPUTS])
def test_mutate_never_changes_its_input(name: str, pod: dict, namespace: str) -> None:
    before = copy.deepcopy(pod)
    result = mutation.mutate(pod, namespace=namespace, policies=POLICIES)
    assert pod == before
    if result.patch:
        assert result.desired != pod


@pytest.mark.parametrize(("name", "pod", "namespace"), INPUTS, ids=[i[0] for i in INPUTS])
def test_the_derived_patch_equals_jsonpatch_make_patch_on_the_whole_pods(name: str, pod: dict, namespace: str) -> None:
    """The patch applies to the input, gives the desired pod, and equals jsonpatch's own derivation."""
    result = mutation.mutate(pod, namespace=namespace, policies=POLICIES)
    assert jsonpatch.apply_patch(pod, list(result.patch)) == result.desired
    full = jsonpatch.make_patch(pod, result.desired).patch
    assert sorted(json.dumps(op, sort_keys=True) for op in result.patch) == \
        sorted(json.dumps(op, sort_keys=True) for op in full)


def test_benchmark_pod_mutates_correctly_with_24_policies() -> None:
    policies = parsing.parse(mutate_core.policy_texts(24))
    pod = mutate_core.realistic_pod()
    before = copy.deepcopy(pod)
    result = mutation.mutate(pod, namespace="team-19-vision", policies=policies)
    assert pod == before
    assert str(result.policy).startswith("team-19@")
    assert jsonpatch.apply_patch(pod, list(result.patch)) == result.desired
    assert mutation.mutate(result.desired, namespace="team-19-vision", policies=policies).patch == ()


@pytest.mark.parametrize(("source", "desired"), [
    ({"a": [1, 2, 3]}, {"a": [1, 2, 3, {"x": 1}]}),
    ({"a": [{"k": 1}, {"k": 2}]}, {"a": [{"k": 1, "v": [1]}, {"k": 2}]}),
    ({"a": [{"k": 1}, {"k": 2}]}, {"a": [{"k": 9}, {"k": 2}, {"k": 3}]}),
    ({"a": 1}, {"a": True}),
    ({"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 1, "d/e": {"f": [1]}}}}),
    ({"a": [1, 2]}, {"a": [2]}),
    ({"x": {"y": 1}}, {"x": [1]}),
], ids=["append-dict", "edit-inside-member", "edit-and-append", "int-to-bool", "slash-key", "shrink", "type-change"])
def test_make_patch_is_exact_on_shapes_the_steps_do_not_produce(source: dict, desired: dict) -> None:
    patch = patches.make_patch(source, desired)
    assert jsonpatch.apply_patch(source, list(patch)) == desired
    assert json.dumps(jsonpatch.apply_patch(source, list(patch)), sort_keys=True) == json.dumps(desired, sort_keys=True)


@pytest.mark.parametrize(("path", "value", "named"), [
    (("spec", "containers", 0, "resources"), [], "spec.containers[0].resources is a list"),
    (("spec", "containers", 0, "resources", "limits"), "4", "spec.containers[0].resources.limits is a str"),
    (("spec", "tolerations"), {"key": "x"}, "spec.tolerations is a dict"),
    (("spec", "affinity"), [], "spec.affinity is a list"),
    (("metadata", "labels"), ["a"], "metadata.labels is a list"),
], ids=["resources-list", "limits-string", "tolerations-mapping", "affinity-list", "labels-list"])
def test_a_malformed_pod_field_is_named_not_a_crash(path: tuple, value: object, named: str) -> None:
    from webhook.errors import InputError

    pod = yaml.safe_load((ROOT / "webhook/examples/pod-training.yaml").read_text())
    parent = pod
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(InputError, match=re.escape(f"pod field {named}")):
        mutation.mutate(pod, namespace="ml-team", policies=POLICIES)


@pytest.mark.parametrize("label", ["1e999999k", "1e999999", "12345678901234567890123"])
def test_an_absurd_gpus_label_is_denied_not_a_crash(label: str) -> None:
    """A crafted label value once crashed validation (Overflow), and the webhook then failed open."""
    from webhook.admission import validation

    pod = yaml.safe_load((ROOT / "webhook/examples/pod-training.yaml").read_text())
    pod["metadata"]["labels"]["gpugate.io/gpus"] = label
    result = mutation.mutate(pod, namespace="ml-team", policies=POLICIES)
    expected = "asks for more GPUs than any node has"  # "1e999999k" too: it was "not a whole number"
    verdict = validation.validate(result.desired, namespace="ml-team", policies=POLICIES)
    assert not verdict.allowed and expected in verdict.message
    web = validation.validate(pod, namespace="web-shop", policies=POLICIES)
    assert not web.allowed and "GPUs are not available" in web.message
