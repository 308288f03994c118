"""``gpugate mutate --inventory FILE`` and ``gpugate serve --inventory FILE`` give one answer.

The server is the real one (gunicorn, TLS); the offline command runs as a user runs it. One pod
that asks 15Gi, judged with and without a fresh GPUInventory saying 2g.20gb MIG slices are free.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.server.harness import REPO, Server, copy_policies, review_of
from webhook.admission import reviews
from webhook.cli import main
from webhook.kube.inventory import Offer
from webhook.placement import gpuinventory as inventory

POD = REPO / "policies" / "tests" / "inference-rightsized-to-mig-slice" / "pod.yaml"


def fresh_inventory(path: Path) -> Path:
    content = inventory.Content(offers=(
        Offer(resource="nvidia.com/mig-2g.20gb", product="NVIDIA-H100-80GB-HBM3", memory_mib=19968,
              allocatable=12, free=5, nodes=2),
        Offer(resource="nvidia.com/gpu", product="NVIDIA-H100-80GB-HBM3", memory_mib=81559,
              allocatable=16, free=4, nodes=2)), default_priority_class=None, type_pressure=())
    path.write_text(inventory.serialize(inventory.document(content, generated_at=datetime.now(UTC))))
    return path


def offline_patch(policies: Path, *extra: str) -> list[dict]:
    result = CliRunner().invoke(main, ["mutate", str(POD), "--policies", str(policies), "-n", "ml-serving",
                                       "-o", "patch", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def server_patch(server: Server) -> list[dict]:
    answer = server.post("mutate", review_of(yaml.safe_load(POD.read_text()), namespace="ml-serving")).json()
    return reviews.decode_patch(answer["response"]["patch"])


def limits(patch: list[dict]) -> set[str]:
    return {key for op in patch if op["path"].endswith("/resources") or "/limits" in op["path"]
            for key in (op["value"].get("limits", op["value"]) if isinstance(op["value"], dict) else {})
            if key.startswith("nvidia.com/")}


@pytest.mark.parametrize("with_inventory", [True, False])
def test_offline_and_server_answer_alike(tmp_path: Path, with_inventory: bool) -> None:
    policies = copy_policies(tmp_path / "policies")
    extra = ["--inventory", str(fresh_inventory(tmp_path / "inventory.json"))] if with_inventory else []
    server = Server(tmp_path, policies=policies, extra=extra).start()
    try:
        served = server_patch(server)
    finally:
        server.stop()
    offline = offline_patch(policies, *extra)
    assert offline == served
    assert limits(served) == ({"nvidia.com/mig-2g.20gb"} if with_inventory else {"nvidia.com/gpu"}), served
