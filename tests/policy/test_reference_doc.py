"""docs/policies.md's field reference and webhook/policy/schema.json cannot drift apart.

The reference block is generated (tools/policy_reference.py): types from the schema, defaults from
the real parser. These tests hold the page to what the generator makes of today's schema, and show
that the generator notices each kind of schema change a reviewer could miss.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import yaml

from tools import policy_reference as ref
from webhook.policy.parsing import parse

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "webhook" / "policy" / "schema.json").read_text())
DOC = (ROOT / "docs" / "policies.md").read_text()


def test_the_page_is_what_the_schema_and_the_parser_give() -> None:
    assert ref.regenerate(DOC, SCHEMA) == DOC, "docs/policies.md is stale: run python -m tools.policy_reference"


def test_every_field_has_a_meaning_and_every_spec_field_a_default() -> None:
    assert ref.gaps(DOC) == []


def test_every_schema_property_has_a_row() -> None:
    """Counted independently of the generator's walk: every "properties" key anywhere in the schema."""
    def count(node: object) -> int:
        if isinstance(node, dict):
            own = len(node.get("properties", {})) if isinstance(node.get("properties"), dict) else 0
            return own + sum(count(v) for v in node.values())
        return sum(count(v) for v in node) if isinstance(node, list) else 0
    # The rung's oneOf branches and the selector requirement's if/then/else restate no new field.
    restated = len(SCHEMA["$defs"]["selectorRequirement"]["if"]["properties"]) + \
        len(SCHEMA["$defs"]["selectorRequirement"]["then"]["properties"]) + \
        len(SCHEMA["$defs"]["selectorRequirement"]["else"]["properties"])
    assert len(ref.meanings(DOC)) == count(SCHEMA) - restated


def test_a_new_field_appears_without_a_meaning_and_fails_the_check() -> None:
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["spec"]["properties"]["gpu"]["properties"]["maxPerNode"] = {"type": "integer", "minimum": 1}
    fresh = ref.regenerate(DOC, schema)
    assert fresh != DOC
    assert "| `spec.gpu.maxPerNode` | integer, at least 1 |  |  |" in fresh
    assert ref.gaps(fresh) == ["no meaning written for GPUPolicy: spec.gpu.maxPerNode",
                               "no default read for GPUPolicy: spec.gpu.maxPerNode (no model attribute; see ATTRIBUTE)"]


def test_a_removed_field_disappears_and_a_changed_enum_changes_its_row() -> None:
    schema = copy.deepcopy(SCHEMA)
    del schema["properties"]["spec"]["properties"]["gpu"]["properties"]["families"]
    schema["properties"]["spec"]["properties"]["placement"]["properties"]["strategy"]["enum"].append("balance")
    fresh = ref.regenerate(DOC, schema)
    assert "`spec.gpu.families`" not in fresh and "`spec.gpu.families`" in DOC
    assert "`pack` \\| `spread` \\| `none` \\| `balance`" in fresh


def test_meanings_survive_a_regeneration_and_may_hold_a_pipe() -> None:
    written = ref.meanings(DOC)
    assert written[("GPUPolicy", "spec.mode")].startswith("`enforce` shapes and denies")
    edited = DOC.replace(written[("GPUPolicy", "spec.mode")], "one \\| two")
    assert ref.meanings(ref.regenerate(edited, SCHEMA))[("GPUPolicy", "spec.mode")] == "one \\| two"


def test_the_default_column_is_the_parsers() -> None:
    """Read back from the rendered rows, so a parser default that changes changes the page."""
    rows = {r.path: r.default for r in ref.rows(SCHEMA, ref.defaults(SCHEMA))}
    policy = parse([("p.yaml", ref.BARE)]).policies[0]
    assert rows["spec.mode"] == f"`{policy.mode}`" == "`enforce`"
    assert rows["spec.match.namespaces"] == '`["*"]`'
    assert rows["spec.gpu.max"] == "unset" and rows["spec.gpu.failRequestsGreaterThanOne"] == "`true`"
    assert rows["spec.rightsizing.maxInventoryAgeSeconds"] == "`300`"
    assert rows["spec.placement.topology.key"] == rows["spec.deny[].message"] == "required"


def test_every_policy_example_on_the_page_loads() -> None:
    """The YAML examples are policies the parser accepts, not sketches."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, re.DOTALL)
    policies = [b for b in blocks if "kind: GPUPolicy" in b]
    assert policies
    for n, block in enumerate(policies):
        assert yaml.safe_load(block)["kind"] == "GPUPolicy"
        parse([(f"example-{n}.yaml", block)])


def test_the_check_command_passes_on_the_tree() -> None:
    assert ref.main(["--check"]) == 0
