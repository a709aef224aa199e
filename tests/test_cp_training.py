"""Context parallelism in the training loop (docs/context-parallel.md): every gradient of CP
layouts combined with TP, SP, PP and DP against the single-device reference (float64, to
rounding), `simsp verify` on scenarios/llama-tiny-cp.toml, and the ring's transfers and buffers
as the training loop runs it."""

from pathlib import Path

import pytest

from simsp.commands.verify import REFERENCE_TOLERANCE, verify_report
from simsp.scenario.loading import load_scenario
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

CP_TINY = Path(__file__).resolve().parents[1] / "scenarios" / "llama-tiny-cp.toml"
LAYOUTS = {  # overrides of llama-tiny-cp.toml: cp 2, t 2 SP, p 2 (1 + 2), d 2, hidden dropout
    "cp2_tp_sp_pp_dp": {},
    "cp4_tp_sp_pp": {("parallel", "context_parallel_size"): 4,
                     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 2},
    "cp8_t1_p1_d1": {("parallel", "context_parallel_size"): 8,  # 16 chunks of 2 tokens
                     ("parallel", "tensor_model_parallel_size"): 1,
                     ("parallel", "sequence_parallel"): False,
                     ("parallel", "pipeline_model_parallel_size"): 1,
                     ("parallel", "decoder_first_pipeline_num_layers"): None,
                     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 2},
    "cp2_learned_positions_tied_t1": {
        ("model", "position_embedding_type"): "learned_absolute",
        ("model", "rotary_base"): 10000,  # the default: RoPE's base means nothing without RoPE
        ("model", "untie_embeddings_and_output_weights"): False,
        ("parallel", "tensor_model_parallel_size"): 1, ("parallel", "sequence_parallel"): False},
    "cp2_full_recompute_groups_overlap": {
        ("model", "num_layers"): 4, ("parallel", "decoder_first_pipeline_num_layers"): 2,
        ("parallel", "recompute_granularity"): "full", ("parallel", "recompute_num_layers"): 2,
        ("parallel", "overlap_grad_reduce"): True},
    "cp2_selective_core_attn": {("parallel", "recompute_granularity"): "selective"},
    "cp2_allgather_tp_sp_pp_dp": {("parallel", "cp_comm_type"): "allgather"},
    "cp4_allgather_full_recompute": {("parallel", "cp_comm_type"): "allgather",
                                     ("parallel", "context_parallel_size"): 4,
                                     ("parallel", "data_parallel_size"): 1,
                                     ("parallel", "global_batch_size"): 2,
                                     ("parallel", "recompute_granularity"): "full"},
    "cp2_attention_dropout_p2p": {("model", "attention_dropout"): 0.1},
    "cp2_attention_dropout_allgather": {("model", "attention_dropout"): 0.1,
                                        ("parallel", "cp_comm_type"): "allgather"},
    "cp2_attention_dropout_a2a_selective": {("model", "attention_dropout"): 0.1,
                                            ("parallel", "cp_comm_type"): "a2a",
                                            ("model", "num_attention_heads"): 8,
                                            ("model", "num_query_groups"): 4,
                                            ("parallel", "recompute_granularity"): "selective"},
    "cp2_a2a_tp_sp_pp_dp": {("parallel", "cp_comm_type"): "a2a",  # 8 heads, 4 KV groups:
                            ("model", "num_attention_heads"): 8,  # 2 and 1 per (TP, CP) rank
                            ("model", "num_query_groups"): 4},
    "cp2_a2a_selective_core_attn": {("parallel", "cp_comm_type"): "a2a",
                                    ("model", "num_attention_heads"): 8,
                                    ("model", "num_query_groups"): 4,
                                    ("parallel", "recompute_granularity"): "selective"},
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_gradient_equals_the_single_device_reference(name):
    sc = load_scenario(CP_TINY, LAYOUTS[name])
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) < REFERENCE_TOLERANCE, sorted(errors.items(),
                                                              key=lambda kv: -kv[1])[:3]
    assert "embedding_output" in errors and "loss" in errors


def test_llama3_70b_cp2_memory_by_category_matches_the_closed_form():
    """Llama 3 70B's layer shapes at t 8 SP, cp 2, p 2 interleaved (2 chunks of 2 layers), d 1,
    m 4 (stage 0 already at its steady peak): every category of stage 0's rank against the
    closed forms of docs/context-parallel.md, worked here by hand."""
    overrides = {("model", "num_layers"): 8, ("parallel", "pipeline_model_parallel_size"): 2,
                 ("parallel", "num_layers_per_virtual_pipeline_stage"): 2,
                 ("parallel", "context_parallel_size"): 2, ("parallel", "data_parallel_size"): 1,
                 ("parallel", "global_batch_size"): 4, ("cluster", "nodes"): 4}
    sc = load_scenario(CP_TINY.parent / "llama3-70b.toml", overrides)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    peaks = run.inputs.world.ranks[0].ledger.summary().peak_by_category
    h, a, g, d, f, t, cp, p, v = 8192, 64, 8, 128, 28672, 8, 2, 2, 2
    s = 8192 // cp  # each CP rank's tokens
    vocab = 129024  # 128256 padded to a multiple of 128·t
    layer_params = (h * (a + 2 * g) * d + a * d * h + h * 2 * f + f * h) // t + 2 * h
    params = vocab * h // t + 4 * layer_params  # embedding + virtual stages 0 and 2
    assert peaks["weights"] == 2 * params  # bf16
    assert peaks["gradients"] == 4 * params  # fp32 main gradients
    assert peaks["optimizer"] == 12 * params // (1 * cp)  # fp32 master, m, v over d·cp
    layer = (8 * s * h // t  # LN inputs, QKV and fc1 inputs (SP: /t)
             + 2 * s * d * (2 * a + 2 * g) // t  # q, proj_input; k, v
             + 6 * s * f // t  # SwiGLU input and output
             + 4 * a * s // t  # fp32 logsumexp
             + 2 * s * d * 2 * g // t)  # the ring's saved K/V block (rank r + 1's)
    in_flight = 2 * v * min(p, 4) * (1 + (p - 1) / (p * v))  # layers held at stage 0's peak
    assert peaks["activations"] == in_flight * layer
    kv_block = 2 * s * d * 2 * (g // t)  # K and V, one KV head per TP rank, fp16
    ring = [tr.nbytes for tr in run.inputs.world.network.transfers if tr.label.startswith("cp ")]
    assert set(ring) == {kv_block}
    # per CP group run (TP rank 0's of each stage, p·d = 2: the representative shortcut runs
    # no TP images), layer (4 per stage) and micro-batch (4): forward 1 step of 2 sends,
    # backward K/V then dK/dV, 2 sends each
    assert sorted(run.inputs.world.ranks) == [0, 8, 16, 24]  # rank tp + t·cp_rank + t·c·d·pp
    assert len(ring) == 2 * 4 * 4 * (2 + 4)


def test_search_layouts_hold_the_fixed_cp_and_its_bounds_stay_below_the_simulation():
    """`simsp search --context-parallel-size 2`: every layout has t·cp·p·d = N; on one of them
    the proven time and memory bounds (explore/search/bounds.py, the layer alone at s/cp) stay below
    the simulated iteration time and stage 0's peak."""
    from simsp.explore.configs.grid import base_values
    from simsp.explore.search.layouts import enumerate_layouts, search_base
    from simsp.explore.search.bounds import memory_lower_bound, scenario_of, time_lower_bound
    base = search_base(base_values(CP_TINY))
    base[("run", "mode")] = "meta"
    found = enumerate_layouts(base, 16, 4, {"context_parallel_size": 2})
    layouts = [scenario_of(config).parallel for config in found.configs]
    assert layouts and all(p.cp == 2 and p.tp * p.cp * p.pp * p.dp == 16 for p in layouts)
    assert any(" cp2 " in config.name for config in found.configs)
    sc = load_scenario(CP_TINY, {("run", "mode"): "meta", ("model", "num_layers"): 4,
                                 ("parallel", "decoder_first_pipeline_num_layers"): None})
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    assert 0 < time_lower_bound(sc) <= max(run.results.end_s.values())
    assert 0 < memory_lower_bound(sc) <= run.inputs.world.ranks[0].ledger.summary().peak_total


def test_a_small_layout_passes_verify_with_finite_differences():
    """`simsp verify`'s two checks (finite differences and the reference) on one layer at
    cp 2 × t 2 with SP (the whole scenarios/llama-tiny-cp.toml passes too: 2.9e-6, 1.5e-15)."""
    overrides = {("model", "num_layers"): 1, ("parallel", "pipeline_model_parallel_size"): 1,
                 ("parallel", "decoder_first_pipeline_num_layers"): None,
                 ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 1,
                 ("cluster", "nodes"): 1}
    report = verify_report(load_scenario(CP_TINY, overrides))
    assert report["passed"] and report["max_rel_err"] < 1e-5, report["max_rel_err"]


@pytest.mark.parametrize("nvlink_gbps", [300.0, 0.5])  # transfer hidden / exposed
def test_cp2_ring_in_the_loop_by_hand(nvlink_gbps):
    """Two CP ranks' attention through the training loop's op (r.cp): the ring of
    docs/context-parallel.md with Transformer Engine's bookkeeping kernels around it
    (te_p2p_kernels, tests/test_cp_te_kernels.py): the K/V pack P, then step 0's block f0 and
    logsumexp copy L0, step 1 (after the K/V transfer T) f1 and its merge L1, then the output
    merges E; backward the K/V copy Pb, then per step the block b_i and the dQ/dK/dV merges G_i,
    each step waiting for its exchange. f_i, b_i are the cost model's FlashAttention GEMMs on
    TE's step-i blocks (the diagonal, whole block first forward and last backward; `fused`: the
    A100 has no cuDNN figures, so the blocks are priced as those GEMMs); rank 1 merges whole
    blocks where rank 0 merges halves, so the ranks differ and the ring waits for the later
    one; the time blocked on the ring is the rank's exposed cp_comm; each step's block GEMMs
    in the ring's timeline; all to 1e-12."""
    from simsp.hardware.costmodel import kernel_time
    from simsp.model.tensor import FP16
    from simsp.training.context_parallel import te_p2p_kernels as te
    from simsp.training.driver.world import build_world
    sc = load_scenario(None, {("model", "attention_backend"): "fused",
                              ("model", "attention_dropout"): 0.0,
                              ("model", "seq_length"): 256, ("run", "mode"): "meta",
                              ("parallel", "context_parallel_size"): 2,
                              ("cluster", "nvlink_bandwidth_GBps"): nvlink_gbps})
    world = build_world(sc)
    b, heads, n, d = 1, 4, 128, 16
    ends, spans_of = {}, {}
    gemm_names = ("cp_scores_", "cp_context_", "cp_recompute_scores_", "cp_d_v_", "cp_d_probs_",
                  "cp_d_q_", "cp_d_k_")

    class Spans:  # each compute span of the ring's block attention, by (rank, phase, step)
        skip = ()  # no track skipped (engine/trace.py Trace.skip)

        def add_span(self, rank, stream, name, start, end, args):
            if not name.startswith(gemm_names):
                return
            key = (rank, args["phase"] if args["phase"] != "recompute" else "backward",
                   int(name.rsplit("_", 1)[1]))
            spans_of.setdefault(key, []).append((start, end))

    def rank(r):
        q, k, v = (r.alloc((b, heads, n, d), FP16, name) for name in "qkv")
        r.scope = "mb0.L0."
        out, lse = yield from r.cp.forward(r, q, k, v, "out", "lse")
        ends[("forward", r.rank)] = r.env.now
        r.phase = "backward"
        dq, dk, dv = yield from r.cp.backward(r, out, q, k, v, out, lse)
        ends[("backward", r.rank)] = r.env.now

    for r in world.ranks.values():
        r.trace = Spans()
        world.env.process(rank(r))
    world.env.run()
    gemm = lambda cols: kernel_time("gemm", 2 * b * heads * n * d * cols, 0, gemm=(n, d, cols))
    mem = lambda kernels: sum(kernel_time("elementwise", 0, nbytes) for _, nbytes in kernels)
    f0, f1 = 2 * gemm(n), 2 * gemm(n // 2)  # forward: diagonal block, then half a block
    b0, b1 = 5 * gemm(n // 2), 5 * gemm(n)  # backward: half, then the diagonal (TE's reverse)
    x = b * heads * n * d * FP16  # q (= the output), k, v: MHA here
    lse_bytes = b * heads * n * 4
    kv = 2 * x
    link = sc.cluster
    t = link.nvlink_latency_us * 1e-6 + kv / (nvlink_gbps * 1e9 * link.nvlink_efficiency)
    p, pb = mem(te.forward_prologue(kv)), mem(te.backward_prologue(kv))
    l0 = mem(te.forward_step(0, 0, lse_bytes))
    step1, fwd_end, start = {}, {}, p + max(f0 + l0, t)
    for cp_rank in (0, 1):
        step1[cp_rank] = start
        fwd_end[cp_rank] = (start + f1 + mem(te.forward_step(1, cp_rank, lse_bytes))
                            + mem(te.forward_epilogue(2, cp_rank, x)))
    g = {(i, cp_rank): mem(te.backward_step(i, 2, cp_rank, x, x, x))
         for i in (0, 1) for cp_rank in (0, 1)}
    posted0 = max(fwd_end.values()) + pb  # the exchange starts once both ranks have posted
    wait0 = {c: max(fwd_end[c] + pb + b0 + g[(0, c)], posted0 + t) for c in (0, 1)}
    posted1 = max(wait0.values())
    bwd_end = {c: max(wait0[c] + b1 + g[(1, c)], posted1 + t) for c in (0, 1)}
    exposed = {c: max(t - f0 - l0, 0) + max(posted0 + t - (fwd_end[c] + pb + b0 + g[(0, c)]), 0)
               + max(posted1 + t - (wait0[c] + b1 + g[(1, c)]), 0) for c in (0, 1)}
    for r in world.ranks.values():
        c = r.cp.index
        assert abs(ends[("forward", r.rank)] - fwd_end[c]) < 1e-12
        assert abs(ends[("backward", r.rank)] - bwd_end[c]) < 1e-12
        assert abs(r.exposed_s.get("cp_comm", 0.0) - exposed[c]) < 1e-12
        steps = {("forward", 0): (p, f0), ("forward", 1): (step1[c], f1),
                 ("backward", 0): (fwd_end[c] + pb, b0), ("backward", 1): (wait0[c], b1)}
        for (phase, step), (begin, seconds) in steps.items():
            spans = spans_of[(r.rank, phase, step)]  # the step's GEMMs, back to back
            assert abs(spans[0][0] - begin) < 1e-12
            assert abs(spans[-1][1] - begin - seconds) < 1e-12
    assert (max(t - f0 - l0, 0) > 0) == (nvlink_gbps < 1)


def test_what_if_shows_cp_time_only_where_a_row_has_it():
    from simsp.report.whatif.comparison import KINDS, exposure, kinds_of
    stage = {"compute": 1.0, "tp_comm": 0.5, "pp_transfer": 0.0, "pp_wait": 0.5, "dp_comm": 0.0,
             "optimizer": 0.0}
    plain = {"iteration_time_s": 2.0, **{f"exposed_s_stage0.{k}": v for k, v in stage.items()}}
    with_cp = dict(plain, **{"exposed_s_stage0.pp_wait": 0.25, "exposed_s_stage0.cp_comm": 0.25})
    assert kinds_of([plain]) == KINDS and kinds_of([plain, with_cp]) == KINDS + ("cp_comm",)
    assert exposure(with_cp)["cp_comm"] == 0.25 and exposure(plain)["cp_comm"] == 0.0


def test_search_varies_cp_over_a_list_and_every_bound_holds(capsys, tmp_path):
    """`simsp search --context-parallel-size 1,2` on 8 GPUs: layouts of both c, each with
    t·c·p·d = 8, and each simulated layout's proven bounds (its own c's) re-checked."""
    import pandas as pd
    from simsp.cli import main
    assert main(["search", str(CP_TINY), "--gpus", "8", "--context-parallel-size", "1,2",
                 "--workers", "0", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "context_parallel_size varied over 1, 2;" in out
    assert "every simulated layout checked: both bounds held" in out
    frame = pd.read_csv(tmp_path / "results.csv")
    assert set(frame["context_parallel_size"]) == {1, 2}
    assert all(frame["tensor_model_parallel_size"] * frame["context_parallel_size"]
               * frame["pipeline_model_parallel_size"] * frame["data_parallel_size"] == 8)
    assert main(["search", "--gpus", "8", "--context-parallel-size", "0,2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --context-parallel-size: must be a positive integer, got 0,2")


def test_the_run_header_names_cp_and_its_comm_type(capsys, tmp_path):
    """summary.md's Layout line of a CP run says cp and how it communicates (t·cp·p·d = 16)."""
    from simsp.cli import main
    assert main(["run", str(CP_TINY), "--mode", "meta", "--quiet", "--trace", "none",
                 "--out", str(tmp_path)]) == 0
    layout = next(line for line in (tmp_path / "summary.md").read_text().splitlines()
                  if line.startswith("Layout:"))
    assert layout.startswith("Layout: t=2 cp=2 (p2p) p=2 d=2 on 16 GPUs")
