"""PolicyStore: reload on content change only, all-or-nothing, one refusal per bad content, no torn reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.server.harness import REPO
from webhook.policy import loading, parsing
from webhook.policy.store import PolicyStore, folder_digest


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    target.mkdir()
    for path in (REPO / "policies").glob("*.yaml"):
        shutil.copy(path, target / path.name)
    return target


def test_loads_once_and_reloads_only_when_content_changes(folder):
    loaded, refused = [], []
    store = PolicyStore(folder, on_loaded=lambda new, old: loaded.append((new.revision, old)),
                        on_refused=refused.append)
    assert store.current() is None and not store.ready
    first = store.check()
    assert first.loaded and store.ready and store.current().revision == loading.load_dir(folder).revision
    assert not store.check().changed                       # nothing changed: nothing read twice
    (folder / "README.md").write_text("not a policy")      # files the loader ignores do not count
    (folder / "kustomization.yaml").write_text("resources: []\n")
    (folder / ".hidden.yaml").write_text("junk: [")
    assert not store.check().changed
    training = folder / "training.yaml"
    training.write_text(training.read_text().replace("max: 8", "max: 4"))
    second = store.check()
    assert second.loaded and second.revision != first.revision
    assert [new for new, _ in loaded] == [first.revision, second.revision]
    assert loaded[0][1] is None and loaded[1][1].revision == first.revision
    assert refused == []


def test_a_bad_change_is_refused_once_and_the_last_good_set_serves(folder):
    refused = []
    store = PolicyStore(folder, on_refused=refused.append)
    good = store.check().revision
    (folder / "training.yaml").write_text("apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: t}\n"
                                          "spec: {gpu: {max: eight}}\n")
    outcome = store.check()
    assert not outcome.loaded and "spec.gpu.max" in outcome.error
    assert store.current().revision == good
    assert not store.check().changed and len(refused) == 1   # the same bad content is not re-reported
    (folder / "training.yaml").unlink()                      # fixing it (here: removing it) loads again
    assert store.check().loaded and store.current().revision != good


def test_a_change_during_loading_is_not_swapped_in(folder):
    """A ConfigMap swap in the middle of a load could mix two versions: the load is retried."""
    calls = []

    def read_then_change(path: Path) -> loading.Texts:
        result = loading.read_dir(path)
        if not calls:
            (path / "inference.yaml").write_text((path / "inference.yaml").read_text() + "\n# edited\n")
        calls.append(parsing.parse(result).revision)
        return result

    store = PolicyStore(folder, read=read_then_change)
    torn = store.check(attempts=1)
    assert torn.changed and not torn.loaded and store.current() is None
    settled = store.check(attempts=1)
    assert settled.loaded and store.current().revision == loading.load_dir(folder).revision
    assert calls[0] != calls[1]


def test_a_worker_starting_during_a_swap_loads_at_once_instead_of_serving_without_policies(folder):
    """Once a flake in the reload test: a worker whose first load met a swap served 'no policy set'."""
    swaps = []

    def read_during_swaps(path: Path) -> loading.Texts:
        result = loading.read_dir(path)
        if len(swaps) < 2:  # the folder changes under the first two loads
            (path / "inference.yaml").write_text((path / "inference.yaml").read_text() + f"\n# swap {len(swaps)}\n")
            swaps.append(parsing.parse(result).revision)
        return result

    store = PolicyStore(folder, read=read_during_swaps)
    outcome = store.check()
    assert outcome.loaded and store.ready
    assert store.current().revision == loading.load_dir(folder).revision and len(swaps) == 2


def test_digest_follows_symlinks(tmp_path):
    data_a, data_b = tmp_path / "..a", tmp_path / "..b"
    data_a.mkdir(), data_b.mkdir()
    (data_a / "p.yaml").write_text("a")
    (data_b / "p.yaml").write_text("b")
    (tmp_path / "..data").symlink_to("..a")
    (tmp_path / "p.yaml").symlink_to("..data/p.yaml")
    before = folder_digest(tmp_path)
    (tmp_path / "..data_tmp").symlink_to("..b")
    (tmp_path / "..data_tmp").replace(tmp_path / "..data")
    assert folder_digest(tmp_path) != before


def test_a_missing_folder_is_refused_not_fatal(tmp_path):
    store = PolicyStore(tmp_path / "absent")
    outcome = store.check()
    assert not outcome.loaded and "no such folder" in outcome.error and store.current() is None


def test_an_emptied_folder_is_refused_and_the_last_good_set_keeps_serving(folder):
    """Deleting every policy file must not lift the deny rules."""
    refused = []
    store = PolicyStore(folder, on_refused=refused.append)
    good = store.check()
    assert good.loaded
    for path in folder.glob("*.yaml"):
        path.unlink()
    outcome = store.check()
    assert not outcome.loaded and "holds no GPUPolicy" in outcome.error and "--allow-empty-policies" in outcome.error
    assert store.current().revision == good.revision and len(refused) == 1


def test_a_process_that_starts_with_an_empty_folder_is_not_ready(tmp_path):
    store = PolicyStore(tmp_path)
    assert not store.check().loaded and not store.ready


def test_an_empty_set_loads_when_the_operator_allows_it(tmp_path):
    store = PolicyStore(tmp_path, allow_empty=True)
    assert store.check().loaded and store.ready and store.current().policies == ()


def test_a_process_whose_first_load_fails_serves_the_last_set_a_sibling_accepted(folder, tmp_path):
    """A worker restarted while the folder holds a bad edit must not start without policies."""
    snapshots = tmp_path / "snapshots"
    first = PolicyStore(folder, snapshot_dir=snapshots)
    good = first.check()
    (folder / "training.yaml").write_text("apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: t}\n"
                                          "spec: {gpu: {max: eight}}\n")
    assert not first.check().loaded and first.current().revision == good.revision
    second = PolicyStore(folder, snapshot_dir=snapshots)
    outcome = second.check()
    assert not outcome.loaded and "max" in outcome.error
    assert second.ready and second.current().revision == good.revision
    # Without the snapshot a new process would have nothing to serve.
    assert not PolicyStore(folder).check().loaded
