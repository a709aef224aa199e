"""SM contention (engine/sm_share.py): a compute kernel slowed by the SMs communication kernels
hold beside it, against hand-worked timelines; the communicator's collectives holding one SM per
NCCL channel; the switch refused on a GPU profile without SMs."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import p2p_channels
from simsp.engine.collectives.ring_plan import ALL_REDUCE
from simsp.engine.communicator import Communicator
from simsp.engine.memory import Ledger
from simsp.engine.network import Network
from simsp.engine.sm_share import SmShare
from simsp.engine.streams import COMM, Stream
from simsp.engine.trace import Trace
from simsp.errors import UserError
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.profile_file import DATA
from simsp.model.rank import Rank, TPGroup
from simsp.scenario.config import Cluster
from simsp.scenario.loading import load_scenario

MS = 1e-3


def gemm_end(events, gemm_s=1 * MS, sms=132, rank=0):
    """End of a `gemm_s` kernel started at 0 on `rank`; `events`: (time, rank, +/-SMs) in time
    order, applied by a second process (take for +, give back for -)."""
    env = simpy.Environment()
    share = SmShare(env, sms)
    ends = {}

    def gemm():
        yield from share.run(rank, gemm_s)
        ends["gemm"] = env.now

    def comm():
        for at, on, delta in events:
            yield env.timeout(at - env.now)
            (share.take if delta > 0 else share.give_back)(on, abs(delta))

    env.process(gemm())
    env.process(comm())
    env.run()
    return ends["gemm"], share


def test_collective_inside_the_gemm_adds_its_interval_times_its_share():
    # 132 SMs, 16 channels from 0.2 to 0.6 ms beside a 1 ms GEMM: by 0.2 ms 0.2 ms of work,
    # over the 0.4 ms overlap 0.4 x 116/132, then the rest at full rate:
    # end = 0.6 + (1 - 0.2 - 0.4 x 116/132) = 1 + 0.4 x 16/132 ms
    end, share = gemm_end([(0.2 * MS, 0, 16), (0.6 * MS, 0, -16)])
    assert end == pytest.approx(1 * MS + 0.4 * MS * 16 / 132, rel=1e-12, abs=1e-18)
    assert share.slowed_s[0] == pytest.approx(0.4 * MS * 16 / 132, rel=1e-9)


def test_collective_outlasting_the_gemm_slows_its_whole_rest():
    # from 0.5 ms on, 116/132 of the rate: the last 0.5 ms of work takes 0.5 x 132/116
    end, _ = gemm_end([(0.5 * MS, 0, 16), (5 * MS, 0, -16)])
    assert end == pytest.approx(0.5 * MS + 0.5 * MS * 132 / 116, rel=1e-12)


def test_two_collectives_add_their_channels():
    # 16 channels over [0.1, 0.5], 8 more over [0.3, 0.4] (108 SMs, an A100):
    # work lost = 0.4 x 16/108 + 0.1 x 8/108 ms
    end, _ = gemm_end([(0.1 * MS, 0, 16), (0.3 * MS, 0, 8), (0.4 * MS, 0, -8),
                       (0.5 * MS, 0, -16)], sms=108)
    # the kernel ends after the last change: 1 ms + the time made up at full rate
    assert end == pytest.approx(1 * MS + (0.4 * 16 + 0.1 * 8) / 108 * MS, rel=1e-12)


def test_every_sm_held_stops_the_kernel_until_one_returns():
    # 132 of 132 SMs over [0.3, 0.7]: the kernel makes no progress, ends 0.4 ms late
    end, _ = gemm_end([(0.3 * MS, 0, 132), (0.7 * MS, 0, -132)])
    assert end == pytest.approx(1.4 * MS, rel=1e-12)


def test_another_ranks_collective_does_not_slow_it():
    end, share = gemm_end([(0.2 * MS, 1, 16), (0.6 * MS, 1, -16)])
    assert end == 1 * MS
    assert share.slowed_s == {}


def test_no_collective_leaves_the_kernel_its_time_exactly():
    end, _ = gemm_end([], gemm_s=0.123456789 * MS)
    assert end == 0.123456789 * MS  # exact: one timeout of the kernel's time at rate 1


def test_rank_compute_span_carries_the_seconds_contention_added():
    env = simpy.Environment()
    share = SmShare(env, 132)
    rank = Rank(0, env, Ledger(0, 1 << 30), TPGroup((0,), 0, False), mode="meta",
                sm_share=share, trace=Trace())

    def held():
        yield env.timeout(0.25 * MS)
        share.take(0, 33)  # a quarter of the SMs for the rest of the kernel
        yield env.timeout(10 * MS)
        share.give_back(0, 33)

    env.process(rank.hold("gemm", "gemm", 0, 1 * MS))
    env.process(held())
    env.run()
    (span,) = rank.trace.spans
    # 0.75 ms of work at 3/4 of the rate: 1 ms; the kernel ends at 1.25 ms
    assert span.end_s == pytest.approx(1.25 * MS, rel=1e-12)
    assert span.args["slowed_s"] == pytest.approx(0.25 * MS, rel=1e-9)
    assert rank.busy_s["gemm"] == 1 * MS  # the kernel's own time; contention reported apart


GRAPH = build_topology(Cluster(nodes=1))


def test_collective_on_the_comm_stream_holds_one_sm_per_nccl_channel():
    """Rank 0 launches a 64 MiB all-reduce of one node on its comm stream at 0 and runs a 10 ms
    GEMM beside it; its kernel holds NCCL's channels (nccl_tuning's choice) for the collective's
    span, so the GEMM ends 10 ms + span x channels/132."""
    env = simpy.Environment()
    comm = Communicator(env, Network(env, GRAPH, LinkCalibration()))
    comm.sm_share = SmShare(env, 132)
    group, nbytes, ends = tuple(range(8)), 64 << 20, {}

    def rank0():
        Stream(env, 0, COMM).launch("grads", comm.all_reduce(group, 0, None, nbytes))
        yield from comm.sm_share.run(0, 10 * MS)
        ends[0] = env.now

    def other(rank):
        yield from comm.all_reduce(group, rank, None, nbytes)

    env.process(rank0())
    for rank in group[1:]:
        env.process(other(rank))
    env.run()
    channels = nccl_choice(ALL_REDUCE, GRAPH, list(group), nbytes).nchannels
    span = comm.stats[0].end_s - comm.stats[0].start_s
    assert comm.stats[0].start_s == 0
    assert ends[0] == pytest.approx(10 * MS + span * channels / 132, rel=1e-12)
    assert comm.sm_share.taken == {rank: 0 for rank in group}


def test_all_to_all_holds_the_p2p_channels():
    """An all-to-all (grouped sends/receives) holds the communicator's channels rounded up to a
    power of two: 24 -> 32, 32 -> 32 (paths.cc ncclTopoComputeP2pChannels)."""
    assert [p2p_channels(c) for c in (1, 3, 16, 24, 32, 33)] == [1, 4, 16, 32, 32, 64]
    env = simpy.Environment()
    comm = Communicator(env, Network(env, GRAPH, LinkCalibration()))
    comm.sm_share = SmShare(env, 132)
    group, held = (0, 1), []

    def member(rank):
        process = env.process(comm.all_to_all(group, rank, None, [0, 1 << 20]))
        yield env.timeout(0)
        held.append(comm.sm_share.taken[rank])
        yield process

    for rank in group:
        env.process(member(rank))
    env.run()
    graph_channels = nccl_choice(ALL_REDUCE, GRAPH, list(group), 1).max_channels
    assert held == [p2p_channels(graph_channels)] * 2
    assert comm.sm_share.taken == {0: 0, 1: 0}


def test_switch_refused_where_the_gpu_profile_gives_no_sms(tmp_path):
    text = (DATA / "gpus" / "gb200.toml").read_text()  # without its [attention] section
    no_sms = tmp_path / "gb200-no-sms.toml"
    no_sms.write_text(text[:text.index("# Fused attention kernels")])
    with pytest.raises(UserError, match="cluster.sm_contention"):
        load_scenario(None, {("cluster", "gpu"): str(no_sms), ("cluster", "sm_contention"): True})
    assert load_scenario(None, {("cluster", "sm_contention"): True}).cluster.sm_contention
