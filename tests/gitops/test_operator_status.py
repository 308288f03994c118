"""The ClusterPolicy and NVIDIADriver fixtures are statuses the GPU Operator can actually write.

Fixtures for an "ignored" ClusterPolicy (the controller never saves that state)
and for an NVIDIADriver that is "ignored" or reports NoGPUNodes (that controller writes neither)
had health branches of their own. Here every fixture must cite the code path that writes it and
match one of the writes below, transcribed from the controllers; and the scripts carry no branch
for a state or reason nobody writes (for the kind: ClusterPolicy and NVIDIADriver share one script).

Writes (NVIDIA/gpu-operator, the controllers at the pinned release line):
- ``controllers/clusterpolicy_controller.go`` Reconcile + ``internal/conditions/clusterpolicy.go``
  setConditions; ``controllers/nvidiadriver_controller.go`` Reconcile +
  ``internal/conditions/nvidiadriver.go`` setConditions. Both updaters write a Ready/Error pair:
  Ready=True(reason, message) + Error=False(reason "Ready"), or Ready=False(reason "Error") +
  Error=True(reason, message). The state is a separate write before the pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.gitops.luasandbox import run_health
from tests.gitops.test_health import installed

HEALTH = Path(__file__).resolve().parents[2] / "argocd" / "health" / "nvidia.com"


@dataclass(frozen=True)
class Write:
    state: str | None
    """status.state; None: no status at all."""
    true_type: str | None
    """The condition of the pair that is True; None: no conditions written yet."""
    reason: str | None
    cites: str
    """A code path the fixture's `# Written by:` header must name."""


CP = "controllers/clusterpolicy_controller.go"
ND = "controllers/nvidiadriver_controller.go"
WRITES: dict[str, tuple[Write, ...]] = {
    "ClusterPolicy": (
        Write(None, None, None, CP),                               # before the first reconcile; a duplicate forever
        Write("notReady", None, None, CP),                         # updateCRState(NotReady) before the conditions
        Write("ready", "Ready", "Reconciled", CP),
        Write("ready", "Ready", "NoGPUNodes", CP),
        Write("ready", "Ready", "NFDLabelsMissing", CP),
        Write("notReady", "Error", "OperandNotReady", CP),
        Write("notReady", "Error", "ReconcileFailed", CP),         # step() error; init() error while notReady
        Write("ready", "Error", "ReconcileFailed", CP),            # init() error: only the conditions change
        Write("ready", "Error", "OperandNotReady", CP),            # updateCRState(Ready) before SetConditionsReady
    ),
    "NVIDIADriver": (
        Write(None, None, None, ""),
        Write("notReady", None, None, ND),
        Write("ready", "Ready", "Reconciled", ND),
        Write("notReady", "Error", "DriverNotReady", ND),
        Write("notReady", "Error", "ReconcileFailed", ND),
        Write("notReady", "Error", "ConflictingNodeSelector", ND),
        Write("ready", "Error", "ReconcileFailed", ND),            # missing secretEnv Secret keeps the read state
        Write("ready", "Error", "DriverNotReady", ND),             # updateCrStatus(ready) before SetConditionsReady
        Write("disabled", "Error", "Reconciled", ND),              # useNvidiaDriverCRD false
    ),
}


def _fixtures() -> list[tuple[str, Path]]:
    return [(kind, path) for kind in WRITES for path in sorted((HEALTH / kind / "testdata").glob("*.yaml"))]


FIXTURES = _fixtures()


def _write_of(status: dict | None) -> tuple[str | None, str | None, str | None]:
    if not status:
        return (None, None, None)
    conditions = status.get("conditions") or []
    if not conditions:
        return (status.get("state"), None, None)
    true = [c for c in conditions if c["status"] == "True"]
    assert len(true) == 1, "the operator's pair has exactly one True condition"
    return (status.get("state"), true[0]["type"], true[0]["reason"])


@pytest.mark.parametrize(("kind", "path"), FIXTURES, ids=[f"{k}/{p.name}" for k, p in FIXTURES])
def test_fixture_is_a_status_the_operator_writes_and_cites_where(kind: str, path: Path) -> None:
    text = path.read_text()
    header = " ".join(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
    assert header.startswith("Written by:"), f"{path.name}: start with '# Written by: <code path>: <how>'"
    status = yaml.safe_load(text).get("status")
    write = _write_of(status)
    rows = [w for w in WRITES[kind] if (w.state, w.true_type, w.reason) == write]
    assert rows, f"{path.name}: no controller writes state/condition/reason {write}"
    assert rows[0].cites in header, f"{path.name}: cite {rows[0].cites}"
    if status and status.get("conditions"):
        pair = {c["type"]: c for c in status["conditions"]}
        assert set(pair) == {"Ready", "Error"}
        other = pair["Error"] if write[1] == "Ready" else pair["Ready"]
        assert other["status"] == "False" and other["reason"] == ("Ready" if write[1] == "Ready" else "Error")
        assert other["message"] == ""


@pytest.mark.parametrize(("kind", "never"), [
    ("ClusterPolicy", "ignored"),            # SetStatus(Ignored) is never written back
    ("NVIDIADriver", "ignored"),
    ("NVIDIADriver", "NoGPUNodes"),
])
def test_no_branch_for_what_the_operator_never_writes(kind: str, never: str) -> None:
    """The one nvidia.com script gives a state or reason the kind never writes no verdict of its
    own: an ``ignored`` state is just unexpected (Unknown), an NVIDIADriver's Ready=True NoGPUNodes
    reads as any Ready=True (the ClusterPolicy's NoGPUNodes message is not its)."""
    script, _ = installed("nvidia.com", kind)
    if never == "ignored":
        status: dict = {"state": "ignored"}
        want = {"status": "Unknown", "message": f"{kind} reports an unexpected state: ignored"}
    else:
        status = {"state": "ready", "conditions": [
            {"type": "Ready", "status": "True", "reason": never, "message": "m"},
            {"type": "Error", "status": "False", "reason": "Ready", "message": ""}]}
        want = {"status": "Healthy", "message": f"{kind} is ready: m"}
    assert run_health(script, {"kind": kind, "status": status}, open_libs=False) == want
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    assert '"ignored"' not in code, "the script branches on the state ignored"
    assert not any(never.lower() in p.name.lower() for _, p in FIXTURES if p.parent.parent.name == kind)


def test_every_write_has_a_fixture() -> None:
    """Each status a controller can write is tested (the table above is complete for the fixtures)."""
    for kind, writes in WRITES.items():
        seen = {_write_of(yaml.safe_load(p.read_text()).get("status")) for k, p in FIXTURES if k == kind}
        missing = [w for w in writes if (w.state, w.true_type, w.reason) not in seen]
        assert not missing, f"{kind}: no fixture for {missing}"
