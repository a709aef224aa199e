"""Network: hand-worked timelines of point-to-point transfers with fair link sharing."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.config import Cluster
from simsp.engine.fair_share import max_min_rates
from simsp.engine.network import Network
from simsp.hardware import LinkCalibration

CLUSTER = Cluster(nodes=2)
CAL = LinkCalibration()
NVLINK_BPS = CLUSTER.nvlink_bandwidth_GBps * 1e9 * CAL.nvlink_efficiency  # achieved
IB_BPS = CLUSTER.ib_bandwidth_GBps * 1e9 * CAL.ib_efficiency
NVLINK_LATENCY_S = CLUSTER.nvlink_latency_us * 1e-6  # one hop through the NVSwitch
IB_LATENCY_S = CLUSTER.ib_latency_us * 1e-6  # per IB edge
GRAPH = build_topology(CLUSTER)


def run_transfers(plan):
    """plan: list of (start_s, src, dst, nbytes). Returns {index: arrival time} and the network."""
    env = simpy.Environment()
    network = Network(env, GRAPH, CAL)
    arrivals = {}

    def one(index, start_s, src, dst, nbytes):
        yield env.timeout(start_s)
        yield network.transfer(src, dst, nbytes, label=f"t{index}")
        arrivals[index] = env.now

    for index, item in enumerate(plan):
        env.process(one(index, *item))
    env.run()
    return arrivals, network


def test_single_nvlink_transfer_takes_latency_plus_bytes_over_achieved_bandwidth():
    nbytes = 1_000_000
    arrivals, _ = run_transfers([(0.0, 0, 1, nbytes)])
    assert arrivals[0] == pytest.approx(NVLINK_LATENCY_S + nbytes / NVLINK_BPS, rel=1e-12)


def test_single_ib_transfer_between_nodes_on_one_rail():
    nbytes = 1_000_000
    arrivals, _ = run_transfers([(0.0, 3, 11, nbytes)])  # gpu3 -> leaf -> gpu11: two IB edges
    assert arrivals[0] == pytest.approx(2 * IB_LATENCY_S + nbytes / IB_BPS, rel=1e-12)


def test_two_transfers_from_one_gpu_share_its_nvlink_fairly():
    nbytes = 1_000_000
    arrivals, _ = run_transfers([(0.0, 0, 1, nbytes), (0.0, 0, 2, nbytes)])
    expected = NVLINK_LATENCY_S + 2 * nbytes / NVLINK_BPS  # each at half the link
    assert arrivals == pytest.approx({0: expected, 1: expected}, rel=1e-12)


def test_staggered_transfers_recompute_rates_when_flows_start_and_end():
    # A: 2 units from t=0; B: 0.5 unit from t=1us; unit = bytes drained in 1 us at full rate.
    unit = NVLINK_BPS * 1e-6
    arrivals, _ = run_transfers([(0.0, 0, 1, 2 * unit), (1e-6, 0, 2, 0.5 * unit)])
    # 0-1us: A alone drains 1 unit. 1-2us: half rate each, B drains its 0.5 and A 0.5.
    # 2-2.5us: A alone drains its last 0.5. Each then arrives one latency later.
    assert arrivals[1] == pytest.approx(2e-6 + NVLINK_LATENCY_S, rel=1e-9)
    assert arrivals[0] == pytest.approx(2.5e-6 + NVLINK_LATENCY_S, rel=1e-9)


def test_opposite_directions_do_not_share():
    nbytes = 1_000_000
    arrivals, _ = run_transfers([(0.0, 0, 1, nbytes), (0.0, 1, 0, nbytes)])
    assert arrivals[0] == arrivals[1] == pytest.approx(NVLINK_LATENCY_S + nbytes / NVLINK_BPS)


def test_zero_byte_transfer_costs_only_latency():
    arrivals, _ = run_transfers([(0.0, 0, 9, 0)])  # rail 0 -> rail 1: four IB edges
    assert arrivals[0] == pytest.approx(4 * IB_LATENCY_S)


def test_trace_and_byte_counters_record_every_transfer():
    arrivals, network = run_transfers([(0.0, 0, 1, 100), (0.0, 0, 9, 50), (1e-6, 9, 1, 7)])
    assert network.bytes_sent == {0: 150, 9: 7}
    assert network.bytes_received == {1: 107, 9: 50}
    records = sorted(network.transfers, key=lambda r: r.label)
    assert [(r.src, r.dst, r.nbytes, r.label) for r in records] == [
        (0, 1, 100, "t0"), (0, 9, 50, "t1"), (9, 1, 7, "t2")]
    assert [r.end_s for r in records] == [arrivals[0], arrivals[1], arrivals[2]]
    assert records[2].start_s == pytest.approx(1e-6)


def test_simultaneous_events_replay_identically():
    plan = [(0.0, s, (s * 5 + 3) % 16, 10_000 * (s + 1)) for s in range(16)]
    _, first = run_transfers(plan)
    _, second = run_transfers(plan)
    assert first.transfers == second.transfers


def test_max_min_fair_rates_on_a_textbook_example():
    # Links a (10) and b (4). Flow 1 crosses a, flow 2 crosses a and b, flow 3 crosses b.
    # b is the bottleneck: flows 2 and 3 get 2 each, flow 1 gets what is left of a: 8.
    rates = max_min_rates({1: (("a", "x"),), 2: (("a", "x"), ("b", "y")), 3: (("b", "y"),)},
                          {("a", "x"): 10.0, ("b", "y"): 4.0})
    assert rates == {1: 8.0, 2: 2.0, 3: 2.0}
