"""The ring pass's arithmetic as vectors over the CP group (training/context_parallel/
ring_pass.py) ends every rank's steps, sends, waits and receive buffers at the very floats the
event run makes (context_parallel/ring.py step by step: each kernel a timeout, each send a
LoneRing event), for groups of up to 9 ranks entering at scattered times with unequal steps;
and its ulp nudges are model/replay.py delay_to's, element by element."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.memory import Ledger
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.model.replay import delay_to
from simsp.scenario.config import Cluster
from simsp.training.context_parallel import ring_pass
from simsp.training.context_parallel.lone_ring import LoneRing
from simsp.training.context_parallel.ring import CpRing

KV_BYTES = 3_000_001  # odd: deliveries off any round grid


def _steps(seed: int, cp: int) -> dict:
    """(phase, cp rank) -> per step (kernel s, ...): 1 to 4 kernels of 1 to 90 µs, unequal."""
    rng = random.Random(seed)
    return {(phase, r): tuple(tuple(rng.uniform(1e-6, 9e-5) for _ in range(rng.randint(1, 4)))
                              for _ in range(cp))
            for phase in ("forward", "backward") for r in range(cp)}


def _run(gpus: tuple, entries: list, steps: dict, arithmetic: bool):
    """One forward then backward of every rank on a 2 x 8-GPU cluster, each entering its
    forward at entries[r]: (timeline, transfers, bytes sent, ledger logs, ledger peaks)."""
    env = simpy.Environment()
    network = Network(env, build_topology(Cluster(nodes=2, gpus_per_node=8)), LinkCalibration())
    cp = len(gpus)
    ledgers = {r: Ledger(r, 10**12, clock=lambda: env.now) for r in range(cp)}
    ring = CpRing(env, network, gpus, KV_BYTES, ledgers, prefix="layer.", lone=LoneRing(network,
                                                                                      gpus))
    if arithmetic:
        ring.arith = ring_pass.RingPass(ring)

    def block(rank: int):
        def run(phase: str, step: int):  # the event run: one timeout per kernel
            for seconds in steps[(phase, rank)][step]:
                yield env.timeout(seconds)
        run.call_seconds = lambda phase: SimpleNamespace(seconds=steps[(phase, rank)])
        return run

    def one(rank: int):
        yield env.timeout(entries[rank])
        yield from ring.forward(rank, block(rank))
        yield env.timeout(entries[(rank + 1) % cp])  # scattered entries into the backward too
        yield from ring.backward(rank, block(rank))

    for rank in range(cp):
        env.process(one(rank))
    env.run()
    logs = {r: sorted((e[0], e[1], e[3]) for e in ledger.events) for r, ledger in ledgers.items()}
    peaks = {r: ledger.summary().peak_by_category for r, ledger in ledgers.items()}
    return (ring.timeline, sorted(network.transfers), dict(network.bytes_sent),
            dict(network.bytes_received), logs, peaks)


GROUPS = [  # CP ranks' GPUs on two 8-GPU nodes (NVLink inside, InfiniBand between)
    (0, 8),  # a pair across nodes
    (0, 8, 1, 9, 2),  # 5: IB and NVLink hops alternating, one NVLink pair closing the ring
    (0, 1, 2, 3, 4, 5, 6, 7),  # 8 inside a node
    (0, 8, 1, 9, 2, 10, 3, 11, 4),  # 9 over both nodes
]


@pytest.mark.parametrize("gpus", GROUPS)
@pytest.mark.parametrize("seed", [1, 2])
def test_vector_pass_equals_event_run_to_the_bit(gpus, seed):
    cp = len(gpus)
    rng = random.Random(100 + seed)
    entries = [rng.choice([0.0, rng.uniform(0, 2e-4), 1 / 3 * 1e-4]) for _ in range(cp)]
    steps = _steps(seed, cp)
    fast = _run(gpus, entries, steps, True)
    event = _run(gpus, entries, steps, False)
    assert fast[0] == event[0]  # every step's (start, end), every end and wait
    assert fast[1:] == event[1:]  # transfers, bytes, ledger logs and peaks
    assert fast[0].waited and any(w > 0 for w in fast[0].waited.values())  # sends show


@pytest.mark.parametrize("gpus", [GROUPS[1], GROUPS[3]])
def test_proved_landing_pass_equals_event_run_to_the_bit(gpus):
    """Entries late enough that every send is proved to land unnudged (_Kind.lands, no
    per-step check) still give the event run's floats."""
    cp = len(gpus)
    rng = random.Random(5)
    entries = [0.75 + rng.uniform(0, 2e-4) for _ in range(cp)]
    steps = _steps(5, cp)
    send, proved = ring_pass._send, []

    def spy(kind, step, posts, start, delivered, lands):
        proved.append(lands)
        send(kind, step, posts, start, delivered, lands)

    ring_pass._send = spy
    try:
        fast = _run(gpus, entries, steps, True)
    finally:
        ring_pass._send = send
    assert proved and all(proved)
    assert fast == _run(gpus, entries, steps, False)


def test_landing_proof_holds_where_it_claims():
    """Where _Kind.lands passes (the longest drain plus latency within 2^-45 of the earliest
    start), start + (end − start) == end for end = (start + drained) + latency, at starts
    down to the bound; far earlier starts miss it (what the per-step check is for)."""
    rng = np.random.default_rng(11)
    drained = rng.uniform(0, 1, 20000) * 10.0 ** rng.integers(-7, 0, 20000)  # (n,)
    latency = rng.uniform(0, 1e-5, 20000)  # (n,)
    for scale in (0.5, 0.9, 1.0, 1.0 + 1e-15, 1.0 + 1e-9, 3.0):
        start = (drained + latency) / (1 - 2.0 ** -45) * scale  # (n,)
        end = (start + drained) + latency  # (n,)
        claimed = np.array([ring_pass._Kind.lands(SimpleNamespace(bound=float(d + lat)), s)
                            for d, lat, s in zip(drained, latency, start)])  # (n,)
        assert (start + (end - start) == end)[claimed].all()
        assert claimed.mean() > 0.4 if scale >= 1 else not claimed.any()
    start = (drained + latency) * 0.5  # (n,) starts half the bound: some miss, so a proof
    end = (start + drained) + latency  # claiming them would fail above
    assert not (start + (end - start) == end).all()


def test_a_pass_one_ulp_late_fails():
    """A delivery one ulp later than the lone send's (a rank's step 1 receive) is seen."""
    gpus = GROUPS[1]
    steps = _steps(3, len(gpus))
    entries = [0.0] * len(gpus)
    event = _run(gpus, entries, steps, False)
    send = ring_pass._send

    def late(kind, step, posts, start, delivered, lands):
        send(kind, step, posts, start, delivered, lands)
        delivered[0] = np.nextafter(delivered[0], np.inf)  # (c,) written in place

    ring_pass._send = late
    try:
        fast = _run(gpus, entries, steps, True)
    finally:
        ring_pass._send = send
    assert fast[0] != event[0]


def test_nudges_are_delay_to_per_element():
    """_delays equals delay_to (None: target − now, as LoneRing.delivered_at takes it) on
    deliveries made as a send's are (start + drained) + latency, among them cases where no
    single delay lands on the target."""
    rng = np.random.default_rng(7)
    now = rng.uniform(0, 10, 4000) * 10.0 ** rng.integers(-6, 3, 4000)  # (4000,)
    drained = rng.uniform(0, 1, 4000) * 10.0 ** rng.integers(-9, 1, 4000)  # (4000,)
    target = (now + drained) + rng.uniform(0, 1e-6, 4000)  # (4000,)
    expected, missed = [], 0
    for n, t in zip(now.tolist(), target.tolist()):
        delay = delay_to(n, t)
        missed += delay is None
        expected.append(t - n if delay is None else delay)
    assert missed > 10  # the cases delay_to finds no delay for occur
    assert ring_pass._delays(now, target).tolist() == expected


def test_ledger_changes_at_once_equal_one_by_one():
    """Ledger.alloc_each and free_each (the ring's receive buffers) leave the same log, packed
    rows, totals, live tensors and peaks as alloc and free one by one."""
    keys = [f"layer.cp_kv_{i}" for i in range(5)]
    times = [0.5, 0.25, 1.0, 1.0, 3.0]
    one, each = Ledger(0, 10**12), Ledger(0, 10**12)
    for ledger in (one, each):
        ledger.alloc("layer.x", 7, "activations", "op", 0.1)
    for key, time_s in zip(keys, times):
        one.alloc(key, 11, "communication", "cp_ring", time_s)
    each.alloc_each(keys, 11, "communication", "cp_ring", times)
    for key in keys[:4] + ["layer.x"]:
        one.free(key, "cp_ring", 4.0)
    each.free_each(keys[:4] + ["layer.x"], "cp_ring", 4.0)
    assert one.records == each.records and one.numbers.rows == each.numbers.rows
    assert one.current == each.current and one.live == each.live
    assert one.summary().peak_by_category == each.summary().peak_by_category
    with pytest.raises(KeyError):
        each.alloc_each(keys[4:], 11, "communication", "cp_ring", [5.0])  # live already
