"""Network: hand-worked timelines of point-to-point transfers with fair link sharing."""

import pytest
import simpy
from hypothesis import given, settings, strategies as st

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.fair_share import max_min_rates
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration

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


def _linear_scan_rates(flows, capacity_Bps):
    """Oracle: the textbook progressive filling, scanning every link for the bottleneck."""
    users = {}
    for flow_id, edges in flows.items():
        for edge in edges:
            users.setdefault(edge, []).append(flow_id)
    left = {edge: capacity_Bps[edge] for edge in users}
    unfixed = {edge: len(ids) for edge, ids in users.items()}
    rates = {flow_id: float("inf") for flow_id, edges in flows.items() if not edges}
    while len(rates) < len(flows):
        bottleneck = min((e for e in users if unfixed[e]), key=lambda e: left[e] / unfixed[e])
        share = left[bottleneck] / unfixed[bottleneck]
        for flow_id in users[bottleneck]:
            if flow_id not in rates:
                rates[flow_id] = share
                for edge in flows[flow_id]:
                    left[edge] = max(0.0, left[edge] - share)
                    unfixed[edge] -= 1
    return rates


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_heap_fair_share_equals_the_linear_scan_bit_for_bit(data):
    links = [(f"a{i}", f"b{i}") for i in range(data.draw(st.integers(1, 8)))]
    capacity = {link: data.draw(st.sampled_from([1.0, 2.0, 3.0, 10.0, 7.5])) for link in links}
    flows = {i: tuple(data.draw(st.lists(st.sampled_from(links), max_size=4, unique=True)))
             for i in range(data.draw(st.integers(0, 12)))}
    assert max_min_rates(flows, capacity) == _linear_scan_rates(flows, capacity)


class _NoMemo(dict):
    """A memo that never remembers: every rate vector is solved afresh."""

    def __contains__(self, key):
        return False

    def get(self, key, default=None):
        return default


def test_memoised_rates_give_bit_identical_transfers():
    # the same staggered transfers three times, 1 ms apart: later rounds hit the memo
    plan = [(1e-3 * rep + 1e-6 * (s % 3), s, (s * 5 + 3) % 16, 10_000 * (s % 4 + 1))
            for rep in range(3) for s in range(16)]
    _, memoised = run_transfers(plan)
    env = simpy.Environment()
    network = Network(env, GRAPH, CAL)
    network._memo = _NoMemo()

    def one(index, start_s, src, dst, nbytes):
        yield env.timeout(start_s)
        yield network.transfer(src, dst, nbytes, label=f"t{index}")

    for index, item in enumerate(plan):
        env.process(one(index, *item))
    env.run()
    assert memoised.transfers == network.transfers
    assert memoised.rate_computations < network.rate_computations


def _fluid_arrivals(plan, overhead_s: float) -> dict:
    """Oracle: the fluid model stepped eagerly from event to event (no simpy, no heap, no
    memo): every flow in flight drains at its max-min rate until the next start or finish;
    a flow arrives one route latency after its last byte left."""
    from simsp.cluster.topology import hop_route, route_latency_s
    capacity = {(u, v): d["bandwidth_Bps"] * CAL.efficiency(d["kind"])
                for u, v, d in GRAPH.edges(data=True)}
    starts = sorted((start_s, i) for i, (start_s, *_) in enumerate(plan))
    left, now, arrivals = {}, 0.0, {}
    while starts or left:
        edges = {i: hop_route(GRAPH, plan[i][1], plan[i][2]) for i in left}
        rates = max_min_rates(edges, capacity) if left else {}
        finish = min((now + left[i] / rates[i] for i in left), default=float("inf"))
        step_to = min(finish, starts[0][0] if starts else float("inf"))
        for i in left:
            left[i] -= rates[i] * (step_to - now)
        now = step_to
        for i in [i for i in left if left[i] <= 1e-9 * plan[i][3]]:
            route = edges[i]
            arrivals[i] = now + route_latency_s(GRAPH, route) + overhead_s
            del left[i]
        while starts and starts[0][0] <= now:
            i = starts.pop(0)[1]
            left[i] = float(plan[i][3])
    return arrivals


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.tuples(st.sampled_from([0.0, 1e-6, 2.5e-6, 4e-6]), st.integers(0, 15),
                               st.integers(0, 15), st.integers(1, 4).map(lambda k: k * 10_000)),
                     min_size=1, max_size=12)
       .map(lambda ts: [t for t in ts if t[1] != t[2]]).filter(bool))
def test_transfers_arrive_as_the_eager_fluid_model_says(plan):
    arrivals, _ = run_transfers(plan)
    expected = _fluid_arrivals(plan, CAL.transfer_overhead_s)
    assert arrivals == pytest.approx(expected, rel=1e-9)


def test_a_ring_step_solves_the_rates_once_per_instant():
    env = simpy.Environment()
    network = Network(env, GRAPH, CAL)
    for src in range(8):  # eight hops start together: one solve, not eight
        network.transfer(src, (src + 1) % 8, 1_000_000)
    env.run()
    assert network.rate_computations == 1  # all finish together: nothing left to solve


def test_pxn_relay_crosses_nvlink_then_the_relays_nic():
    arrivals = {}
    env = simpy.Environment()
    network = Network(env, GRAPH, CAL)
    nbytes = 1_000_000

    def send():
        yield network.transfer(1, 8, nbytes, via_gpu=0)  # gpu1 -> gpu0's NIC (rail 0) -> gpu8
        arrivals["t"] = env.now

    env.process(send())
    env.run()
    assert arrivals["t"] == pytest.approx(NVLINK_LATENCY_S + 2 * IB_LATENCY_S + nbytes / IB_BPS,
                                          rel=1e-12)
