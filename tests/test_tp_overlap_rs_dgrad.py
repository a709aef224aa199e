"""Transformer Engine's dgrad reduce-scatter overlap (ub_overlap_rs_dgrad; docs/tp-overlap.md):
a column-parallel backward at t 4 against hand-worked timelines (pipelined and ring exchange),
TE's defaults for a dgrad GEMM moved to a reduce-scatter method, its buffers against a hand
count, and the layer-template shortcut against the full simulation."""

import pytest
import simpy

from simsp.engine.memory import Ledger
from simsp.engine.sm_share import SmShare
from simsp.engine.streams import COMM, Stream
from simsp.hardware.costmodel import kernel_time
from simsp.model.base import linear, ops, tp_overlap
from simsp.model.rank import Rank, TPGroup
from simsp.model.tensor import FP16
from simsp.scenario.loading import load_scenario
from simsp.errors import UserError
from simsp.scenario.tp_overlap import BULK, PIPELINE, RING_EXCHANGE, UbGemm, ub_gemms
from test_tp_overlap import GPT3_20B_FP8_OVERLAP  # GPT-3 20B FP8 with comm overlap, meta

T = 4
M, K, N = 4096, 6144, 4608  # tokens, the layer's input columns, its output columns per rank


class KindComm:
    """A TP communicator whose calls last a fixed time per kind and return None (meta)."""

    def __init__(self, env, seconds: dict):
        self.env, self.seconds, self.calls = env, seconds, []

    def _call(self, kind, sms):
        self.calls.append((kind, self.env.now, sms))
        yield self.env.timeout(self.seconds[kind])

    def all_gather(self, group, rank, buffer, nbytes, tag="", elem_bytes=None, sms=None):
        yield from self._call("all_gather", sms)

    def reduce_scatter(self, group, rank, buffer, nbytes, tag="", elem_bytes=None, sms=None):
        yield from self._call("reduce_scatter", sms)

    def all_to_all(self, group, rank, chunks, send_bytes, tag="", sms=None):
        yield from self._call("all_to_all", sms)


def run_backward(ub: UbGemm, seconds: dict):
    """The qkv linear's backward on rank 0 of t 4 (meta, 132 SMs) under `ub` as qkv_dgrad;
    returns (end, rank, comm)."""
    env = simpy.Environment()
    comm = KindComm(env, seconds)
    overlap = {"qkv_dgrad": ub, "qkv_wgrad": UbGemm("qkv_wgrad", BULK, 16, 4, True, True)}
    r = Rank(0, env, Ledger(0, 1 << 40), TPGroup(tuple(range(T)), 0, True, comm, overlap),
             mode="meta", sm_share=SmShare(env, 132))
    r.comm_stream = Stream(env, 0, COMM)
    dy, x = r.alloc((M, 1, N), FP16, "dy"), r.alloc((M // T, 1, K), FP16, "x")
    w, g = {"attn.qkv.weight": r.alloc((K, N), FP16, "w")}, {"attn.qkv.weight": None}
    g["attn.qkv.weight"] = r.alloc((K, N), FP16, "dw")
    env.process(linear.column_parallel_backward(r, dy, x, w, g, "attn.qkv", has_bias=False))
    env.run()
    return env.now, r, comm


def gemm_times(ub: UbGemm, seconds: dict):
    """The dgrad and wgrad GEMMs' modelled seconds alone (the cost model's)."""
    _, r, _ = run_backward(ub, seconds)
    return ops.gemm_seconds(r, (M, N, K), False), ops.gemm_seconds(r, (K, M, N), False, True)


@pytest.mark.parametrize("rs_over_p, ag_over_dgrad", [(0.5, 0.5), (3.0, 0.5), (0.5, 2.0)])
def test_pipelined_dgrad_rs_matches_the_hand_timeline(rs_over_p, ag_over_dgrad):
    # the input's all-gather (a) launched at 0 on NCCL's stream; the dgrad GEMM in 4 column
    # pieces of p = g_d/4 · 132/116 (16 SMs margin); RS i (c) starts at max((i+1)p, end of RS
    # i-1); the wgrad GEMM (g_w, all SMs, nothing beside it) at max(dgrad's end, a)
    ub = UbGemm("qkv_dgrad", PIPELINE, 16, 4, True, True)
    g_d, g_w = gemm_times(ub, {"all_gather": 1.0, "reduce_scatter": 1.0})
    p = g_d / 4 * 132 / 116
    c = rs_over_p * p
    rs_end = 0.0
    for i in range(4):
        rs_end = max((i + 1) * p, rs_end) + c
    a = ag_over_dgrad * rs_end
    end, r, comm = run_backward(ub, {"all_gather": a, "reduce_scatter": c})
    assert end == pytest.approx(max(rs_end, a) + g_w, rel=1e-12)
    assert comm.calls[0] == ("all_gather", 0.0, None)  # NCCL's, before the dgrad GEMM
    rs_starts = [call[1] for call in comm.calls if call[0] == "reduce_scatter"]
    assert rs_starts == pytest.approx([max((i + 1) * p, p + i * c) for i in range(4)], rel=1e-12)
    assert {call[2] for call in comm.calls[1:]} == {0}  # the margin: no SM taken beside
    assert r.tp_overlap_s[(PIPELINE, "exposed")] == pytest.approx(rs_end - 4 * p, rel=1e-9)
    assert (BULK, "comm") not in r.tp_overlap_s  # no bulk pair any more
    exposed = rs_end - 4 * p + max(0.0, a - rs_end)  # the RS tail, then the all-gather's wait
    assert r.exposed_s["tp_comm"] == pytest.approx(exposed, rel=1e-9)


@pytest.mark.parametrize("c_over_p", [0.5, 3.0])
def test_ring_exchange_dgrad_rs_matches_the_hand_timeline(c_over_p):
    # TE's defaults for the moved GEMM: 1 SM over copy engines, no margin, t pieces of
    # p = g_d/4; send i (1..3) at max(i·p, end of send i-3) = i·p; then TE's reduce kernel
    # (reads 4 BF16 chunks of (m/4, k), writes one); the all-gather (a < the dgrad) beside
    ub = UbGemm("qkv_dgrad", RING_EXCHANGE, 1, T, False, True)
    g_d, g_w = gemm_times(ub, {"all_gather": 1.0, "all_to_all": 1.0})
    p = g_d / T
    c = c_over_p * p
    a = 0.5 * p
    _, r0, _ = run_backward(ub, {"all_gather": a, "all_to_all": c})
    reduce_s = kernel_time("elementwise", 0, M // T * K * (2 * T + 2), None, r0.compute_cal)
    comm_end = max(T * p, (T - 1) * p + c)
    end, r, comm = run_backward(ub, {"all_gather": a, "all_to_all": c})
    assert end == pytest.approx(comm_end + reduce_s + g_w, rel=1e-12)
    sends = [call for call in comm.calls if call[0] == "all_to_all"]
    assert [call[1] for call in sends] == pytest.approx([p, 2 * p, 3 * p], rel=1e-12)
    assert {call[2] for call in sends} == {0}
    assert [call[0] for call in comm.calls].count("reduce_scatter") == 0
    exposed = comm_end - T * p
    assert r.tp_overlap_s[(tp_overlap.RS_P2P, "exposed")] == pytest.approx(exposed, rel=1e-9,
                                                                            abs=1e-15)


def test_te_defaults_for_a_dgrad_moved_to_a_reduce_scatter_method(tmp_path):
    # initialize_ub moves the GEMM to its method's list before get_default_config: ring
    # exchange 1 SM, t splits, no margin; pipeline 16 SMs, 4 splits, margin; no longer an
    # all-gather layer, so its buffer is BF16 unless pipelined with the user's fp8_buf
    cfg = tmp_path / "ub.yaml"
    cfg.write_text("qkv_dgrad:\n  method: ring_exchange\nfc1_dgrad:\n  method: pipeline\n")
    gemms = ub_gemms(T, str(cfg))
    assert gemms["qkv_dgrad"] == UbGemm("qkv_dgrad", RING_EXCHANGE, 1, T, False, True, False)
    assert gemms["fc1_dgrad"] == UbGemm("fc1_dgrad", PIPELINE, 16, 4, True, True, False)
    assert gemms["qkv_wgrad"] == UbGemm("qkv_wgrad", BULK, 16, 4, True, True, False)
    cfg.write_text("fc1_dgrad:\n  method: pipeline\n  fp8_buf: 1\n"
                   "qkv_dgrad:\n  method: ring_exchange\n  fp8_buf: 1\n  aggregate: 1\n")
    gemms = ub_gemms(T, str(cfg))
    assert gemms["fc1_dgrad"].fp8_buf and not gemms["qkv_dgrad"].fp8_buf
    assert not gemms["qkv_dgrad"].aggregate  # TE reads aggregate in all-gathers alone


DGRAD_RS_CFG = ("qkv_dgrad:\n  method: ring_exchange\n"
                "fc1_dgrad:\n  method: pipeline\n  fp8_buf: 1\n")


def test_userbuffers_with_the_dgrad_rs_against_a_hand_count(tmp_path):
    """GPT-3 20B's layer at t 2, b 2, s 2048 under FP8: the four all-gather buffers FP8;
    qkv_dgrad's ring-exchange RS BF16 over 2t - 1 = 3 chunks of 2048 rows; fc1_dgrad's
    pipelined RS FP8 (fp8_buf); proj_fprop, fc2_fprop and both wgrad buffers (still
    registered by initialize_ub) BF16."""
    from simsp.training.non_tensor_memory import non_tensor_items
    cfg = tmp_path / "ub.yaml"
    cfg.write_text(DGRAD_RS_CFG)
    overrides = {**GPT3_20B_FP8_OVERLAP, ("parallel", "tp_comm_overlap_cfg"): str(cfg),
                 ("parallel", "tp_comm_overlap_rs_dgrad"): True}
    items = {i.name: i.bytes for i in non_tensor_items(load_scenario("scenarios/tiny.toml",
                                                                     overrides))}
    assert items["te_userbuffers"] == 6144 * (4096 * (4 * 1 + 1 * 1 + 4 * 2) + 2048 * 3 * 2)


def test_shortcuts_give_the_full_simulations_times_with_the_dgrad_rs(tmp_path):
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    cfg = tmp_path / "ub.yaml"
    cfg.write_text(DGRAD_RS_CFG)
    sc = load_scenario("scenarios/tiny.toml", {
        ("run", "mode"): "meta", ("parallel", "tp_comm_overlap"): True,
        ("parallel", "tp_comm_overlap_cfg"): str(cfg),
        ("parallel", "tp_comm_overlap_rs_dgrad"): True, ("model", "hidden_size"): 768,
        ("model", "num_attention_heads"): 12, ("model", "seq_length"): 256,
        ("parallel", "tensor_model_parallel_size"): 4, ("parallel", "data_parallel_size"): 1,
        ("parallel", "global_batch_size"): 8})
    fast = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    full = simulate_iteration(sc, Shortcuts(), trace="none")
    assert max(fast.results.end_s.values()) == pytest.approx(max(full.results.end_s.values()),
                                                             rel=1e-9)
    fast_seen, full_seen = (run.inputs.world.ranks[0].tp_overlap_s for run in (fast, full))
    assert (PIPELINE, "comm") in full_seen and (BULK, "comm") not in full_seen
    for key in fast_seen.keys() | full_seen.keys():
        assert fast_seen.get(key, 0.0) == pytest.approx(full_seen.get(key, 0.0), rel=1e-9,
                                                        abs=1e-15)


@pytest.mark.parametrize("text, flag, reason", [
    (DGRAD_RS_CFG, False, "qkv_dgrad: a reduce-scatter method needs tp_comm_overlap_rs_dgrad"),
    ("fc1_dgrad:\n  method: pipeline\n", True, "qkv_dgrad: tp_comm_overlap_rs_dgrad needs method"),
    ("qkv_dgrad:\n  method: pipeline\n", False, "qkv_dgrad: a reduce-scatter method needs"),
])
def test_the_switch_and_the_file_must_agree(tmp_path, text, flag, reason):
    # Megatron's --tp-comm-overlap-rs-dgrad picks TE's code path for every qkv and fc1 layer,
    # the file's method the buffer initialize_ub builds: both dgrad GEMMs moved, or neither
    cfg = tmp_path / "ub.yaml"
    cfg.write_text(text)
    with pytest.raises(UserError, match=reason):
        load_scenario("scenarios/tiny.toml", {
            ("parallel", "tp_comm_overlap"): True, ("parallel", "tp_comm_overlap_cfg"): str(cfg),
            ("parallel", "tp_comm_overlap_rs_dgrad"): flag})


def test_the_switch_without_the_overlap_is_refused():
    with pytest.raises(UserError, match="parallel.tp_comm_overlap_rs_dgrad"):
        load_scenario("scenarios/tiny.toml", {("parallel", "tp_comm_overlap_rs_dgrad"): True})
