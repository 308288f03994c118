"""Trace loading: typed records, all-or-nothing, errors that name the file, the row and the column."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.replay import trace
from webhook.replay.trace import TraceError

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,393216,8,G2\nn2,104000,524288,2,T4\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p1,12000,16384,1,1000,,LS,Running,0,1,0\n"
        "p2,6000,12288,1,460,T4,LS,Running,0,1,0\n"
        "p3,88000,300000,8,1000,,BE,Running,0,1,0\n"
        "p4,4000,8192,0,0,,BE,Running,0,1,0\n")


def write(folder: Path, nodes: str = NODES, pods: str = PODS) -> Path:
    (folder / trace.NODE_FILE).write_text(nodes)
    (folder / trace.DEFAULT_POD_FILE).write_text(pods)
    return folder


def test_records_carry_every_column_the_scheduler_needs(tmp_path: Path) -> None:
    loaded = trace.load_trace(write(tmp_path))
    assert loaded.workload == "openb_pod_list_default"
    assert loaded.gpu_capacity_milli == 10_000
    assert loaded.nodes[1] == trace.NodeRecord("n2", 104000, 524288, 2, "T4")
    share = loaded.pods[1]
    assert (share.num_gpu, share.gpu_milli, share.gpu_spec, share.shares_gpu) == (1, 460, ("T4",), True)
    assert loaded.pods[2].gpu_request_milli == 8000 and not loaded.pods[2].shares_gpu
    assert loaded.pods[3].gpu_request_milli == 0


def test_a_five_column_pod_list_loads(tmp_path: Path) -> None:
    """The multigpu lists carry only name, cpu, memory, num_gpu and gpu_milli."""
    write(tmp_path)
    other = tmp_path / "openb_pod_list_multigpu20.csv"
    other.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,8000,100,2,1000\n")
    loaded = trace.load_trace(tmp_path, "openb_pod_list_multigpu20.csv")
    assert loaded.workload == "openb_pod_list_multigpu20"
    assert loaded.pods[0].gpu_spec == () and loaded.pods[0].qos == ""


@pytest.mark.parametrize(("pods", "message"), [
    (PODS.replace("p2,6000", "p2,six"), "row 3, column cpu_milli: expected an integer, got 'six'"),
    (PODS.replace("p3,88000,300000,8,1000", "p3,88000,300000,8,500"),
     "row 4, column gpu_milli: a 8-GPU pod must take whole GPUs"),
    (PODS.replace("p4,4000,8192,0,0", "p4,4000,8192,0,300"), "row 5, column gpu_milli: 300 for a pod with num_gpu 0"),
    (PODS.replace("p1,12000,16384,1,1000", "p1,12000,16384,1,1001"),
     "row 2, column gpu_milli: expected an integer between 0 and 1000"),
    (PODS.replace(",T4,", ",A100,"), "pod p2 asks for GPU model(s) A100, which no node has"),
    ("name,cpu_milli,memory_mib\np1,1,1\n", "header lacks column(s) num_gpu, gpu_milli"),
])
def test_a_bad_pod_row_is_refused_with_file_row_and_column(tmp_path: Path, pods: str, message: str) -> None:
    write(tmp_path, pods=pods)
    with pytest.raises(TraceError) as caught:
        trace.load_trace(tmp_path)
    assert message in str(caught.value)
    assert trace.DEFAULT_POD_FILE in str(caught.value)


@pytest.mark.parametrize(("nodes", "message"), [
    (NODES + "n1,1,1,1,T4\n", "row 4, column sn: node 'n1' appears twice"),
    (NODES.replace("8,G2", "8,"), "row 2, column model: node n1 has 8 GPU(s) but no model"),
    (NODES.replace("96000", "0"), "row 2, column cpu_milli: expected an integer >= 1, got 0"),
])
def test_a_bad_node_row_is_refused(tmp_path: Path, nodes: str, message: str) -> None:
    write(tmp_path, nodes=nodes)
    with pytest.raises(TraceError) as caught:
        trace.load_trace(tmp_path)
    assert message in str(caught.value) and trace.NODE_FILE in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    (tmp_path / trace.NODE_FILE).write_text(NODES)
    with pytest.raises(TraceError, match="openb_pod_list_default.csv: no such trace file"):
        trace.load_trace(tmp_path)
    with pytest.raises(TraceError, match="no such trace folder"):
        trace.load_trace(tmp_path / "absent")


def test_synthetic_trace_is_reproducible_and_shaped_like_openb() -> None:
    first, again, other = trace.synthetic(7), trace.synthetic(7), trace.synthetic(8)
    assert first == again and first != other
    requested = sum(p.gpu_request_milli for p in first.pods)
    assert 0.9 * first.gpu_capacity_milli < requested <= 0.98 * first.gpu_capacity_milli
    assert any(p.shares_gpu for p in first.pods) and any(p.num_gpu == 8 for p in first.pods)
    assert any(p.num_gpu == 0 for p in first.pods)


def test_the_real_trace_loads_with_its_published_inventory(shared_dir: Path) -> None:
    loaded = trace.load_trace(shared_dir / "data" / "alibaba-gpu-v2023")
    assert (len(loaded.nodes), len(loaded.pods), loaded.gpu_capacity_milli) == (1213, 8152, 6_212_000)
    assert sum(p.shares_gpu for p in loaded.pods) == 3078
