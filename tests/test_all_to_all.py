"""All-to-all over the modelled links: hand-worked timelines on 4 ranks over 2 DGX nodes
(GPUs 0, 1 on node 0 and 8, 9 on node 1: rails 0, 1, 0, 1), uneven counts, sharing a NIC with
another transfer, and the chunks it moves."""

import json

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.collectives.all_to_all import all_to_all
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from inprocess import cli

CLUSTER = Cluster(nodes=2)
CAL = LinkCalibration()
NV = CLUSTER.nvlink_bandwidth_GBps * 1e9 * CAL.nvlink_efficiency  # achieved B/s
IB = CLUSTER.ib_bandwidth_GBps * 1e9 * CAL.ib_efficiency
NV_LAT = CLUSTER.nvlink_latency_us * 1e-6  # GPU -> NVSwitch -> GPU
IB_LAT = CLUSTER.ib_latency_us * 1e-6  # per IB edge
GPUS = [0, 1, 8, 9]
C = 4_000_000  # bytes per pair


def _run(send_bytes, chunks=None, extra=None):
    env = simpy.Environment()
    network = Network(env, build_topology(CLUSTER), CAL)
    out = {}

    def go():
        out["received"], out["stats"] = yield from all_to_all(env, network, GPUS, send_bytes,
                                                               chunks)

    if extra:
        network.transfer(*extra, label="dp")
    env.process(go())
    env.run()
    return out["received"], out["stats"]


def test_even_all_to_all_timeline():
    # Each GPU's NIC carries its two cross-node sends out (and two in): ib/2 each throughout;
    # its NVLink carries one send at the full NVLink rate. Same rail: GPU-leaf-GPU (2 IB edges);
    # across rails: GPU-leaf-spine-leaf-GPU (4), the spine's 2 × ib never binding.
    _, stats = _run([[0 if i == j else C for j in range(4)] for i in range(4)])
    nvlink = C / NV + NV_LAT
    same_rail, cross_rail = 2 * C / IB + 2 * IB_LAT, 2 * C / IB + 4 * IB_LAT
    expected = {(0, 1): nvlink, (1, 0): nvlink, (2, 3): nvlink, (3, 2): nvlink,
                (0, 2): same_rail, (2, 0): same_rail, (1, 3): same_rail, (3, 1): same_rail,
                (0, 3): cross_rail, (3, 0): cross_rail, (1, 2): cross_rail, (2, 1): cross_rail}
    for pair, t in expected.items():
        assert stats.arrivals_s[pair] == pytest.approx(t, rel=1e-12, abs=0)
    assert stats.time_s == pytest.approx(cross_rail, rel=1e-12, abs=0)


def test_uneven_all_to_all_v_timeline():
    # Only rank 0 sends: C to rank 2 (same rail), 3C to rank 3 (other rail). Both at ib/2 until
    # the first drains at 2C/ib; the second then has 2C left alone at ib: done at 4C/ib.
    send = [[0] * 4 for _ in range(4)]
    send[0][2], send[0][3] = C, 3 * C
    _, stats = _run(send)
    assert stats.arrivals_s[(0, 2)] == pytest.approx(2 * C / IB + 2 * IB_LAT, rel=1e-12)
    assert stats.arrivals_s[(0, 3)] == pytest.approx(4 * C / IB + 4 * IB_LAT, rel=1e-12)
    assert stats.arrivals_s[(1, 0)] == pytest.approx(NV_LAT, rel=1e-12)  # zero bytes: latency


def test_dispatch_shares_a_nic_with_a_data_parallel_transfer():
    # A DP transfer of C bytes GPU 0 -> GPU 8 (same rail) in flight: GPU 0's NIC out and GPU 8's
    # NIC in carry three flows, so 0->2, 0->3, 1->2 and the DP flow run at ib/3; 1->3 takes the
    # 2ib/3 left on GPU 1's NIC and GPU 9's; the other cross-node pairs keep ib/2. The slowest
    # pair, 0 -> 3 across rails, ends at 3C/ib (alone: 2C/ib).
    _, stats = _run([[0 if i == j else C for j in range(4)] for i in range(4)],
                    extra=(0, 8, C))
    assert stats.arrivals_s[(1, 3)] == pytest.approx(1.5 * C / IB + 2 * IB_LAT, rel=1e-12)
    assert stats.arrivals_s[(2, 0)] == pytest.approx(2 * C / IB + 2 * IB_LAT, rel=1e-12)
    assert stats.arrivals_s[(0, 2)] == pytest.approx(3 * C / IB + 2 * IB_LAT, rel=1e-12)
    assert stats.time_s == pytest.approx(3 * C / IB + 4 * IB_LAT, rel=1e-12)


def test_numeric_chunks_reach_their_destination():
    rng = np.random.default_rng(3)
    chunks = [[rng.normal(size=(i + j + 1, 2)) for j in range(4)] for i in range(4)]
    received, _ = _run([[c.nbytes for c in row] for row in chunks], chunks)
    for i in range(4):
        for j in range(4):
            assert np.array_equal(received[j][i], chunks[i][j])
    with pytest.raises(ValueError):
        _run([[0] * 3] * 4)


def test_ring_command_all_to_all_16_ranks_2_nodes():
    # 16 M per rank, 1 M to each peer: each NIC carries its 8 cross-node peers at ib/8, so
    # 8 M / ib, plus the 4 IB edges of a cross-rail route; busbw = algbw · 15/16.
    rc, out, _ = cli(["ring", "--ranks", "16", "--nodes", "2", "--collective", "all_to_all",
                      "--size", "16M", "--json"])
    assert rc == 0
    result = json.loads(out)
    seconds = 8 * 2**20 / IB + 4 * IB_LAT
    assert result["time_s"] == pytest.approx(seconds, rel=1e-12)
    assert result["busbw_GBps"] == pytest.approx(2**24 / seconds / 1e9 * 15 / 16, rel=1e-12)
    rc, _, err = cli(["ring", "--ranks", "4", "--collective", "all_to_all", "--size", "1M",
                      "--explain"])
    assert rc == 2 and err.startswith("error: --explain:") and len(err.splitlines()) == 1
