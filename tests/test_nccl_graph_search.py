"""NCCL's graph search (engine/collectives/nccl_graph_search.py) against graphs worked by hand
from NVIDIA/nccl 2.30.7 src/graph/search.cc (ncclTopoCompute's speed loop, its tries,
ncclTopoCompareGraphs, ncclTopoDupChannels, pass 2), speedArray*/sm90*/sm100* and topo.h
SMxx_NVLINK_BW: a GPU's link to the NVSwitch carries NVLinks x 20 (A100), x 20.6 (H100),
x 40.1 (B200, GB200) GB/s; one NIC per GPU (25 GB/s HDR on A100, 50 GB/s NDR after) behind
PCIe x16 (Gen4 24, Gen5 48 GB/s). Per channel a ring takes its speed on every GPU's NVSwitch
link; a graph is kept if channels x bwIntra is strictly larger."""

import pytest

from simsp.engine.collectives import nccl_platform as plat
from simsp.engine.collectives.nccl_graph_search import (BALANCED_TREE, NVLS, RING, TREE,
                                                        Topology, compute, dup_channels,
                                                        SearchGraph)
from simsp.engine.collectives.nccl_graphs import Graph, nccl_graphs
from simsp.engine.collectives.nccl_platform import DGX_A100, INTEL, Platform

A100 = (12 * 20.0, 25.0, plat.AMPERE)
H100 = (18 * 20.6, 50.0, plat.HOPPER)  # 370.8 GB/s of NVLink
B200 = (18 * 40.1, 50.0, plat.BLACKWELL)  # 721.8
H800 = (8 * 20.6, 50.0, plat.HOPPER)  # 8 NVLinks: 164.8


def _topo(gpus: int, nodes: int, system: tuple) -> Topology:
    nvlink, nic, compcap = system
    return Topology(gpus, nodes > 1, nvlink, nic, compcap)


def _graphs(gpus: int, nodes: int, system: tuple) -> dict:
    """pattern -> (channels, bwIntra, bwInter), the tree and chain with the ring's channels as
    minChannels and maxChannels (init.cc)."""
    topo = _topo(gpus, nodes, system)
    ring = compute(topo, RING)
    found = {RING: ring, BALANCED_TREE: compute(topo, BALANCED_TREE, ring.channels, ring.channels)}
    if nodes > 1:
        found[TREE] = compute(topo, TREE, ring.channels, ring.channels)  # CollNet Chain
    if system[2] != plat.AMPERE:
        found[NVLS] = compute(topo, NVLS)
    return {p: (g.channels, g.bw_intra, g.bw_inter) for p, g in found.items()}


def test_dgx_a100_one_node_and_two():
    """One node: the first speed 40 <= 240 fits 6 channels = 240 = totalBw: done; doubled
    (40 >= 25) to 12 x 20; pass 2 at 30 and 40 finds 8 and 6 < 12. The tree: 12 channels
    (the ring's) at the first speed with 12 x s <= 240 x 8/7: 20, 240 / 20 = 12, perfect;
    not doubled (20 < 25); pass 2 raises bwIntra to 30: 240 / 30 = 8 < 12, kept at 20.
    Two nodes: maxBw min(PCIe 24, NIC 25) = 24 (speedArrayInter 48, 30, 28 skipped); one
    channel per NIC, the ring back to its NIC through the NIC's GPU (PXN: 8 x 24 = 192 of
    240 of NVLink): 8 x 24 = 192; down to 12 (12 / 24 = .5 > .49): 2 a NIC, 16 x 12 = 192,
    not larger; not doubled (< 25); pass 2 at 28, 30, 48: the NIC's 25 GB/s holds none.
    The balanced tree (8 channels) closes only with typeInter past PXN (the second GPU's
    path to the NIC is PXN, its reverse through the host: FollowPath checks both for trees):
    at 24 each NIC's PCIe carries 24 down and 12 + 12 up, 8 channels, perfect; pass 2 raises
    bwIntra (< 2 x bwInter 24) to 28 then 30: a GPU sends 7 chain hops of 30 + 12 of PXN =
    222 <= 240, kept; 48: 7 x 48 > 240, no. CollNet Chain (pattern TREE, NIC -> its GPU ->
    the same NIC) likewise 8 at 24, bwIntra raised to 30."""
    assert _graphs(8, 1, A100) == {RING: (12, 20.0, 20.0), BALANCED_TREE: (12, 20.0, 20.0)}
    assert _graphs(8, 2, A100) == {RING: (8, 24.0, 24.0), BALANCED_TREE: (8, 30.0, 24.0),
                                   TREE: (8, 30.0, 24.0)}


def test_dgx_h100_one_node():
    """Ring: 60 fits 6 = 360 < 370.8; 50: 7 = 350; 40: 9 = 360; 30 (30 / 60 = .5): 12 = 360,
    none larger; 24 / 60 < .49 stops; doubled (60 >= 50) to 12 x 30; pass 2 at 40, 50, 60
    finds 9, 7, 6 < 12. Tree: 12 x s <= 370.8 x 8/7 = 423.8 first at 30: 12 fit, perfect;
    not doubled (SM90, 30 < 50, 12 > 4); bwIntra 40: 9 < 12. NVLS: 8 heads forced; 8 x 50
    = 400 <= 423.8 first; channel c takes 50 on every GPU's link, 100 on head c's: heads 0-5
    leave GPU 0 at 350, head 6 would need 400 > 370.8: 6 < 8; 40: the last head leaves 9 x 40
    = 360, 8, perfect; not doubled (NVLS); pass 2 raises bwInter (< 2 x 40) to 50, 60."""
    assert _graphs(8, 1, H100) == {RING: (12, 30.0, 30.0), BALANCED_TREE: (12, 30.0, 30.0),
                                   NVLS: (8, 40.0, 60.0)}


def test_dgx_h100_two_nodes():
    """Ring at 48 (min(PCIe Gen5 48, NIC 50); sm90SpeedArrayInter's first): back to the same
    NIC through PXN every GPU sends once a channel: 370.8 / 48 = 7 channels (336); crossNic 2
    (each ring ends on its last GPU's own NIC, odd rings return to the even ring's first
    NIC): the last GPU sends over PCIe, each GPU ends 1 in 8: 7 x 48 = 336 of NVLink for 8
    channels, 8 x 48 = 384 > 336, kept, and 384 >= totalBw 370.8: done; not doubled (48 < 50,
    8 > 4); pass 2: 48 is the first speed. Tree: the balanced tree needs typeInter past PXN,
    which Hopper's maxTypeInter (the PXN paths') never passes; the simpler tree (SM90+): NIC
    c -> GPU c -> NIC c, a chain over the others, 8 at 48, perfect; pass 2: first speed.
    NVLS heads from the NICs: 48 fits 6 heads (370.8 / 48: the 7th head's GPU would need 8
    x 48); 45: 7 (more heads); 42: 7; 40: 8 x 40 + 40 = 360, 8 heads, perfect; pass 2:
    bwInter 42, 45, 48 (the NICs hold 48)."""
    assert _graphs(8, 2, H100) == {RING: (8, 48.0, 48.0), BALANCED_TREE: (8, 48.0, 48.0),
                                   TREE: (8, 48.0, 48.0), NVLS: (8, 40.0, 48.0)}
    ring = compute(_topo(8, 2, H100), RING)
    assert ring.cross_nic == 2
    assert compute(_topo(8, 2, H100), BALANCED_TREE, 8, 8).pattern == TREE


def test_one_and_four_h100s_a_node_across_nodes():
    """One GPU a node: a ring NIC -> GPU -> NIC, 1 at 48; down to 24: 2 = 48, not larger;
    doubled (1 channel) to 2 x 24; pass 2 at 30..48 finds 1 < 2. CollNet Chain (2 channels):
    48 and down to 30 find 1 < 2, 24: 2, perfect; not doubled (< 25); pass 2 raises bwIntra
    (no NVLink hop with one GPU) 30, 40, 42, 45, 48. Four: ring 4 x 48, doubled (4 <= 4) to
    8 x 24; the chain 8 at 24 (2 a NIC), bwIntra raised to 48 (a GPU sends 6 chain hops of
    48 = 288 <= 370.8)."""
    assert _graphs(1, 2, H100)[RING] == (2, 24.0, 24.0)
    assert _graphs(1, 2, H100)[TREE] == (2, 48.0, 24.0)
    assert _graphs(4, 2, H100)[RING] == (8, 24.0, 24.0)
    assert _graphs(4, 2, H100)[TREE] == (8, 48.0, 24.0)


def test_dgx_b200_one_node_and_two():
    """One node (721.8): ring 90: 8 = 720; 80: 9 = 720; 70: 10; 60: 12 = 720; 50: 14; 45
    (.5): 16 = 720; none larger; doubled (90 >= 50) to 16 x 45; pass 2 at 50..90 < 16. Tree:
    16 x s <= 721.8 x 8/7 = 824.9 first at 50: 14 < 16 (replayed chains: the same 7 GPUs
    send); 45: 16, perfect; not doubled; bwIntra 50: 14. NVLS: 8 x 90 = 720 fits the room;
    heads at 90: the 8th would need 9 x 90 = 810; 80: 720, 8 heads; bwInter raised to 90.
    Two nodes: ring 8 x 48 (sm100SpeedArrayInter 96, 86, 80 above the 48 GB/s path), PXN
    8 x 48 = 384 <= 721.8; not doubled (48 < 50, 8 > 4). The simpler tree 8 at 48, then
    pass 2 raises bwIntra (< 2 x 48) to 80, 86, 96: 7 chain hops of 96 = 672 <= 721.8. NVLS
    8 heads at 48 (9 x 48 = 432); bwInter 80 finds no NIC of 50."""
    assert _graphs(8, 1, B200) == {RING: (16, 45.0, 45.0), BALANCED_TREE: (16, 45.0, 45.0),
                                   NVLS: (8, 80.0, 90.0)}
    assert _graphs(8, 2, B200) == {RING: (8, 48.0, 48.0), BALANCED_TREE: (8, 96.0, 48.0),
                                   TREE: (8, 96.0, 48.0), NVLS: (8, 48.0, 48.0)}


def test_gb200_nvl72_domain():
    """72 GPUs on one NVLink domain, 721.8 each: ring and tree as B200's (16 x 45). NVLS:
    min(NCCL_MAX_NVLS_ARITY 32, 72) heads forced; 32 x s <= 721.8 x 72/71 = 732.0 first at
    20; a head's link 33 x 20 = 660: 32, perfect; pass 2 raises bwInter (< 2 x 20) to 24, 30,
    40; then the tree branch raises bwIntra to 45: 16 heads fit, < 32."""
    assert _graphs(72, 1, B200) == {RING: (16, 45.0, 45.0), BALANCED_TREE: (16, 45.0, 45.0),
                                    NVLS: (32, 20.0, 40.0)}


def test_h800_keeps_walking_down_the_speeds():
    """8 NVLinks (164.8): ring 60: 2 = 120; 50: 3 = 150; 40: 4 = 160 (kept); 30: 5; 24: 6;
    20 (.5 of 40): 8 = 160, not larger; doubled (40 < 50 but 4 channels) to 8 x 20. Two
    nodes: 48 finds 3 (PXN and crossNic: 164.8 / 48); 45, 42: 3; 40: 4 = 160; 30: 5; 24: 6;
    22: crossNic, 8 channels of which each GPU sends 7 x 22 = 154: 176 >= 164.8, done."""
    assert _graphs(8, 1, H800)[RING] == (8, 20.0, 20.0)
    assert _graphs(8, 2, H800)[RING] == (8, 22.0, 22.0)


@pytest.mark.parametrize("graph, compcap, expected", [
    (SearchGraph(RING, 6, 40.0, 40.0), plat.AMPERE, (12, 20.0)),
    (SearchGraph(RING, 8, 48.0, 48.0), plat.HOPPER, (8, 48.0)),  # SM90, < 50, > 4 channels
    (SearchGraph(RING, 4, 48.0, 48.0), plat.HOPPER, (8, 24.0)),
    (SearchGraph(RING, 20, 40.0, 40.0), plat.AMPERE, (32, 20.0)),  # maxChannels 32
    (SearchGraph(NVLS, 8, 60.0, 60.0), plat.HOPPER, (8, 60.0)),
    (SearchGraph(RING, 8, 24.0, 24.0), plat.AMPERE, (8, 24.0))])  # < 25
def test_dup_channels(graph, compcap, expected):
    """search.cc ncclTopoDupChannels: min(2n, maxChannels) at bw / ceil(dup / n)."""
    doubled = dup_channels(graph, compcap)
    assert (doubled.channels, doubled.bw_intra) == expected


def test_tuning_reads_the_tree_graph():
    """nccl_graphs gives tuning.cc the ring and the tree apart (A100 two nodes above)."""
    assert nccl_graphs(2, 8, 300.0, 25.0, DGX_A100) == (Graph(8, 24.0, 24.0),
                                                         Graph(8, 30.0, 24.0))
    assert nccl_graphs(1, 8, 900.0, 50.0, Platform(plat.BLACKWELL, INTEL))[1] == Graph(
        16, 45.0, 45.0)
