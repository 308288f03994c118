"""The webhook's view of the balancer's GPUInventory file: hot, never a reason to fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clock import Clock
from webhook.kube import inventory
from webhook.server.inventoryfile import InventoryFile


def document(**fields) -> str:
    return json.dumps({"apiVersion": inventory.API_VERSION, "kind": inventory.KIND,
                       "generatedAt": "2026-12-01T00:00:00Z", **fields})


def test_changes_are_picked_up_and_a_bad_file_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(document(defaultPriorityClass="cluster-default"))
    clock = Clock()
    view = InventoryFile(path, interval=1.0, clock=clock)
    assert view.current().default_priority_class == "cluster-default"
    path.write_text(document(defaultPriorityClass="other"))
    assert view.current().default_priority_class == "cluster-default"  # not re-checked within the interval
    clock.now = 1.5
    assert view.current().default_priority_class == "other"
    path.write_text("{not json")
    clock.now = 3.0
    assert view.current().default_priority_class == "other"


def test_no_file_means_no_inventory(tmp_path: Path) -> None:
    assert InventoryFile(tmp_path / "absent.json").current() is inventory.EMPTY
    assert InventoryFile(None).current() is inventory.EMPTY


@pytest.mark.parametrize(("text", "says"), [
    ("[]", "expected a JSON object"),
    (json.dumps({"apiVersion": "v1", "kind": "ConfigMap"}), "expected apiVersion gpugate.io/v1alpha1"),
    (document(defaultPriorityClass=3), "defaultPriorityClass"),
])
def test_a_bad_document_is_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(inventory.InventoryError, match=says):
        inventory.parse(text)
