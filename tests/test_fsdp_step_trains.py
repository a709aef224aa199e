"""One-hop ring pieces advanced in arithmetic while only such pieces use their links
(engine/collectives/step_trains.py), against a hand-worked timeline and the same pieces stepped
on the links; the whole FSDP layout against the ring stepped whole is in
tests/test_fsdp_segments.py."""

import networkx as nx
import pytest
import simpy

from simsp.engine.collectives.ring_alone import segment_run
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration

US = 1e-6
EDGES = (("gpu0", "leaf0"), ("leaf0", "gpu0"))  # a NIC up and down, 1 GB/s each way


def _network(env: simpy.Environment) -> Network:
    graph = nx.DiGraph()
    for u, v in EDGES:
        graph.add_edge(u, v, bandwidth_Bps=1e9, kind="ib")
    return Network(env, graph, LinkCalibration(ib_efficiency=1.0))


def _run(trains: bool, collective_b: str = "all_gather") -> tuple:
    """Pieces A (1000 B chunks) and B (2000 B) of 4-member rings from 0 on the same NIC, 1 µs
    step latency, and a foreign 1000 B load on the uplink at 8.5 µs: when each ends, and the
    flows the network started."""
    env = simpy.Environment()
    network = _network(env)
    network.step_trains = trains
    a = env.process(segment_run(env, network, "all_gather", 4, (0.0, [(EDGES, US, 1000.0)])))
    b = env.process(segment_run(env, network, collective_b, 4, (0.0, [(EDGES, US, 2000.0)])))
    foreign = []

    def other():
        yield env.timeout(8.5 * US)
        yield network.load(EDGES[:1], 1000.0, US)
        foreign.append(env.now)

    env.process(other())
    env.run()
    return a.value, b.value, foreign[0], network.flows_started


def test_pieces_in_arithmetic_follow_the_hand_worked_timeline():
    """By hand (1 µs per 1000 B alone, half as fast shared): A and B drain together to 2 µs
    (A done, B 1000 B left, alone to 3); A's step 2 runs alone [3, 4] + 1; B's step 2 starts
    at 4 alone, meets A's step 3 at 5 with 1000 B left: both drain to 7, delivered at 8 (A
    ends). B's step 3 from 8 alone; the foreign load at 8.5 finds it with 1500 B left: both
    share to 10.5 (foreign done, delivered 11.5), B's last 500 B alone to 11, delivered at 12.
    The network starts two flows: the foreign load and B's step 3 handed back to it."""
    a_end, b_end, foreign_end, flows = _run(trains=True)
    assert a_end == pytest.approx(8 * US, rel=1e-12)
    assert b_end == pytest.approx(12 * US, rel=1e-12)
    assert foreign_end == pytest.approx(11.5 * US, rel=1e-12)
    assert flows == 2


@pytest.mark.parametrize("collective_b", ["all_gather", "all_reduce"])
def test_pieces_in_arithmetic_equal_the_pieces_stepped_on_the_links(collective_b):
    """The same run with every step a flow on the links (step_trains off): the same ends to
    1e-12 (B an all-reduce too: two phases of 3 steps, the foreign load meeting its second)."""
    mine, stepped = _run(True, collective_b), _run(False, collective_b)
    assert mine[:3] == pytest.approx(stepped[:3], rel=1e-12)
    assert mine[3] < stepped[3]


def test_a_piece_alone_takes_its_closed_form():
    """One 8-member all-gather piece alone: 7 steps of (chunk / rate + latency) after the base
    latency, in closed form (StepTrains._alone), 3 + 7 x (2.5 + 1) µs."""
    env = simpy.Environment()
    network = _network(env)
    run = env.process(segment_run(env, network, "all_gather", 8, (3 * US, [(EDGES, US, 2500.0)])))
    env.run()
    assert run.value == pytest.approx(27.5 * US, rel=1e-12)
    assert network.flows_started == 0
