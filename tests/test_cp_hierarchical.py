"""Hierarchical context parallelism (--cp-comm-type a2a+p2p, --hierarchical-context-parallel-sizes;
docs/context-parallel.md): Megatron's groups, the a2a group's tokens being the 2·P split, every
gradient against the single-device reference, a hand-worked timeline, and the ledger."""

from pathlib import Path

import numpy as np
import pytest

from simsp.scenario.loading import load_scenario
from simsp.model.context_split import local_positions
from simsp.training.driver.compare import compare_with_reference
from simsp.training.context_parallel.hierarchical import hierarchical_groups
from simsp.training.driver.iteration import simulate_iteration

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
HCP_TINY = SCENARIOS / "llama-tiny-hcp.toml"  # cp 4 = 2 x 2, t 2 SP, p 2 (1 + 2), d 2


def test_groups_are_megatrons_level_0_then_level_1():
    """create_hierarchical_groups' docstring example (megatron/core/parallel_state.py) on 16
    ranks with sizes [2, 8]: level 0 [g0, g1], [g2, g3], ...; level 1 [g0, g2, ..., g14], ..."""
    a2a, p2p = hierarchical_groups(tuple(range(16)), 2)
    assert a2a == [(2 * i, 2 * i + 1) for i in range(8)]
    assert p2p == [tuple(range(0, 16, 2)), tuple(range(1, 16, 2))]


@pytest.mark.parametrize("a2a, p2p", [(2, 2), (2, 4), (4, 2), (8, 1)])
def test_an_a2a_groups_tokens_are_the_2p_split(a2a, p2p):
    """Under the 2·cp split the tokens of a2a group R (CP ranks R·A .. R·A + A − 1) are chunks R
    and 2P − 1 − R of a 2·P split: the ring over P groups is load-balanced at cp = P."""
    s, cp = 64, a2a * p2p
    for outer in range(p2p):
        union = np.concatenate([local_positions(s, cp, outer * a2a + j) for j in range(a2a)])
        assert np.array_equal(np.sort(union), local_positions(s, p2p, outer))
        # TE's order after the all-to-all: the 2A received half-chunks (rank a's at 2a,
        # 2a + 1) picked by get_seq_chunk_ids_for_reordering_before_attn: a <- 2a,
        # A + a <- 2A - 2a - 1; the sequence order simsp uses (seq_to_heads) is the same
        halves = union.reshape(2 * a2a, -1)  # (2A, s/2cp)
        ids = [2 * a for a in range(a2a)] + [2 * a2a - 2 * a - 1 for a in range(a2a)]
        assert np.array_equal(halves[ids].reshape(-1), np.sort(union))


LAYOUTS = {  # overrides of llama-tiny-hcp.toml (dropout on, 8 heads on 4 KV groups)
    "cp4_2x2_tp_sp_pp_dp": {},
    "cp4_2x2_selective_core_attn": {("parallel", "recompute_granularity"): "selective",
                                    ("parallel", "data_parallel_size"): 1,
                                    ("parallel", "global_batch_size"): 2},
    "cp8_2x4_t1_p1": {("parallel", "context_parallel_size"): 8,
                      ("parallel", "hierarchical_context_parallel_sizes"): "2 4",
                      ("parallel", "tensor_model_parallel_size"): 1,
                      ("parallel", "sequence_parallel"): False,
                      ("parallel", "pipeline_model_parallel_size"): 1,
                      ("parallel", "decoder_first_pipeline_num_layers"): None,
                      ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 2,
                      ("cluster", "nodes"): 1},
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_gradient_equals_the_single_device_reference(name):
    errors = compare_with_reference(simulate_iteration(load_scenario(HCP_TINY, LAYOUTS[name])))
    assert max(errors.values()) < 1e-12, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert "embedding_output" in errors and "loss" in errors


@pytest.mark.parametrize("nvlink_gbps", [300.0, 0.5])  # transfers hidden / exposed
def test_cp4_2x2_attention_in_the_loop_by_hand(nvlink_gbps):
    """Four CP ranks on one node, a2a pairs (0, 1), (2, 3), rings (0, 2), (1, 3), through the
    loop's op (r.cp): forward = A_qkv + the ring's forward + A_out and backward = A_dout + the
    ring's backward + A_dqkv, with A_x one all-to-all (each rank sends half of x to its
    partner), the ring as tests/test_cp_training.py works it (TE's bookkeeping kernels
    around the blocks; ring rank = the a2a group's index, so ranks 2, 3 merge whole blocks where
    0, 1 merge halves), T one head group's K/V over NVLink, f_i, b_i the cost model's 2 and 5
    FlashAttention GEMMs of TE's step-i blocks on the head group's 2n tokens (diagonal: the
    whole block; `fused`: the A100 has no cuDNN figures, so the blocks are priced as those
    GEMMs); exposed cp_comm = the all-to-alls + the ring's waits; all to 1e-12."""
    from simsp.hardware.costmodel import kernel_time
    from simsp.model.tensor import FP16
    from simsp.training.context_parallel import te_p2p_kernels as te
    from simsp.training.driver.world import build_world
    sc = load_scenario(None, {("model", "attention_backend"): "fused",
                              ("model", "attention_dropout"): 0.0,
                              ("model", "seq_length"): 512, ("run", "mode"): "meta",
                              ("parallel", "context_parallel_size"): 4,
                              ("parallel", "cp_comm_type"): "a2a+p2p",
                              ("parallel", "hierarchical_context_parallel_sizes"): "2 2",
                              ("cluster", "nvlink_bandwidth_GBps"): nvlink_gbps})
    world = build_world(sc)
    b, heads, n, d = 1, 4, 128, 16  # per rank; the ring's head group: 2 heads, 2n tokens
    ends = {}

    def rank(r):
        q, k, v = (r.alloc((b, heads, n, d), FP16, name) for name in "qkv")
        r.scope = "mb0.L0."
        out, lse = yield from r.cp.forward(r, q, k, v, "out", "lse")
        ends[("forward", r.rank)] = r.env.now
        r.phase = "backward"
        yield from r.cp.backward(r, out, q, k, v, out, lse)
        ends[("backward", r.rank)] = r.env.now

    for r in world.ranks.values():
        world.env.process(rank(r))
    world.env.run()
    link = sc.cluster
    send = lambda nbytes: link.nvlink_latency_us * 1e-6 + nbytes / (
        nvlink_gbps * 1e9 * link.nvlink_efficiency)
    x = b * heads * n * d * FP16  # one of q, k, v (MHA here) or the output
    a_qkv, a_out, kv = send(3 * x // 2), send(x // 2), send(2 * x)
    m = 2 * n  # the head group's tokens
    gemm = lambda cols: kernel_time("gemm", 2 * b * (heads // 2) * m * d * cols, 0,
                                    gemm=(m, d, cols))
    mem = lambda kernels: sum(kernel_time("elementwise", 0, nbytes) for _, nbytes in kernels)
    f0, f1 = 2 * gemm(m), 2 * gemm(m // 2)
    b0, b1 = 5 * gemm(m // 2), 5 * gemm(m)
    lse_bytes = b * (heads // 2) * m * 4
    l0 = mem(te.forward_step(0, 0, lse_bytes))
    step1 = a_qkv + mem(te.forward_prologue(2 * x)) + max(f0 + l0, kv)
    forward = {o: step1 + f1 + mem(te.forward_step(1, o, lse_bytes))
               + mem(te.forward_epilogue(2, o, x)) + a_out for o in (0, 1)}
    pb = mem(te.backward_prologue(2 * x))
    g = {(i, o): mem(te.backward_step(i, 2, o, x, x, x)) for i in (0, 1) for o in (0, 1)}
    ring0 = {o: forward[o] + a_out + pb for o in (0, 1)}  # after the dout all-to-all
    wait0 = {o: max(ring0[o] + b0 + g[(0, o)], max(ring0.values()) + kv) for o in (0, 1)}
    ring_end = {o: max(wait0[o] + b1 + g[(1, o)], max(wait0.values()) + kv) for o in (0, 1)}
    backward = {o: ring_end[o] + a_qkv for o in (0, 1)}
    exposed = {o: 2 * (a_qkv + a_out) + max(kv - f0 - l0, 0)
               + max(max(ring0.values()) + kv - (ring0[o] + b0 + g[(0, o)]), 0)
               + max(max(wait0.values()) + kv - (wait0[o] + b1 + g[(1, o)]), 0) for o in (0, 1)}
    for r in world.ranks.values():
        o = r.cp.ring.index  # the ring rank: the a2a group's index
        assert abs(ends[("forward", r.rank)] - forward[o]) < 1e-12
        assert abs(ends[("backward", r.rank)] - backward[o]) < 1e-12
        assert abs(r.exposed_s["cp_comm"] - exposed[o]) < 1e-12
        assert not [key for key in r.ledger.live if "cp_" in key]  # buffers, kept block freed
    pairs = {(t.src, t.dst) for t in world.network.transfers if t.label.startswith("cp a2a")}
    rings = {(t.src, t.dst) for t in world.network.transfers if t.label.startswith("cp forward")}
    assert pairs == {(0, 1), (1, 0), (2, 3), (3, 2)} and rings == {(0, 2), (2, 0), (1, 3), (3, 1)}
    assert (max(kv - f0 - l0, 0) > 0) == (nvlink_gbps < 1)


def test_llama3_70b_cp4_2x2_memory_by_category_matches_the_closed_form():
    """Llama 3 70B's layer shapes at t 4 SP, cp 4 = 2 x 2 (a2a pairs inside a node, rings
    across nodes), p 2 interleaved (2 chunks of 2 layers), d 1, m 4: stage 0's rank 0 against
    docs/context-parallel.md's closed forms worked by hand; each layer keeps the p2p ring's K/V
    block and the a2a's head-split output beyond its own tensors at s/cp."""
    from simsp.training.driver.iteration import Shortcuts
    overrides = {("model", "num_layers"): 8, ("parallel", "pipeline_model_parallel_size"): 2,
                 ("parallel", "num_layers_per_virtual_pipeline_stage"): 2,
                 ("parallel", "tensor_model_parallel_size"): 4,
                 ("parallel", "context_parallel_size"): 4, ("parallel", "cp_comm_type"): "a2a+p2p",
                 ("parallel", "hierarchical_context_parallel_sizes"): "2 2",
                 ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 4,
                 ("cluster", "nodes"): 4}
    sc = load_scenario(SCENARIOS / "llama3-70b.toml", overrides)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    peaks = run.inputs.world.ranks[0].ledger.summary().peak_by_category
    h, a, g, d, f, t, cp, p, v = 8192, 64, 8, 128, 28672, 4, 4, 2, 2
    s = 8192 // cp  # each CP rank's tokens
    vocab = 128512  # 128256 padded to a multiple of 128·t
    layer_params = (h * (a + 2 * g) * d + a * d * h + h * 2 * f + f * h) // t + 2 * h
    params = vocab * h // t + 4 * layer_params  # embedding + virtual stages 0 and 2
    assert peaks["weights"] == 2 * params and peaks["gradients"] == 4 * params
    assert peaks["optimizer"] == 12 * params // (1 * cp)  # fp32 master, m, v over d·cp
    layer = (8 * s * h // t + 2 * s * d * (2 * a + 2 * g) // t + 6 * s * f // t
             + 4 * a * s // t  # fp32 logsumexp
             + 2 * s * d * (2 * g + a) // t)  # the ring's K/V block and a2a's output
    in_flight = 2 * v * min(p, 4) * (1 + (p - 1) / (p * v))  # layers held at stage 0's peak
    assert peaks["activations"] == in_flight * layer
    gpus = {(tr.src, tr.dst, tr.label.split()[1]) for tr in run.inputs.world.network.transfers
            if tr.label.startswith("cp ") and 0 in (tr.src, tr.dst)}
    assert {(src, dst) for src, dst, kind in gpus if kind == "a2a"} == {(0, 4), (4, 0)}
    assert {(src, dst) for src, dst, kind in gpus if kind != "a2a"} == {(0, 8), (8, 0)}


def test_sweep_takes_a2a_p2p_and_search_bounds_stay_below_it(capsys, tmp_path):
    """`simsp sweep --cp-comm-type p2p,a2a+p2p` on the hierarchical scenario (its TOML list of
    sizes held) simulates both; explore/search/bounds.py's proven bounds stay below an a2a+p2p run
    (even stages: 4 layers)."""
    import pandas as pd
    from simsp.cli import main
    from simsp.explore.search.bounds import memory_lower_bound, time_lower_bound
    from simsp.training.driver.iteration import Shortcuts
    assert main(["sweep", str(HCP_TINY), "--mode", "meta", "--cp-comm-type", "p2p,a2a+p2p",
                 "--workers", "0", "--quiet", "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "results.csv")
    assert list(frame["cp_comm_type"]) == ["p2p", "a2a+p2p"]
    assert list(frame["hierarchical_context_parallel_sizes"]) == ["2 2", "2 2"]
    assert (frame["iteration_time_s"] > 0).all()
    assert frame["layout.hierarchical_context_parallel_sizes"].fillna("").tolist() == ["", "2 2"]
    sc = load_scenario(HCP_TINY, {("run", "mode"): "meta", ("model", "num_layers"): 4,
                                  ("parallel", "decoder_first_pipeline_num_layers"): None})
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    assert 0 < time_lower_bound(sc) <= max(run.results.end_s.values())
    assert 0 < memory_lower_bound(sc) <= run.inputs.world.ranks[0].ledger.summary().peak_total


def test_fast_path_equals_full_simulation_with_a2a_inside_and_the_ring_across_nodes():
    """t 2, cp 4 = 2 x 2 on two nodes of 4 GPUs: a2a pairs (GPUs 0, 2) and (4, 6) inside each
    node, rings (0, 4) and (2, 6) across them; the closed-form shortcut (shortcuts/cp_traffic.py
    lists the CP group's every ordered pair) equals --no-shortcuts to 1%."""
    from simsp.scenario.loading import with_overrides
    from tests.test_cp_shortcuts import cp_scenario
    from tests.test_shortcut_layouts import assert_same, fast_and_full
    from simsp.training.driver.iteration import Shortcuts
    sc = with_overrides(cp_scenario(4, 2, 4, 1, 2, "p2p", True), parallel={
        "cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": "2 2"})
    assert Shortcuts.for_scale(sc).closed_form
    fast, full = fast_and_full(sc)
    assert_same(fast, full)
