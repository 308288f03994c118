"""The ``health:`` section: checked against its schema, every error named by its dotted path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from webhook.balancer import healthschema
from webhook.balancer.healthpolicy import FATAL_XIDS, NEVER_XIDS, HealthPolicy, HealthPolicyError, Rule
from webhook.balancer.quarantineledger import Ledger, LedgerError, Quarantine, ReleaseRequest, Returned, decode, encode
from webhook.balancer.settings import BalancerSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def test_the_defaults_follow_nvidias_catalogue() -> None:
    policy = HealthPolicy()
    assert not policy.enabled
    assert {48, 64, 74, 79, 95, 119, 120} <= set(FATAL_XIDS)
    assert set(NEVER_XIDS) >= {13, 31, 43, 45, 63, 92, 94} and not set(FATAL_XIDS) & set(NEVER_XIDS)
    assert 109 not in FATAL_XIDS and 109 not in NEVER_XIDS  # the two maps disagree: the site decides
    assert [r.signal for r in policy.rules] == ["xid", "ecc-dbe", "row-remap-failure", "driver-taint",
                                                "plugin-unhealthy"]


def test_the_section_renders_and_reads_back_as_itself() -> None:
    policy = HealthPolicy(enabled=True, dry_run=True, rules=(
        Rule(name="fatal", signal="xid", xids=(79, 48), effect="NoExecute", no_execute_after=60),))
    assert healthschema.parse(healthschema.render(policy)) == dataclasses.replace(
        policy, rules=(dataclasses.replace(policy.rules[0], xids=(48, 79)),))


def test_the_shipped_example_holds_the_defaults() -> None:
    section = yaml.safe_load((ROOT / "webhook" / "examples" / "balancer.yaml").read_text())["health"]
    assert healthschema.parse(section) == HealthPolicy()


@pytest.mark.parametrize(("section", "message"), [
    ({"enabeld": True}, "health: unknown key 'enabeld'; known keys here: dry_run, enabled,"),
    ({"hold": "1h"}, "health.hold: '1h' is not of type 'number'"),
    ({"hold_growth": 0.5}, "health.hold_growth: 0.5 is less than the minimum of 1"),
    ({"rules": [{"name": "x", "signal": "xid", "effect": "NoExec"}]},
     "health.rules[0].effect: 'NoExec' is not one of ['NoSchedule', 'NoExecute']"),
    ({"rules": [{"name": "x"}]}, "health.rules[0]: 'signal' is a required property"),
    ({"rules": [{"name": "x", "signal": "xid", "xids": [79, 43]}]},
     "health.rules[0] (x): XIDs [43] are in health.never_xids, which never quarantine"),
    ({"rules": [{"name": "x", "signal": "row-remap-failure", "count": 3}]},
     "health.rules[0] (x): row-remap-failure is a condition"),
    ({"rules": [{"name": "x", "signal": "xid"}, {"name": "x", "signal": "ecc-dbe"}]}, "two rules are named 'x'"),
    ({"rules": [{"name": "x", "signal": "xid", "no_execute_after": 5}]}, "no_execute_after needs effect: NoExecute"),
    ({"hold": 100, "hold_max": 50}, "health.hold_max (50) must be >= health.hold (100)"),
    ({"validation": {"labels": {"team": "not a label value!"}}}, "health.validation.labels.team: 'not a label"),
    ({"node_taint_effect": "NoExecute"}, "health.node_taint_effect: 'NoExecute' is not one of"),
])
def test_a_bad_section_is_refused_with_the_key_that_is_wrong(section: dict, message: str) -> None:
    with pytest.raises(HealthPolicyError) as caught:
        healthschema.parse(section)
    assert message in str(caught.value)


def test_the_balancer_config_refuses_a_bad_health_section_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "balancer.yaml"
    config.write_text("health:\n  rules:\n    - {name: fatal, signal: xdi}\n")
    with pytest.raises(SettingsError, match=rf"^{config}: health.rules\[0\].signal: 'xdi' is not one of"):
        BalancerSettings.from_file(config)


def test_holds_grow_by_strikes_up_to_the_maximum() -> None:
    policy = HealthPolicy(hold=60, hold_growth=3, hold_max=1000)
    assert [policy.hold_for(n) for n in (1, 2, 3, 4, 5)] == [60, 180, 540, 1000, 1000]


class TestLedger:
    LEDGER = Ledger(
        quarantines=(Quarantine(node="n1", gpu="GPU-1", rule="fatal-xid", signal="xid", reason="XID 79",
                                slug="xid-79", since=1.0, hold_until=2.5, strikes=2, validation="running",
                                validation_pod="p"),),
        returned=(Returned(node="n2", gpu="GPU-2", strikes=1, at=3.0, how="operator", accepted=("driver-taint-79",)),),
        requests=(ReleaseRequest(node="n1", gpu="GPU-1", by="alice", reason="RMA", at=4.0),))

    def test_the_ledger_reads_back_as_written(self) -> None:
        assert decode(encode(self.LEDGER)) == self.LEDGER
        assert encode(decode(encode(self.LEDGER))) == encode(self.LEDGER)

    @pytest.mark.parametrize(("text", "message"), [
        ("{", "is not JSON"),
        ('{"format": 2}', "expected a document of format 1, got 2"),
        ('{"format": 1, "quarantines": [{"node": "n"}]}', "missing"),
        ('{"format": 1, "returned": [{"node": "n", "gpu": "g", "strikes": "2", "at": 1, "how": "x"}]}',
         "Returned.strikes must be a int"),
        ('{"format": 1, "requests": [{"node": "n", "gpu": "g", "by": "a", "reason": "b", "at": "now"}]}',
         "ReleaseRequest.at must be a number"),
        ('{"format": 1, "returned": [{"nod": "n"}]}', "Returned has no field 'nod'"),
    ])
    def test_an_unreadable_ledger_says_what_is_wrong(self, text: str, message: str) -> None:
        with pytest.raises(LedgerError, match="ConfigMap x") as caught:
            decode(text, where="ConfigMap x")
        assert message in str(caught.value)

    def test_an_absent_ledger_is_empty(self) -> None:
        assert decode(None) == decode("") == Ledger()


@given(st.lists(st.integers(min_value=1, max_value=1023), unique=True, max_size=20))
def test_property_any_xid_list_outside_the_never_list_loads(xids: list[int]) -> None:
    wanted = [x for x in xids if x not in NEVER_XIDS]
    policy = healthschema.parse({"rules": [{"name": "mine", "signal": "xid", "xids": wanted}]})
    assert policy.rules[0].xids == tuple(sorted(wanted))


def test_the_docs_describe_every_key_of_the_schema() -> None:
    """docs/health.md's table names each key the schema accepts, so neither can drift alone."""
    text = (ROOT / "docs" / "health.md").read_text()
    keys = []
    for key, spec in healthschema.SCHEMA["properties"].items():
        if key == "rules":
            keys += [f"rules[].{k}" for k in healthschema.RULE_SCHEMA["properties"]]
        elif spec.get("type") == "object":
            keys += [f"{key}.{k}" for k in spec["properties"]]
        else:
            keys.append(key)
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"docs/health.md does not describe {missing}"
