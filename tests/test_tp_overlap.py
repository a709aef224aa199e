"""Transformer Engine's TP communication overlap (model/base/tp_overlap.py, docs/tp-overlap.md)
against hand-worked timelines: a pipelined GEMM+RS split in 4, a ring-exchange AG+GEMM, a bulk
overlap slowed by its kernel's SMs; TE's defaults and a user's file; the numbers of a numeric
run unchanged by the overlap; the switch's refusals."""

import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.engine.communicator import Communicator
from simsp.engine.memory import Ledger
from simsp.engine.network import Network
from simsp.engine.sm_share import SmShare
from simsp.engine.streams import COMM, Stream
from simsp.errors import UserError
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.costmodel import kernel_time
from simsp.model.base import ops, tp_overlap
from simsp.model.rank import Rank, TPGroup
from simsp.model.tensor import FP16
from simsp.scenario.config import Cluster
from simsp.scenario.loading import load_scenario
from simsp.scenario.tp_overlap import BULK, PIPELINE, RING_EXCHANGE, UbGemm, ub_gemms

MS = 1e-3
SHAPE = (4096, 6144, 6144)  # (m tokens, k, n): x (m, k) @ w (k, n)


class FixedComm:
    """A TP communicator whose every call lasts `seconds` and returns zeros (meta: None)."""

    def __init__(self, env, seconds: float):
        self.env, self.seconds, self.calls = env, seconds, []

    def reduce_scatter(self, group, rank, buffer, nbytes, tag="", elem_bytes=None, sms=None):
        self.calls.append(("reduce_scatter", self.env.now, nbytes, sms))
        yield self.env.timeout(self.seconds)

    def all_to_all(self, group, rank, chunks, send_bytes, tag="", sms=None):
        self.calls.append(("all_to_all", self.env.now, sum(send_bytes), sms))
        yield self.env.timeout(self.seconds)
        return None


def meta_rank(env, comm, t: int = 2) -> Rank:
    """Rank 0 of a TP group of `t` in meta mode, on a 132-SM GPU."""
    tp = TPGroup(tuple(range(t)), 0, True, comm)
    return Rank(0, env, Ledger(0, 1 << 40), tp, mode="meta", sm_share=SmShare(env, 132))


def gemm_s(r) -> float:
    """The unsplit GEMM's modelled seconds alone (the cost model's; the overlap only splits it)."""
    return ops.gemm_seconds(r, SHAPE, False)


def run_pipelined_rs(comm_s: float, num_sm: int = 16, margin: bool = True, fp8=None,
                     fp8_buf: bool = False):
    """A pipelined GEMM+RS of proj_fprop in 4 splits on a meta rank (FP8 training where `fp8`
    is a recipe, its userbuffer FP8 where `fp8_buf`): (end time, the rank, its comm)."""
    env = simpy.Environment()
    comm = FixedComm(env, comm_s)
    r = meta_rank(env, comm)
    if fp8 is not None:
        r.fp8 = fp8
    ub = UbGemm("proj_fprop", PIPELINE, num_sm, 4, margin, True, fp8_buf=fp8_buf)
    m, k, n = SHAPE
    x, w = r.alloc((m, 1, k), FP16, "x"), r.alloc((k, n), FP16, "w")
    reduced = r.alloc((m // 2, 1, n), FP16, "reduced")
    env.process(ops.linear(r, x, w, None, "proj", runner=tp_overlap.pipelined_rs(ub, reduced,
                                                                                 "proj_exit")))
    env.run()
    return env.now, r, comm


@pytest.mark.parametrize("comm_fraction", [0.5, 3.0])
def test_pipelined_gemm_rs_split_in_4_matches_the_hand_timeline(comm_fraction):
    # four GEMM pieces of g/4 each on 116 of 132 SMs (set_sm_margin): piece i ends at
    # (i+1)·p with p = g/4 · 132/116; reduce-scatter i starts when piece i and RS i-1 are done
    _, r0, _ = run_pipelined_rs(1.0)
    p = gemm_s(r0) / 4 * 132 / 116
    c = comm_fraction * p
    end, r, comm = run_pipelined_rs(c)
    rs_end = 0.0
    for i in range(4):
        rs_end = max((i + 1) * p, rs_end) + c
    assert end == pytest.approx(rs_end, rel=1e-12)
    assert [call[1] for call in comm.calls] == pytest.approx(
        [max((i + 1) * p, (i + 1) * p if c <= p else p + i * c) for i in range(4)], rel=1e-12)
    method_s = r.tp_overlap_s
    assert method_s[(PIPELINE, "comm")] == pytest.approx(4 * c, rel=1e-12)  # the RSs' own time
    assert method_s[(PIPELINE, "exposed")] == pytest.approx(rs_end - 4 * p, rel=1e-9)
    assert r.exposed_s["tp_comm"] == pytest.approx(rs_end - 4 * p, rel=1e-9)
    # each piece's bytes are a quarter of the (m, n) BF16 partial output; the margin leaves the
    # kernels' SMs to the communication (none taken from the GEMM)
    assert {call[2] for call in comm.calls} == {SHAPE[0] * SHAPE[2] * 2 // 4}
    assert {call[3] for call in comm.calls} == {0}


def test_pipelined_rs_without_margin_holds_its_sms_beside_the_gemm():
    _, r0, _ = run_pipelined_rs(1.0)
    end, _, comm = run_pipelined_rs(0.1 * gemm_s(r0) / 4, num_sm=16, margin=False)
    assert {call[3] for call in comm.calls} == {16}  # a fixed-time fake: the SMs are passed on


def test_ring_exchange_ag_gemm_matches_the_hand_timeline():
    # t = 4: piece 0 on the own chunk from 0, step i's chunk (1 exchange of c) feeds piece i+1;
    # the exchanges run back to back (c each): piece i+1 starts at max(end of piece i, (i+1)c)
    for c_over_p in (0.5, 2.0):
        env = simpy.Environment()
        r = meta_rank(env, None, t=4)
        p = gemm_s(r) / 4
        comm = FixedComm(env, c_over_p * p)
        r.tp.comm = comm
        ub = UbGemm("qkv_fprop", RING_EXCHANGE, 1, 4, False, True)
        m, k, n = SHAPE
        x_local = r.alloc((m // 4, 1, k), FP16, "x")
        x_full = r.alloc((m, 1, k), FP16, "x_full")
        w = r.alloc((k, n), FP16, "w")
        env.process(ops.linear(r, x_full, w, None, "qkv",
                               runner=tp_overlap.ring_exchange(ub, x_local, x_full, "qkv")))
        env.run()
        c, end = c_over_p * p, p
        for i in range(3):
            end = max(end, (i + 1) * c) + p
        assert env.now == pytest.approx(end, rel=1e-12)
        assert r.tp_overlap_s[(RING_EXCHANGE, "exposed")] == pytest.approx(end - 4 * p, rel=1e-9,
                                                                             abs=1e-15)
        # each step sends the local chunk once, to the next rank; over copy engines, no SMs
        assert [call[2] for call in comm.calls] == [x_local.nbytes] * 3
        assert {call[3] for call in comm.calls} == {0}


def run_ring_exchange_rs(t: int, c_over_p: float):
    """fc2_fprop by ring exchange as NeMo's 175B file sets it (num_sm 1 with the SM margin):
    rank 0 of t over a fixed-time fake; returns (end, rank, comm, p, reduce seconds)."""
    env = simpy.Environment()
    r = meta_rank(env, None, t=t)
    m, k, n = SHAPE
    p = gemm_s(r) / t * 132 / 131  # a piece on 131 of 132 SMs
    comm = FixedComm(env, c_over_p * p)
    r.tp.comm = comm
    ub = UbGemm("fc2_fprop", RING_EXCHANGE, 1, 4, True, True)
    x, w = r.alloc((m, 1, k), FP16, "x"), r.alloc((k, n), FP16, "w")
    reduced = r.alloc((m // t, 1, n), FP16, "reduced")
    env.process(ops.linear(r, x, w, None, "fc2", runner=tp_overlap.ring_exchange_rs(
        ub, reduced, "fc2_exit")))
    env.run()
    # TE's reduce kernel: reads the t BF16 chunks of (m/t, n), writes one
    reduce_s = kernel_time("elementwise", 0, m // t * n * (2 * t + 2), None, r.compute_cal)
    return env.now, r, comm, p, reduce_s


@pytest.mark.parametrize("t", [4, 8])
@pytest.mark.parametrize("c_over_p", [0.5, 3.0])
def test_ring_exchange_gemm_rs_matches_the_hand_timeline(t, c_over_p):
    # t GEMM pieces of p back to back; send i (1..t-1) carries piece i-1's rows to rank me+i
    # once that piece is done, on send stream (i-1) mod 3, so also after send i-3; then the
    # reduce kernel. Compute-bound: t·p + reduce; comm-bound at t 4: 3p + c + reduce
    end, r, comm, p, reduce_s = run_ring_exchange_rs(t, c_over_p)
    c = c_over_p * p
    starts, ends = [], []
    for i in range(1, t):
        starts.append(max(i * p, ends[i - 4] if i > 3 else 0.0))
        ends.append(starts[-1] + c)
    comm_end = max(t * p, ends[-1])
    assert end == pytest.approx(comm_end + reduce_s, rel=1e-12)
    assert [call[1] for call in comm.calls] == pytest.approx(starts, rel=1e-12)
    if t == 4:
        assert comm_end == pytest.approx(4 * p if c_over_p < 1 else 3 * p + c, rel=1e-12)
    # one chunk of (m/t, n) BF16 per send, to one peer, over copy engines (no SM)
    assert {call[2] for call in comm.calls} == {SHAPE[0] // t * SHAPE[2] * 2}
    assert {call[3] for call in comm.calls} == {0}
    exposed = comm_end - t * p
    assert r.tp_overlap_s[(tp_overlap.RS_P2P, "exposed")] == pytest.approx(exposed, rel=1e-9,
                                                                            abs=1e-15)
    assert r.exposed_s.get("tp_comm", 0.0) == pytest.approx(exposed, rel=1e-9, abs=1e-15)
    busy = sum(min(e, s2) - s for s, e, s2 in zip(starts, ends, starts[1:] + [float("inf")]))
    assert r.tp_overlap_s[(tp_overlap.RS_P2P, "comm")] == pytest.approx(busy, rel=1e-12)


@pytest.mark.parametrize("c_over_p", [0.5, 3.0])
def test_aggregate_ring_exchange_matches_the_hand_timeline(c_over_p):
    # TE's aggregate at t 4: the pair swap (one chunk, c), then one step passing the pair's two
    # chunks to rank me + 2 (c in the fake), back to back; the GEMM in 2 pieces of 2p, the first
    # after the swap, the second after the step: ends max(c + 2p, 2c) + 2p
    env = simpy.Environment()
    r = meta_rank(env, None, t=4)
    p = gemm_s(r) / 4
    c = c_over_p * p
    comm = FixedComm(env, c)
    r.tp.comm = comm
    ub = UbGemm("fc2_dgrad", RING_EXCHANGE, 1, 4, False, True, aggregate=True)
    m, k, n = SHAPE
    x_local, x_full = r.alloc((m // 4, 1, k), FP16, "x"), r.alloc((m, 1, k), FP16, "x_full")
    w = r.alloc((k, n), FP16, "w")
    env.process(ops.linear(r, x_full, w, None, "fc2",
                           runner=tp_overlap.ring_exchange(ub, x_local, x_full, "fc2")))
    env.run()
    assert env.now == pytest.approx(max(c + 2 * p, 2 * c) + 2 * p, rel=1e-12)
    assert [call[1] for call in comm.calls] == pytest.approx([0.0, c], rel=1e-12)
    assert [call[2] for call in comm.calls] == [x_local.nbytes, 2 * x_local.nbytes]
    exposed = c + max(0.0, c - 2 * p)
    assert r.tp_overlap_s[(RING_EXCHANGE, "exposed")] == pytest.approx(exposed, rel=1e-9)


def test_aggregate_needs_an_even_tp_and_is_read_on_all_gathers_alone(tmp_path):
    cfg = tmp_path / "ub.yaml"
    cfg.write_text("fc2_dgrad:\n  aggregate: 1\nproj_fprop:\n  aggregate: 1\n")
    assert not ub_gemms(4, str(cfg))["proj_fprop"].aggregate
    with pytest.raises(UserError, match="aggregate needs an even"):
        ub_gemms(3, str(cfg))


GRAPH = build_topology(Cluster(nodes=1))


def test_bulk_overlap_gemm_slowed_by_its_kernels_sms_while_they_run():
    """A bulk all-gather of 64 MiB over 2 GPUs of one node holding num_sm = 8 SMs (no margin)
    beside a GEMM: the GEMM loses 8/132 of its rate for the collective's span."""
    env = simpy.Environment()
    comm = Communicator(env, Network(env, GRAPH, LinkCalibration()))
    comm.sm_share = SmShare(env, 132)
    r = meta_rank(env, comm)
    r.sm_share = comm.sm_share
    r.comm_stream = Stream(env, 0, COMM)
    ub = UbGemm("qkv_dgrad", BULK, 8, 4, False, True)
    nbytes, ends = 64 << 20, {}

    def rank0():
        launched = r.comm_stream.launch("ag", comm.all_gather((0, 1), 0, None, nbytes,
                                                              sms=tp_overlap.comm_sms(ub)))
        yield from tp_overlap.bulk(ub)(r, "dgrad", SHAPE, False, None, None)
        ends["gemm"] = env.now
        yield launched

    def rank1():
        yield from comm.all_gather((0, 1), 1, None, nbytes, sms=0)

    env.process(rank0())
    env.process(rank1())
    env.run()
    span = comm.stats[0].end_s - comm.stats[0].start_s
    g = gemm_s(r)
    assert span < g  # the collective ends inside the GEMM
    assert ends["gemm"] == pytest.approx(g + span * 8 / 132, rel=1e-12)
    assert comm.sm_share.taken == {0: 0}  # rank 1 launched its side with no SMs


def test_te_defaults_and_a_users_file(tmp_path):
    # TE initialize_ub's defaults at t = 4: ring exchange with 1 SM over copy engines, t splits
    # and no margin; pipeline and bulk 16 SMs, 4 splits, with the margin
    gemms = ub_gemms(4)
    assert gemms["qkv_fprop"] == UbGemm("qkv_fprop", RING_EXCHANGE, 1, 4, False, True, True)
    assert gemms["proj_fprop"] == UbGemm("proj_fprop", PIPELINE, 16, 4, True, True, False)
    assert gemms["fc1_wgrad"] == UbGemm("fc1_wgrad", BULK, 16, 4, True, True, False)
    # NeMo's 175B file (ub_cfg_h100_h12288_tp4_mbs2_seqlen2048.yaml) as a user writes it
    cfg = tmp_path / "ub.yaml"
    cfg.write_text("qkv_dgrad:\n  method: bulk\n  num_sm: 4\n  cga_size: 2\n  set_sm_margin: 0\n"
                   "proj_fprop:\n  method: pipeline\n  num_sm: 24\n  num_splits: 4\n"
                   "  set_sm_margin: 1\n  fp8_buf: 1\n")
    gemms = ub_gemms(4, str(cfg))
    assert gemms["qkv_dgrad"] == UbGemm("qkv_dgrad", BULK, 4, 4, False, True, True)
    assert gemms["proj_fprop"] == UbGemm("proj_fprop", PIPELINE, 24, 4, True, True, True)
    assert gemms["fc2_fprop"] == UbGemm("fc2_fprop", PIPELINE, 16, 4, True, True, False)


@pytest.mark.parametrize("text, reason", [
    ("qkv_fprop:\n  method: bulk\n", "not modelled"),
    ("nope_fprop:\n  method: bulk\n", "unknown GEMM"),
    ("qkv_dgrad:\n  num_sm: 0\n", "num_sm must be an integer"),
    ("qkv_dgrad:\n  colour: red\n", "unknown setting"),
    ("proj_fprop:\n  atomic_gemm: 1\n", "atomic_gemm is not modelled"),
    ("fc1_dgrad:\n  method: external\n", "not modelled for fc1_dgrad"),
    ("fc1_dgrad:\n  method: pipeline\nfc1_wgrad:\n  num_sm: 4\n", "may not be set when"),
    ("fc2_fprop:\n  method: bulk\n", "pipeline or ring_exchange"),
])
def test_a_bad_file_is_one_named_error(tmp_path, text, reason):
    cfg = tmp_path / "ub.yaml"
    cfg.write_text(text)
    with pytest.raises(UserError, match=reason) as err:
        ub_gemms(2, str(cfg))
    assert "parallel.tp_comm_overlap_cfg" in str(err.value)


def test_nemos_bundled_files_by_name():
    # NeMo's Llama 2 70B file (ub_cfg_h100_h8192_tp4_mbs1_seqlen4096.yaml at 0446d2c0): bulk
    # qkv_dgrad 8 SMs and fc1_dgrad 2 without the margin; pipelined proj_fprop 24 with it
    gemms = ub_gemms(4, "ub_cfg_h100_h8192_tp4_mbs1_seqlen4096")
    assert gemms["qkv_dgrad"] == UbGemm("qkv_dgrad", BULK, 8, 4, False, True, True)
    assert gemms["fc1_dgrad"] == UbGemm("fc1_dgrad", BULK, 2, 4, False, True, True)
    assert gemms["proj_fprop"] == UbGemm("proj_fprop", PIPELINE, 24, 4, True, True, False)
    assert gemms["fc2_dgrad"] == UbGemm("fc2_dgrad", RING_EXCHANGE, 1, 4, False, True, True,
                                        aggregate=True)
    assert not gemms["qkv_fprop"].aggregate
    with pytest.raises(UserError, match="cannot read"):
        ub_gemms(4, "ub_cfg_not_bundled")


def test_nemos_175b_file_sets_fc2_fprop_to_ring_exchange_over_the_pipeline_defaults():
    # NeMo's GPT-3 175B file (ub_cfg_h100_h12288_tp4_mbs1_seqlen2048.yaml at 121c975d): fc2_fprop
    # ring_exchange with num_sm 1 and the margin; num_splits stays TE's pipeline default (4,
    # unused: a ring exchange runs in t chunks); proj_fprop's fp8_buf honoured (pipelined)
    for mbs in (1, 2):
        gemms = ub_gemms(4, f"ub_cfg_h100_h12288_tp4_mbs{mbs}_seqlen2048")
        assert gemms["fc2_fprop"] == UbGemm("fc2_fprop", RING_EXCHANGE, 1, 4, True, True, False)
        assert gemms["proj_fprop"] == UbGemm("proj_fprop", PIPELINE, 24, 4, True, True, True)
        assert gemms["qkv_wgrad"] == UbGemm("qkv_wgrad", BULK, 4, 4, False, True, False)


def test_a_method_alone_keeps_the_default_methods_knobs(tmp_path):
    # TE's initialize_ub: get_default_config by the default method (pipeline: 16 SMs, margin),
    # then the user's keys; fp8_buf honoured on a layer pipelined by default
    cfg = tmp_path / "ub.yaml"
    cfg.write_text("proj_fprop:\n  method: ring_exchange\n  fp8_buf: 1\n")
    assert ub_gemms(8, str(cfg))["proj_fprop"] == UbGemm("proj_fprop", RING_EXCHANGE, 16, 4,
                                                          True, True, True)


def test_switch_needs_sequence_parallel_and_cfg_needs_the_switch(tmp_path):
    with pytest.raises(UserError, match="needs sequence_parallel"):
        load_scenario("scenarios/tiny.toml", {("parallel", "tp_comm_overlap"): True,
                                              ("parallel", "sequence_parallel"): False})
    with pytest.raises(UserError, match="needs tp_comm_overlap"):
        load_scenario("scenarios/tiny.toml", {("parallel", "tp_comm_overlap_cfg"): "x.yaml"})


def test_every_gradient_with_the_overlap_equals_the_single_device_reference():
    """The overlap only reorders and splits: tiny (t 2 SP, p 2, d 2) against the reference."""
    from simsp.commands.verify import REFERENCE_TOLERANCE
    from simsp.training.driver.compare import compare_with_reference
    from simsp.training.driver.iteration import simulate_iteration
    sc = load_scenario("scenarios/tiny.toml", {("parallel", "tp_comm_overlap"): True})
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) < REFERENCE_TOLERANCE
    assert "loss" in errors and "layers.0.attn.qkv.weight" in errors


RS_P2P_CFG = ("proj_fprop:\n  method: ring_exchange\n  num_sm: 1\n  set_sm_margin: 1\n"
              "fc2_fprop:\n  method: ring_exchange\n"
              "qkv_fprop:\n  aggregate: 1\nfc2_dgrad:\n  aggregate: 1\n"
              "qkv_dgrad:\n  method: ring_exchange\nfc1_dgrad:\n  method: pipeline\n"
              "  num_splits: 2\n  set_sm_margin: 0\n")


@pytest.mark.parametrize("t", [2, 4])
def test_ring_exchange_rs_gradients_equal_the_single_device_reference(t, tmp_path):
    """Both GEMM+RS by ring exchange (rows sent to their ranks, summed by the reduce kernel),
    two all-gathers under aggregate (pairs), and both dgrad reduce-scatter overlaps (qkv's by
    ring exchange, fc1's pipelined in 2 without the margin, replacing the bulk pairs): tiny at
    t 2 (p 2, d 2) and t 4 (p 2), SP, against the reference."""
    from simsp.commands.verify import REFERENCE_TOLERANCE
    from simsp.training.driver.compare import compare_with_reference
    from simsp.training.driver.iteration import simulate_iteration
    cfg = tmp_path / "ub.yaml"
    cfg.write_text(RS_P2P_CFG)
    sc = load_scenario("scenarios/tiny.toml", {
        ("parallel", "tp_comm_overlap"): True, ("parallel", "tp_comm_overlap_cfg"): str(cfg),
        ("parallel", "tp_comm_overlap_rs_dgrad"): True,
        ("parallel", "tensor_model_parallel_size"): t,
        ("parallel", "data_parallel_size"): 4 // t})
    run = simulate_iteration(sc)
    errors = compare_with_reference(run)
    assert max(errors.values()) < REFERENCE_TOLERANCE
    assert "layers.0.mlp.fc2.weight" in errors
    seen = run.inputs.world.ranks[0].tp_overlap_s
    assert seen[(tp_overlap.RS_P2P, "comm")] > 0 and (BULK, "comm") not in seen
    assert seen[(PIPELINE, "comm")] > 0  # fc1_dgrad's, the only pipelined GEMM


# GPT-3 20B's layer shape on H100 under FP8 with TE's comm overlap, in meta mode (t as tiny's)
GPT3_20B_FP8_OVERLAP = {
    ("parallel", "tp_comm_overlap"): True, ("parallel", "fp8_format"): "hybrid",
    ("model", "hidden_size"): 6144, ("model", "num_attention_heads"): 48,
    ("model", "seq_length"): 2048, ("parallel", "micro_batch_size"): 2,
    ("parallel", "global_batch_size"): 16, ("run", "mode"): "meta",
    ("cluster", "gpu"): "h100-sxm-80gb"}


def test_userbuffers_in_the_non_tensor_memory_against_a_hand_count():
    """GPT-3 20B's layer at t 2, b 2, s 2048 under FP8: ten buffers of (4096, 6144), the six
    all-gather ones in FP8 (1 B), the four reduce-scatter ones in BF16 (2 B)."""
    from simsp.training.non_tensor_memory import non_tensor_items
    overrides = dict(GPT3_20B_FP8_OVERLAP)  # a copy: the overlap is dropped below
    items = {i.name: i.bytes for i in non_tensor_items(load_scenario("scenarios/tiny.toml",
                                                                     overrides))}
    assert items["te_userbuffers"] == 4096 * 6144 * (6 * 1 + 4 * 2)
    # GPT-3 175B at t 4, b 1, s 2048 with NeMo's file: six FP8 all-gather buffers, proj_fprop's
    # FP8 (fp8_buf), the two wgrad ones BF16, fc2_fprop's ring-exchange RS BF16 of 2t - 1 = 7
    # chunks of 2048/4 rows
    big = {**overrides, ("model", "hidden_size"): 12288, ("model", "num_attention_heads"): 96,
           ("parallel", "micro_batch_size"): 1, ("parallel", "tensor_model_parallel_size"): 4,
           ("parallel", "data_parallel_size"): 1,
           ("parallel", "tp_comm_overlap_cfg"): "ub_cfg_h100_h12288_tp4_mbs1_seqlen2048"}
    items = {i.name: i.bytes for i in non_tensor_items(load_scenario("scenarios/tiny.toml", big))}
    assert items["te_userbuffers"] == 12288 * (2048 * (7 * 1 + 2 * 2) + 512 * 7 * 2)
    del overrides[("parallel", "tp_comm_overlap")]
    items = {i.name for i in non_tensor_items(load_scenario("scenarios/tiny.toml", overrides))}
    assert "te_userbuffers" not in items


@pytest.mark.parametrize("overrides", [
    {("model", "hidden_size"): 1024, ("model", "num_attention_heads"): 8,
     ("model", "seq_length"): 512},
    {("model", "hidden_size"): 768, ("model", "num_attention_heads"): 12,
     ("model", "seq_length"): 256, ("parallel", "tensor_model_parallel_size"): 4,
     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 8,
     ("cluster", "sm_contention"): True},
    {("model", "hidden_size"): 768, ("model", "num_attention_heads"): 12,
     ("model", "seq_length"): 256, ("parallel", "tensor_model_parallel_size"): 4,
     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 8,
     ("parallel", "tp_comm_overlap_cfg"): "ub_cfg_h100_h12288_tp4_mbs1_seqlen2048"},
    {("model", "hidden_size"): 768, ("model", "num_attention_heads"): 12,
     ("model", "seq_length"): 256, ("parallel", "tensor_model_parallel_size"): 4,
     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 8,
     ("parallel", "tp_comm_overlap_cfg"): "ub_cfg_h100_h8192_tp4_mbs1_seqlen4096"},  # aggregate
])
def test_shortcuts_give_the_full_simulations_times(overrides):
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    sc = load_scenario("scenarios/tiny.toml", {("run", "mode"): "meta",
                                               ("parallel", "tp_comm_overlap"): True,
                                               **overrides})
    fast = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    full = simulate_iteration(sc, Shortcuts(), trace="none")
    assert max(fast.results.end_s.values()) == pytest.approx(max(full.results.end_s.values()),
                                                             rel=1e-9)
    # what the overlap hid and left exposed: the replayed layers' share counted too
    fast_seen, full_seen = (run.inputs.world.ranks[0].tp_overlap_s for run in (fast, full))
    for key in fast_seen.keys() | full_seen.keys():  # a key that never moved may be absent
        assert fast_seen.get(key, 0.0) == pytest.approx(full_seen.get(key, 0.0), rel=1e-9,
                                                        abs=1e-15)
