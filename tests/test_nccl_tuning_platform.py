"""NCCL's per-platform constants (engine/collectives/nccl_platform.py) against values worked by
hand from NVIDIA/nccl v2.30.7 src/graph/tuning.cc, search.cc and topo.h for a DGX H100
(Hopper SM90, Intel Xeon Platinum 8480C, one 400 Gb/s NIC per GPU behind PCIe Gen5 x16)."""

import pytest

from simsp.errors import UserError
from simsp.engine.collectives.nccl_platform import (AMPERE, BLACKWELL, DGX_A100, HOPPER, INTEL,
                                                    Platform)
from simsp.engine.collectives.nccl_graphs import Graph, nccl_graph
from simsp.engine.collectives.nccl_tuning import (ALL_REDUCE, LL, LL128, RING, SIMPLE, TREE,
                                                  bus_bandwidth, choose, latency_us)
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.profile_file import DATA, load_profile
from simsp.scenario.config import Cluster

SYSTEMS = DATA / "systems"
H100 = Platform(HOPPER, INTEL)
# two nodes: path min(50 GB/s NIC, PCIe Gen5 x16 16 x 240 / 80 = 48) = 48, the first of
# sm90SpeedArrayInter <= 48 is 48; one channel per NIC (8); no doubling (SM90, 48 < 50, 8 > 4)
H100_TWO_NODES = Graph(8, 48.0, 48.0)
# busBw (GB/s) at 2 nodes (tuning.cc rows index 1): ring/Simple 8 x 48 = 384
HAND_BUS = {(RING, SIMPLE): 384.0,
            (RING, LL): 39.0,  # min(llMaxBws Intel row N2 39.0, 384 x .5)
            (RING, LL128): 8 * 36.7,  # min(384 x .92 = 353.28, 8 x perChMaxRingLL128 36.7)
            (TREE, SIMPLE): 8 * 41.4,  # min(353.28, 8 x perChMaxTree Hopper N2 41.4)
            (TREE, LL): 39.0,  # min(331.2 / 3.8 = 87.2, llMaxBw 39.0)
            (TREE, LL128): 8 * 36.7}  # min(331.2 x 120/128 = 310.5, 8 x 36.7)
# latency (us) of a 16-rank all-reduce on 2 nodes: rings 30 steps, 2 on the network, each
# intra step at least the Intel net overhead 1 us (x3 for Simple); trees 2(7 intra + 1 inter)
HAND_LATENCY = {(RING, SIMPLE): 8.4 + 28 * 3.4 + 2 * 14.0,  # max(3.4, 3.0) = 3.4
                (RING, LL): 6.6 + 28 * 1.0 + 2 * 2.7,  # max(0.6, 1.0)
                (RING, LL128): 14.0 + 28 * 1.9 + 2 * 4.0,  # max(1.9, 1.0)
                (TREE, SIMPLE): 8.4 + 2 * (7 * 4.0 + 14.0),
                (TREE, LL): 6.8 + 2 * (7 * 0.6 + 5.0),
                (TREE, LL128): 14.0 + 2 * (7 * 1.25 + 8.5)}


def test_h100_graphs():
    """One node: 18 links x 20.6 = 370.8 GB/s, first sm90 intra speed 60 -> 6 channels,
    doubled (60 >= 50) to 12 at 30 (24 communicator channels); two nodes: H100_TWO_NODES.
    B200 one node: 18 links x 40.1 = 721.8, 90 -> 8 channels, doubled to 16 at 45."""
    assert nccl_graph(1, 8, 450.0, 50.0, H100) == Graph(12, 30.0, 30.0)
    assert nccl_graph(2, 8, 450.0, 50.0, H100) == H100_TWO_NODES
    assert nccl_graph(1, 8, 900.0, 50.0, Platform(BLACKWELL, INTEL)) == Graph(16, 45.0, 45.0)


@pytest.mark.parametrize("algorithm,protocol", sorted(HAND_BUS))
def test_h100_bus_bandwidth_and_latency(algorithm, protocol):
    """Each algorithm x protocol on two DGX H100 nodes, as tuning.cc computes it."""
    assert bus_bandwidth(ALL_REDUCE, algorithm, protocol, 2, H100_TWO_NODES,
                         platform=H100) == pytest.approx(HAND_BUS[algorithm, protocol], rel=1e-12)
    assert latency_us(ALL_REDUCE, algorithm, protocol, 16, 2, H100) == pytest.approx(
        HAND_LATENCY[algorithm, protocol], rel=1e-12)


def test_h100_fraction_and_one_node_ll_cap():
    """A forced ring/LL128 carries 293.6 / 384 of ring/Simple's rate; on one node ring/LL is
    capped by Hopper's llMaxBw 141 (12 x 30 x .5 = 180), Ampere's 87.7 (12 x 20 x .5 = 120)."""
    choice = choose(ALL_REDUCE, 1 << 30, 16, 2, 450.0, 50.0, RING, LL128, H100)
    assert choice.protocol_fraction == pytest.approx(8 * 36.7 / 384.0, rel=1e-12)
    assert bus_bandwidth(ALL_REDUCE, RING, LL, 1, Graph(12, 30.0, 30.0), platform=H100) == 141.0
    assert bus_bandwidth(ALL_REDUCE, RING, LL, 1, Graph(12, 20.0, 20.0), platform=DGX_A100) == 87.7


def test_platform_from_profiles():
    """The system profile's CPU and the GPU's NVLink generation reach the calibration; DGX A100
    (and a bare A100 cluster) stay on the Ampere/AMD rows."""
    h100 = Cluster(system="dgx-h100", gpu="h100-sxm-80gb")
    assert LinkCalibration.from_cluster(h100).nccl_platform == (4, "intel")
    gb200 = Cluster(system="gb200-nvl72", gpu="gb200")
    assert LinkCalibration.from_cluster(gb200).nccl_platform == (5, "arm")
    assert LinkCalibration.from_cluster(Cluster()).nccl_platform == (3, "amd")
    assert DGX_A100 == Platform(AMPERE, "amd")


def test_a_wrong_cpu_vendor_is_one_error(tmp_path):
    """A system file's cpu_vendor outside amd / intel / arm: a UserError naming the key."""
    text = (SYSTEMS / "dgx-h100.toml").read_text().replace('value = "intel"', 'value = "sparc"')
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(UserError, match="cpu_vendor: must be one of amd, intel, arm"):
        load_profile("system", str(path))
