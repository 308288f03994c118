"""The canary controller against a fake API server and a real git remote: it decides and pushes by itself,
never twice for one rollout, redoes a refused push on the new head and gives up loudly, never forcing.

The remote is a bare repository on disk; "someone else pushing" is a real second clone pushing a real
commit between the controller's fetch and its push, so git itself refuses the controller's push.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.kubefake import fake_kube  # noqa: F401 - pytest fixture
from tests.stack.conftest import GIT_ENV, commit_all, git, project_copy
from webhook.kubeclient import api_client
from webhook.lease import LeaseSettings
from webhook.stack import canary_controller, canary_observe, canarygit, canarymetrics, manifests
from webhook.stack.gitrepo import Repo

NEW = "610.57.04"
CANARY_YAML = """apiVersion: gpugate.io/v1alpha1
kind: CanaryAnalysis
pools: [canary]
promoteTo: [default]
windowSeconds: 0
intervalSeconds: 0.2
timeoutSeconds: 600
"""


def node(name: str, pool: str, state: str, driver: str) -> dict:
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu-operator.driver.owner": pool,
              "nvidia.com/gpu-driver-upgrade-state": state, "nvidia.com/cuda.driver-version.full": driver}
    if pool == "canary":
        labels["gpugate.io/driver-pool"] = "canary"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def nvidia_driver(name: str) -> dict:
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": name},
            "spec": {"driverType": "gpu", "image": "driver", "version": "595.91.07", "default": name == "default"}}


class Remote:
    """A bare remote, and a person's clone that pushes to it."""

    def __init__(self, source: Path, tmp: Path) -> None:
        self.bare = tmp / "remote.git"
        git(tmp, "clone", "-q", "--bare", str(source), str(self.bare))
        self.work = tmp / "work"
        git(tmp, "clone", "-q", str(self.bare), str(self.work))

    def person_commits(self, message: str, edit=None) -> str:
        git(self.work, "pull", "-q", "--ff-only")
        (self.work / "NOTES").write_text(f"{message} {time.time()}\n")
        if edit is not None:
            edit(self.work)
        commit_all(self.work, message)
        git(self.work, "push", "-q", "origin", "HEAD:main")
        return git(self.work, "rev-parse", "HEAD").strip()

    def log(self) -> list[str]:
        return git(self.bare, "log", "--format=%s").splitlines()

    def trailers(self, sha: str = "main") -> str:
        return git(self.bare, "show", "-s", "--format=%(trailers)", sha)


@pytest.fixture(scope="module")
def rolled_out(tmp_path_factory) -> Path:
    """A bare remote holding the project's manifests, canary.yaml and a person's canary rollout commit
    (the canary pool to a new driver, checked by ``gpugate stack upgrade``); copied for each test."""
    from click.testing import CliRunner

    from webhook.cli import main

    tmp = tmp_path_factory.mktemp("canary-remote")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in GIT_ENV.items():
            patch.setenv(key, value)
        patch.setenv("HOME", str(tmp))
        source = project_copy(tmp / "source")
        (source / manifests.STACK_DIR / "canary.yaml").write_text(CANARY_YAML)
        commit_all(source, "canary.yaml for the controller")
        result = CliRunner().invoke(main, ["stack", "upgrade", "--repo", str(source), "--operator", "v26.7.0",
                                           "--driver", NEW, "--pool", "canary", "--skip-chart-render"])
        assert result.exit_code == 0, result.output
    git(tmp, "clone", "-q", "--bare", str(source), str(tmp / "remote.git"))
    return tmp / "remote.git"


@pytest.fixture
def remote(rolled_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Remote:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(rolled_out, tmp_path / "source.git")
    return Remote(tmp_path / "source.git", tmp_path)


def controller(remote: Remote, fake, tmp: Path, name: str, *, lease: bool = False,
               attempts: int = 3) -> canary_controller.CanaryController:
    repo = Repo.clone(str(remote.bare), tmp / name, branch="main", config=canarygit.credential_config(None))
    settings = canary_controller.ControllerSettings(
        where=canarygit.Where(repo=repo, remote="origin", branch="main"),
        eyes=canary_observe.Eyes(api=api_client(fake.url)), push_attempts=attempts,
        lease=LeaseSettings(name="gpugate-canary", namespace="gpugate-system", identity=name, duration=3,
                            renew_deadline=2, retry_period=0.2) if lease else None)
    return canary_controller.CanaryController(settings)


@pytest.fixture
def failed_canary(fake_kube):
    fake_kube.put_many([node("c1", "canary", "upgrade-failed", "595.91.07"), node("d1", "default", "upgrade-done",
                                                                                  "595.91.07"),
                        nvidia_driver("canary"), nvidia_driver("default")])
    return fake_kube


def test_a_failed_canary_node_is_rolled_back_by_a_pushed_commit_an_event_and_an_annotation(
        remote, failed_canary, tmp_path):
    ctl = controller(remote, failed_canary, tmp_path, "ctl-a")
    ctl.round()
    assert remote.log()[0].startswith("gpugate stack: rollback pool canary driver 610.57.04 -> 595.91.07 "
                                      "(upgrade-failed)"), remote.log()
    rollout = git(remote.bare, "rev-parse", "main^").strip()
    assert f"Gpugate-Canary: canary {rollout} rollback upgrade-failed" in remote.trailers()
    body = git(remote.bare, "show", "-s", "--format=%b", "main")
    assert "failure mode: upgrade-failed" in body and "evidence (canary): c1 went upgrade-failed" in body
    [event] = failed_canary.list("v1", "Event", "default")
    assert event["reason"] == "CanaryRollback" and "upgrade-failed" in event["message"]
    assert event["involvedObject"] == {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "name": "canary"}
    annotations = failed_canary.get("nvidia.com/v1alpha1", "NVIDIADriver", "canary")["metadata"]["annotations"]
    assert annotations["gpugate.io/canary-decision"] == "rollback"
    assert annotations["gpugate.io/canary-rollback-to"] == "595.91.07"
    assert canarymetrics.DECISIONS.labels(pool="canary", decision="rollback", mode="upgrade-failed")._value.get() >= 1
    assert manifests.load_stack(remote.work).pool("canary").driver == NEW, "the person's clone is untouched"
    git(remote.work, "pull", "-q", "--ff-only")
    from click.testing import CliRunner

    from webhook.cli import main

    status = CliRunner().invoke(main, ["stack", "status", "--repo", str(remote.work)])
    assert "canary rollback (upgrade-failed) of pool canary's rollout" in status.output, status.output


def test_a_rollout_is_decided_once_whatever_runs_after(remote, failed_canary, tmp_path):
    first = controller(remote, failed_canary, tmp_path, "ctl-a")
    first.round()
    first.round()
    controller(remote, failed_canary, tmp_path, "ctl-b").round()  # a restarted or newly elected one
    assert sum(1 for s in remote.log() if "rollback pool canary" in s) == 1, remote.log()
    assert len(failed_canary.list("v1", "Event", "default")) == 1


def test_two_replicas_with_the_lease_decide_a_rollout_once(remote, failed_canary, tmp_path):
    replicas = [controller(remote, failed_canary, tmp_path, name, lease=True) for name in ("ctl-a", "ctl-b")]
    stop = threading.Event()
    threads = [threading.Thread(target=r.run, args=(stop,), daemon=True) for r in replicas]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any("rollback pool canary" in s for s in remote.log()):
        time.sleep(0.2)
    time.sleep(1.5)  # both keep running rounds after the decision
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert sum(1 for s in remote.log() if "rollback pool canary" in s) == 1, remote.log()
    holders = failed_canary.list("coordination.k8s.io/v1", "Lease", "gpugate-system")
    assert len(holders) == 1


def test_a_push_refused_because_someone_pushed_is_redone_on_the_new_head(remote, failed_canary, tmp_path,
                                                                        monkeypatch):
    ctl = controller(remote, failed_canary, tmp_path, "ctl-a")
    real_push = Repo.push
    competing: list[str] = []

    def someone_pushes_first(self, where_to, branch):
        if not competing:
            competing.append(remote.person_commits("docs: a colleague's commit"))
        return real_push(self, where_to, branch)

    monkeypatch.setattr(Repo, "push", someone_pushes_first)
    ctl.round()
    log = remote.log()
    assert log[0].startswith("gpugate stack: rollback pool canary") and log[1] == "docs: a colleague's commit", log
    parent = git(remote.bare, "rev-parse", "main^").strip()
    assert parent == competing[0], "redone on the new head, the colleague's commit kept"


def test_a_push_refused_every_time_gives_up_loudly_and_never_forces(remote, failed_canary, tmp_path, monkeypatch):
    ctl = controller(remote, failed_canary, tmp_path, "ctl-a", attempts=2)
    real_push = Repo.push
    pushed: list[str] = []

    def someone_always_pushes_first(self, where_to, branch):
        pushed.append(remote.person_commits(f"docs: commit {len(pushed)}"))
        return real_push(self, where_to, branch)

    monkeypatch.setattr(Repo, "push", someone_always_pushes_first)
    ctl.round()
    assert not any("rollback pool" in s for s in remote.log()), "nothing forced over the colleague's commits"
    assert git(remote.bare, "rev-parse", "main").strip() == pushed[-1]
    [event] = failed_canary.list("v1", "Event", "default")
    assert event["type"] == "Warning" and event["reason"] == "CanaryPushRefused" and "not forced" in event["message"]
    ctl.round()
    assert len(pushed) == 2, "a given-up rollout is not retried behind the user's back"


def test_a_canary_node_still_upgrading_decides_nothing(remote, fake_kube, tmp_path):
    fake_kube.put_many([node("c1", "canary", "pod-restart-required", "595.91.07"), nvidia_driver("canary")])
    before = remote.log()
    controller(remote, fake_kube, tmp_path, "ctl-a").round()
    assert remote.log() == before and not fake_kube.list("v1", "Event", "default")


def test_a_healthy_canary_is_promoted_to_the_pools_canary_yaml_names(remote, fake_kube, tmp_path):
    fake_kube.put_many([node("c1", "canary", "upgrade-done", NEW), node("d1", "default", "upgrade-done", "595.91.07"),
                        nvidia_driver("canary"), nvidia_driver("default")])
    controller(remote, fake_kube, tmp_path, "ctl-a").round()
    assert remote.log()[0] == "gpugate stack: promote driver 610.57.04 from pool canary to pool default", remote.log()
    assert f"Gpugate-Canary: canary {git(remote.bare, 'rev-parse', 'main^').strip()} promote" in remote.trailers()
