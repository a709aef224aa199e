"""The non-tensor memory (simsp/training/non_tensor_memory.py, docs/non_tensor_memory.md):
NCCL's buffers counted by hand from NVIDIA/nccl v2.30.7's constants, the GPU profiles' figures,
and the verdict's reserve equal to the items' sum."""

import json

from simsp.cli import main
from simsp.engine.collectives.nccl_buffers import p2p_bytes, ring_bytes
from simsp.scenario.loading import load_scenario
from simsp.training.non_tensor_memory import non_tensor_bytes, non_tensor_items
from simsp.units import GiB, MiB

# by hand: LL 8 lines x 512 threads x 8 steps x 16 B = 0.5 MiB; LL128 120 x 640 x 8 x 8 B =
# 4,915,200 B; Simple 4 MiB; receiver 9,109,504 B + 4 KiB control -> 5 granules of 2 MiB =
# 10 MiB, sender's control block 2 MiB: 12 MiB a connection
CONNECTION = 12 * MiB


def test_ring_inside_one_a100_node_by_hand():
    # NCCL's graph on 8 A100s: 300/25 links x 20 GB/s = 240 GB/s -> 6 channels of 40 GB/s,
    # doubled to 12 (bw 20), the communicator doubles again: 24 channels x 12 MiB
    assert ring_bytes(1, 8, 300.0, 25.0) == 24 * CONNECTION


def test_ring_across_nodes_by_hand():
    # 2 nodes x 8 ranks: one channel per NIC a node's ranks own = 8, PCIe/NIC speed 24 < 25 so
    # not doubled; communicator 16 channels; the sender across nodes: 10 MiB receiver end +
    # LL128 + Simple = 8,585,216 B -> 10 MiB
    assert ring_bytes(2, 8, 300.0, 25.0) == 16 * 20 * MiB


def test_all_to_all_on_eight_h100s_matches_nccl_issue_1685():
    # NVIDIA/nccl issue 1685: 8 x H100 all-to-all connects 32 channels per peer, allocations of
    # 10 MiB and 2 MiB: 7 peers x 32 x 12 MiB = 2688 MiB
    assert p2p_bytes(7, 0, 1, 8, 450.0, 50.0) == 7 * 32 * CONNECTION


def test_pipeline_peers_across_nodes_share_the_proxy_buffers():
    # p = 8 stages, one per node: a 1-rank-per-node graph has 1 channel (24 GB/s, not
    # doubled), 2 for the communicator; shared send + receive: 2 x 2 x 16 steps x 128 KiB
    assert p2p_bytes(0, 2, 8, 1, 300.0, 25.0) == 2 * 2 * 16 * 128 * 1024


def test_paper_175b_items_by_hand():
    sc = load_scenario("scenarios/paper-175b.toml", {})  # t 8, p 8, d 1 on A100s
    items = {item.name: item.bytes for item in non_tensor_items(sc)}
    assert items == {"cuda_context": 723 * MiB, "cublas_workspace": 9.125 * MiB,
                     "nccl_tp": 24 * CONNECTION, "nccl_pp": 8 * MiB,
                     "fragmentation": 2 * GiB}
    assert non_tensor_bytes(sc) == sum(items.values())


def test_hopper_cublas_workspace_and_modelled_fragmentation():
    sc = load_scenario("scenarios/tiny.toml", {("cluster", "gpu"): "h100-sxm-80gb"})
    items = {item.name: item.bytes for item in non_tensor_items(sc, 5 * MiB)}
    assert items["cublas_workspace"] == 33 * MiB  # 32 MiB cuBLAS on sm90 + 1 MiB cuBLASLt
    assert items["fragmentation"] == 5 * MiB


def test_run_reports_the_items_and_judges_with_their_sum(capsys):
    assert main(["run", "scenarios/tiny.toml", "--mode", "meta", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    total = sum(item["bytes"] for item in memory["non_tensor"].values())
    assert memory["memory_reserve_bytes"] == total
    assert memory["headroom_bytes"] == memory["capacity_bytes"] - total - memory["peak_bytes_max"]
    assert all(item["source"] for item in memory["non_tensor"].values())


def test_hardware_shows_the_figures_with_sources(capsys):
    assert main(["hardware", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    text = json.dumps(shown)
    assert "cuda_context_MiB" in text and "CublasHandlePool.cpp" in text


def test_caching_allocator_replaces_the_allowance_with_the_modelled_fragmentation(capsys):
    assert main(["run", "scenarios/tiny.toml", "--mode", "meta", "--caching-allocator",
                 "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    worst = max(stage["fragmentation_at_peak_bytes"] for stage in memory["stages"])
    assert memory["non_tensor"]["fragmentation"]["bytes"] == worst
    reserve = sum(item["bytes"] for item in memory["non_tensor"].values())
    assert memory["memory_reserve_bytes"] == reserve
    for stage in memory["stages"]:
        assert stage["headroom_bytes"] == memory["capacity_bytes"] - reserve - stage["peak_bytes"]


def test_the_override_replaces_the_itemised_reserve(capsys):
    assert main(["run", "scenarios/tiny.toml", "--mode", "meta", "--memory-reserve", "6",
                 "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["memory_reserve_bytes"] == 6 * GiB
    assert memory["non_tensor"]["fragmentation"]["bytes"] == 2 * GiB  # still reported
