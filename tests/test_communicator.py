"""Communicator rendezvous, the present-rank and closed-form shortcuts, and device streams."""

from dataclasses import dataclass

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.collectives.ring import RING_COLLECTIVES
from simsp.engine.communicator import Communicator
from simsp.engine.group_timing import CLOSED_FORM, RING_ALONE, STEP_BY_STEP, EveryGroup
from simsp.engine.network import Network
from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER
from simsp.engine.collectives.ring_timing import collective_time
from simsp.engine.streams import COMM, COMPUTE, Stream
from simsp.engine.trace import Trace
from simsp.errors import SimulationError
from simsp.hardware.constants import LinkCalibration

GRAPH = build_topology(Cluster(nodes=2))
CAL = LinkCalibration()
RING_CAL = LinkCalibration(nccl_algo="ring")  # NCCL_ALGO=ring: the ring the stepwise test runs


def ring_alone_time(collective, gpus, nbytes):
    """Reference: the same ring run directly, alone on the links."""
    env = simpy.Environment()
    process = env.process(RING_COLLECTIVES[collective](env, Network(env, GRAPH, CAL), list(gpus),
                                                       None, nbytes))
    env.run()
    return process.value[1].time_s


def run_programs(programs, present=None, timing_of=EveryGroup(STEP_BY_STEP)):
    """Run {rank: program(env, comm, rank)}; return (env, comm, {rank: returned value})."""
    env = simpy.Environment()
    comm = Communicator(env, Network(env, GRAPH, CAL), present=present, timing_of=timing_of)
    processes = {rank: env.process(program(env, comm, rank)) for rank, program in programs.items()}
    env.run()
    return env, comm, {rank: p.value for rank, p in processes.items()}


def test_collective_starts_when_the_last_member_arrives():
    group, delays = (0, 1, 2, 3), {0: 0.0, 1: 3e-6, 2: 1e-6, 3: 10e-6}

    def program(env, comm, rank):
        yield env.timeout(delays[rank])
        result = yield from comm.all_reduce(group, rank, np.full(8, float(rank)), 16, "grads")
        return result, env.now

    _, comm, out = run_programs({r: program for r in group})
    stats = comm.stats[0]
    assert stats.start_s == 10e-6
    assert stats.time_s == pytest.approx(ring_alone_time(ALL_REDUCE, group, 16), rel=1e-12)
    for rank in group:
        assert np.array_equal(out[rank][0], np.full(8, 6.0))
        assert out[rank][1] == stats.end_s


def test_repeated_calls_on_a_group_match_in_call_order():
    groups = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}

    def program(env, comm, rank):
        yield env.timeout(rank * 1e-6)  # arrivals staggered, calls interleave across groups
        first = yield from comm.all_reduce(groups[rank], rank, np.full(2, 1.0 * rank), 4)
        second = yield from comm.all_reduce(groups[rank], rank, np.full(2, 10.0 * rank), 4)
        return first[0], second[0]

    _, comm, out = run_programs({r: program for r in range(4)})
    assert out == {0: (1.0, 10.0), 1: (1.0, 10.0), 2: (5.0, 50.0), 3: (5.0, 50.0)}
    assert len(comm.stats) == 4


def test_reduce_scatter_then_all_gather_through_the_communicator():
    group = (0, 1, 2)

    def program(env, comm, rank):
        chunk = yield from comm.reduce_scatter(group, rank, np.arange(6.0) + rank, 12)
        whole = yield from comm.all_gather(group, rank, chunk, 12)
        return whole

    _, _, out = run_programs({r: program for r in group})
    expected = 3 * np.arange(6.0) + 3  # (6,): sum over ranks of arange + r
    assert all(np.array_equal(out[r], expected) for r in group)


def test_mismatched_collectives_are_an_error():
    def program(env, comm, rank):
        call = comm.all_reduce if rank == 0 else comm.all_gather
        yield from call((0, 1), rank, None, 8)

    with pytest.raises(SimulationError, match="called"):
        run_programs({0: program, 1: program})


def test_present_rank_shortcut_matches_the_full_simulation():
    group = tuple(range(8, 16))
    nbytes = 6 << 20

    def program(env, comm, rank):
        yield from comm.all_reduce(group, rank, None, nbytes, "tp")
        return env.now

    env_full, comm_full, full = run_programs({r: program for r in group})
    env_one, comm_one, one = run_programs({8: program}, present={8})
    assert one[8] == pytest.approx(full[8], rel=1e-12)
    assert comm_one.network.bytes_sent == comm_full.network.bytes_sent  # absent ranks' bytes move
    assert [s.rank for s in comm_one.trace.spans] == [8]


def test_present_shortcut_refuses_numeric_data_and_absent_callers():
    def numeric(env, comm, rank):
        yield from comm.all_reduce((0, 1), rank, np.ones(2), 4)

    with pytest.raises(SimulationError, match="meta only"):
        run_programs({0: numeric}, present={0})
    with pytest.raises(SimulationError, match="not present"):
        run_programs({1: numeric}, present={0})


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("gpus", [range(8), range(16), (0, 8, 1, 9), (0, 3, 5)])
@pytest.mark.parametrize("nbytes", [8, 1_000_002, 64 << 20])
def test_closed_form_time_matches_the_stepwise_simulation(collective, gpus, nbytes):
    stepwise = ring_alone_time(collective, gpus, nbytes)
    assert collective_time(collective, GRAPH, list(gpus), nbytes, RING_CAL) == pytest.approx(
        stepwise, rel=0.01)


@pytest.mark.parametrize("method", [RING_ALONE, CLOSED_FORM])
def test_timing_as_a_whole_gives_the_same_results_and_time(method):
    group = (0, 1, 2, 3, 4)

    def program(env, comm, rank):
        summed = yield from comm.all_reduce(group, rank, np.arange(7.0) * rank, 14)
        chunk = yield from comm.reduce_scatter(group, rank, np.arange(7.0) * rank, 14)
        return summed, chunk, env.now

    _, stepwise_comm, stepwise = run_programs({r: program for r in group})
    _, closed_comm, closed = run_programs({r: program for r in group},
                                          timing_of=EveryGroup(method))
    for rank in group:
        assert np.array_equal(stepwise[rank][0], closed[rank][0])
        assert np.array_equal(stepwise[rank][1], closed[rank][1])
        assert closed[rank][2] == pytest.approx(stepwise[rank][2], rel=0.01)
    for a, b in zip(stepwise_comm.stats, closed_comm.stats):
        assert (a.bytes_sent, a.bytes_received, a.steps) == (b.bytes_sent, b.bytes_received,
                                                             b.steps)


@dataclass
class DeviceStreams:
    """The two streams of one device."""

    compute: Stream
    comm: Stream


def device_streams(env, rank: int, trace: Trace) -> DeviceStreams:
    """A compute and a communication stream for `rank`, recording into the same trace."""
    return DeviceStreams(Stream(env, rank, COMPUTE, trace), Stream(env, rank, COMM, trace))


def test_ops_on_one_stream_serialise_and_streams_overlap():
    env, trace = simpy.Environment(), Trace()
    streams = device_streams(env, rank=0, trace=trace)

    def program():
        first = env.process(streams.compute.run("gemm1", 3e-6))  # issued at t = 0
        second = env.process(streams.compute.run("gemm2", 2e-6))  # queued behind gemm1
        comm = env.process(streams.comm.run("all_reduce", 4e-6))  # its own stream
        yield first & second & comm

    env.process(program())
    env.run()
    spans = {s.name: (s.track, pytest.approx(s.start_s), pytest.approx(s.end_s))
             for s in trace.spans}
    assert spans == {"gemm1": ("compute", 0.0, 3e-6), "gemm2": ("compute", 3e-6, 5e-6),
                     "all_reduce": ("comm", 0.0, 4e-6)}


def test_a_collective_holds_the_comm_stream_while_compute_continues():
    group = (0, 1)
    trace = Trace()

    def program(env, comm, rank):
        streams = device_streams(env, rank, trace)
        handle = streams.comm.launch("ar", comm.all_reduce(group, rank, None, 64 << 20))
        yield from streams.compute.run("gemm", 10e-6)
        yield handle
        return env.now

    _, _, out = run_programs({r: program for r in group})
    ar_time = ring_alone_time(ALL_REDUCE, group, 64 << 20)
    assert out[0] == pytest.approx(ar_time)  # the GEMM hid behind the all-reduce
    comm_spans = [s for s in trace.spans if s.track == "comm" and s.name == "ar"]
    assert [s.end_s for s in comm_spans] == pytest.approx([ar_time, ar_time])


@pytest.mark.parametrize("collective", [REDUCE_SCATTER, ALL_GATHER])
def test_rs_and_ag_volumes_through_the_communicator(collective):
    group = (0, 1, 2, 3)

    def program(env, comm, rank):
        yield from getattr(comm, collective)(group, rank, None, 4096)

    _, comm, _ = run_programs({r: program for r in group})
    assert comm.stats[0].bytes_sent == (3 * 4096 // 4,) * 4


def test_two_point_to_point_transfers_share_the_nic_and_arrive_together():
    nbytes = 1 << 20
    env = simpy.Environment()
    network = Network(env, GRAPH, CAL)
    got = []

    def sender():
        yield env.timeout(1e-6)
        first = network.transfer(1, 9, nbytes, "first")
        second = network.transfer(1, 9, nbytes, "second")
        for name, done in (("first", first), ("second", second)):
            yield done
            got.extend([name, env.now])

    env.process(sender())
    env.run()
    # gpu1 -> gpu9: same rail, two IB edges; both messages share the NIC link the whole time.
    ib_Bps = GRAPH.edges["gpu1", "leaf0/rail1"]["bandwidth_Bps"] * CAL.ib_efficiency
    latency_s = 2 * GRAPH.edges["gpu1", "leaf0/rail1"]["latency_s"]
    arrival_s = 1e-6 + 2 * nbytes / ib_Bps + latency_s
    assert got == ["first", pytest.approx(arrival_s), "second", pytest.approx(arrival_s)]
