"""Every GPUPolicy default is written once, in ``webhook/policy/model.py``: the parser passes only
what a document gives, and the schema's descriptions that state a default state the model's.

The parser used to restate each default beside the model (the whole-GPU resource, ``*``, the
idle threshold ...); a default changed in one place only would then differ between a policy that
leaves a block out and one that writes it empty.
"""

from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from typing import Any

import pytest

from tests.policy.kit import load, policy
from webhook.policy import model

BLOCKS = ("match", "gpu", "placement", "claims", "idle", "disruption")


def only(text: str) -> model.GPUPolicy:
    (found,) = load(text).policies
    return found


def test_a_policy_that_says_nothing_is_the_models_defaults() -> None:
    found = only(policy("bare"))
    assert found == model.GPUPolicy(name=found.name, source=found.source)


@pytest.mark.parametrize("block", BLOCKS)
def test_an_empty_block_is_the_models_defaults_for_it(block: str) -> None:
    found = only(policy("empty", f"{block}: {{}}"))
    assert found == model.GPUPolicy(name=found.name, source=found.source)


def test_a_given_field_overrides_its_default_and_leaves_the_others() -> None:
    found = only(policy("some", "gpu: {max: 3}\nidle: {threshold: 0.2}"))
    assert found.gpu == dataclasses.replace(model.GPUSpec(), max=3)
    assert found.idle == dataclasses.replace(model.IdleRules(), threshold=0.2)


def _descriptions(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        out = [(path, node["description"])] if isinstance(node.get("description"), str) else []
        for key, value in node.items():
            out += _descriptions(value, f"{path}/{key}")
        return out
    if isinstance(node, list):
        return [d for i, item in enumerate(node) for d in _descriptions(item, f"{path}/{i}")]
    return []


STATED = {"threshold": model.IdleRules().threshold, "after": model.IdleRules().after,
          "minRuntimeSeconds": model.Disruption().min_runtime_seconds}


def test_the_schema_states_the_models_defaults() -> None:
    """A schema description that says ``(default X)`` for a field says the model's default."""
    schema = json.loads(resources.files("webhook.policy").joinpath("schema.json").read_text(encoding="utf-8"))
    checked = set()
    for path, text in _descriptions(schema):
        stated = re.search(r"\(default (\S+)\)", text)
        field = path.rsplit("/", 1)[-1]
        if stated is not None and field in STATED:
            assert stated.group(1) == str(STATED[field]), path
            checked.add(field)
    assert checked == set(STATED)
