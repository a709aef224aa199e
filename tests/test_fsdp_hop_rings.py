"""Multi-hop ring pieces (one hop per simulated member, FSDP replicas placed unlike on the
leaves) advanced in arithmetic while their links are quiet (engine/collectives/hop_rings.py),
against a hand-worked timeline, the same pieces stepped on the links (step_trains off), and
the whole FSDP layouts of tests/test_fsdp_leaf_replicas.py run both ways."""


import networkx as nx
import pytest
import simpy

from simsp.engine.collectives import hop_rings
from simsp.engine.collectives.ring_alone import segment_run
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.shortcuts.check import Shortcuts
from tests.test_fsdp_leaf_replicas import LAYOUTS, leaf_layout
from tests.test_representative_audit import metrics

US = 1e-6
NICS = {0: 1e9, 1: 0.5e9, 2: 2e9}  # NIC -> bytes/s each way


def _network(env: simpy.Environment, trains: bool) -> Network:
    graph = nx.DiGraph()
    for nic, rate in NICS.items():
        graph.add_edge(f"gpu{nic}", "leaf0", bandwidth_Bps=rate, kind="ib")
        graph.add_edge("leaf0", f"gpu{nic}", bandwidth_Bps=rate, kind="ib")
    network = Network(env, graph, LinkCalibration(ib_efficiency=1.0))
    network.step_trains = trains
    return network


def _hop(src: int, dst: int, latency_s: float = US, chunk: float = 1000.0):
    return (((f"gpu{src}", "leaf0"), ("leaf0", f"gpu{dst}")), latency_s, chunk)


def _run(trains: bool, hops: list, n: int, foreign_at: float | None = None,
         collective: str = "all_gather") -> tuple:
    """The ring's end, the foreign load's (1000 B on NIC 1's uplink at `foreign_at`) and the
    flows the network started."""
    env = simpy.Environment()
    network = _network(env, trains)
    ring = env.process(segment_run(env, network, collective, n, (0.5 * US, hops)))
    foreign = []

    def other():
        yield env.timeout(foreign_at)
        yield network.load((("gpu1", "leaf0"),), 1000.0, US)
        foreign.append(env.now)

    if foreign_at is not None:
        env.process(other())
    env.run()
    return ring.value, foreign[0] if foreign else None, network.flows_started


def test_two_hops_follow_the_hand_worked_timeline():
    """Hops 0 -> 1 (0.5 GB/s at NIC 1's downlink: 2 µs per 1000 B) and 1 -> 0 (0.5 GB/s at
    its uplink: 2 µs), latencies 1 and 3 µs, 3 steps after 0.5 µs: step 0 delivered at 3.5
    and 5.5; step 1 both from 5.5: 8.5, 10.5; step 2 from 10.5: 13.5, 15.5. No flow."""
    hops = [_hop(0, 1, 1 * US), _hop(1, 0, 3 * US)]
    end, _foreign, flows = _run(True, hops, 4)
    assert end == pytest.approx(15.5 * US, rel=1e-12)
    assert flows == 0


THREE = [_hop(0, 1, 1 * US, 1000.0), _hop(1, 2, 2 * US, 1000.0), _hop(2, 0, 0.5 * US, 1000.0)]


@pytest.mark.parametrize("foreign_at", [None, 0.25, 1.7, 3.2, 7.0, 11.25, 30.0])
@pytest.mark.parametrize("collective", ["all_gather", "all_reduce"])
def test_in_arithmetic_equals_stepped_on_the_links(foreign_at, collective):
    """Three unlike hops, 6 steps a phase, a foreign load meeting them at several instants
    (on the links before the ring starts: stepped; in a drain, a latency, a second phase,
    after the end): the same ends as every step a flow, bit for bit, and no more flows (none
    where nothing meets the ring)."""
    at = None if foreign_at is None else foreign_at * US
    mine = _run(True, THREE, 7, at, collective)
    stepped = _run(False, THREE, 7, at, collective)
    assert mine[:2] == stepped[:2]
    assert mine[2] <= stepped[2]
    if foreign_at is not None and 1 < foreign_at < 20:  # met mid-ring: back in arithmetic after
        assert mine[2] < stepped[2] / 2
    if foreign_at is None:
        assert mine[2] == 0


def test_hops_sharing_a_link_run_stepped():
    """Two hops into NIC 1 (they share its downlink): no arithmetic, the stepped flows."""
    hops = [_hop(0, 1), _hop(2, 1)]
    assert _run(True, hops, 3) == _run(False, hops, 3)


@pytest.mark.parametrize("label", sorted(LAYOUTS))
def test_layouts_in_arithmetic_equal_stepped(label, tmp_path, monkeypatch):
    """The FSDP layouts across leaves (several placements, a core tier): iteration time and
    every stage's exposure bit-equal with the pieces in arithmetic and stepped as flows; the
    arithmetic ran and was dissolved by pipeline sends on its NICs."""
    sc = leaf_layout(label, tmp_path)
    fast = Shortcuts.for_scale(sc)
    seen = {"run": 0, "dissolved": 0}
    start, dissolve = hop_rings._Phase._in_arithmetic, hop_rings._Phase.dissolve

    def counted_start(self, *args):
        ran = start(self, *args)
        seen["run"] += ran
        return ran

    def counted_dissolve(self):
        seen["dissolved"] += 1
        dissolve(self)

    monkeypatch.setattr(hop_rings._Phase, "_in_arithmetic", counted_start)
    monkeypatch.setattr(hop_rings._Phase, "dissolve", counted_dissolve)
    mine = metrics(sc, fast)
    assert seen["run"] > seen["dissolved"] > 0
    monkeypatch.setattr(Network, "step_trains", False)
    assert metrics(sc, fast) == mine


def test_break_a_wrong_rate_or_hand_back_is_caught(monkeypatch):
    """The break test: a hop's rate taken from its downlink alone (its uplink ignored), or a
    dissolved drain handed back whole (its bytes left not brought up to date), and the
    arithmetic no longer equals the stepped ring."""
    stepped = _run(False, THREE, 7, 1.7 * US)[:2]
    rate = hop_rings._rate
    monkeypatch.setattr(hop_rings, "_rate", lambda network, edges: rate(network, edges[-1:]))
    assert _run(True, THREE, 7)[0] != pytest.approx(_run(False, THREE, 7)[0], rel=1e-3)
    monkeypatch.setattr(hop_rings, "_rate", rate)
    monkeypatch.setattr(hop_rings, "_bytes_left", lambda chunk, _rate, _drained_s: chunk)
    assert _run(True, THREE, 7, 1.7 * US)[:2] != pytest.approx(stepped, rel=1e-3)
