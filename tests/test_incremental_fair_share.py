"""The network re-solves only the flows a start or finish can affect (fair_share.linked_flows),
like flows starting together as one class: after every solve, every flow in flight has the rate
a solve of all of them one by one gives, bit for bit (the full progressive filling,
fair_share.max_min_rates, is the oracle)."""

import hypothesis.strategies as st
from hypothesis import given, settings
import networkx as nx
import simpy

from simsp.engine.fair_share import linked_flows, max_min_rates
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration


class _CheckedNetwork(Network):
    """A network that, after each of its solves, checks every flow in flight against a solve
    of all of them."""

    checks = 0

    def _reschedule(self, _event=None):
        super()._reschedule(_event)
        heads = list(self._draining.values())  # (classes in flight,) in start order
        assert [f.flow_id for f in heads] == sorted(self._draining)
        rates = {member.flow_id: head.rate_Bps for head in heads  # each flow: its class's
                 for member in (head, *(head.members or ()))}
        flows = {member.flow_id: member.edges for head in heads
                 for member in (head, *(head.members or ()))}
        full = max_min_rates(dict(sorted(flows.items())), self.capacity_Bps)
        assert rates == full  # bit for bit, every flow one by one
        self.checks += 1


def _graph(capacities: list[float]) -> nx.DiGraph:
    """Links l0 -> m0, l1 -> m1, ... with the given bandwidths (efficiency 1)."""
    graph = nx.DiGraph()
    for index, bandwidth in enumerate(capacities):
        graph.add_edge(f"l{index}", f"m{index}", bandwidth_Bps=bandwidth, kind="nvlink",
                       latency_s=0.0)
    return graph


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_incremental_rates_equal_the_full_solve_after_every_change(data):
    capacities = data.draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 7.5, 10.0]),
                                    min_size=1, max_size=8))
    links = [(f"l{i}", f"m{i}") for i in range(len(capacities))]
    starts = data.draw(st.lists(st.tuples(
        st.sampled_from([0.0, 0.5, 1.0, 1.25, 3.0]),  # start time (s)
        st.lists(st.sampled_from(links), min_size=1, max_size=4),  # links, repeats allowed
        st.integers(1, 12)), min_size=1, max_size=14))  # bytes
    env = simpy.Environment()
    network = _CheckedNetwork(env, _graph(capacities), LinkCalibration(nvlink_efficiency=1.0))
    delivered = {}

    def start(index, start_s, edges, nbytes):
        yield env.timeout(start_s)
        delivered[index] = yield network.load(tuple(edges), nbytes, 0.0)

    for index, item in enumerate(starts):
        env.process(start(index, *item))
    env.run()
    assert len(delivered) == len(starts)
    assert network.checks >= 1


def test_a_finish_re_solves_only_the_flows_sharing_links_with_it():
    # flows 0 and 1 share link a, flows 1 and 2 link b; flow 3 is alone on c
    a, b, c = ("a", "x"), ("b", "y"), ("c", "z")

    class _Flow:
        def __init__(self, edges):
            self.edges = edges

    flows = {0: _Flow((a,)), 1: _Flow((a, b)), 2: _Flow((b,)), 3: _Flow((c,))}
    users = {a: {0: None, 1: None}, b: {1: None, 2: None}, c: {3: None}}
    assert linked_flows([a], users, flows) == [0, 1, 2]  # through b, transitively
    assert linked_flows([c], users, flows) == [3]
    assert linked_flows([("gone", "link")], users, flows) == []
