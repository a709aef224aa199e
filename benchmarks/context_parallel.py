"""Context parallelism's building blocks, run: the ring attention timeline table of
docs/context-parallel.md (block times from the cost model, transfers on the default cluster's
links), the Ulysses (a2a) timeline beside it, and a numeric cross-check of the three ways simsp
computes CP attention (ring p2p, Ulysses a2a, each run by rank processes on the links).

    python benchmarks/context_parallel.py
    python benchmarks/context_parallel.py --memory   # Llama 3 70B at CP 2 in the training loop
    python benchmarks/context_parallel.py --hierarchical   # CP 4: p2p against a2a+p2p 2x2

`--memory` simulates scenarios/llama3-70b.toml with --context-parallel-size 2
--data-parallel-size 1 --global-batch-size 8 (meta, every rank: about 30 CPU seconds) and prints
stage 0's memory by category beside docs/context-parallel.md's closed form. `--hierarchical`
simulates it at t 4, CP 4, d 1 with --cp-comm-type p2p and a2a+p2p
(--hierarchical-context-parallel-sizes 2 2) and prints docs/context-parallel.md's table
(about 30 CPU seconds).
"""

import sys
from pathlib import Path

import numpy as np
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.model.blocks.attention.rope import rope_tables
from simsp.model.context_split import (balanced_step_pairs, gather_sequence, local_positions,
                                       split_sequence, visible_pairs)
from simsp.training.context_parallel.ring_kernels import CpShard, ring_backward, ring_forward, source_rank
from simsp.training.context_parallel.ulysses_kernels import shard_positions, ulysses_backward, ulysses_forward
from simsp.training.context_parallel.a2a import CpAllToAll
from simsp.training.context_parallel.a2a_numeric import run_numeric_a2a
from simsp.training.context_parallel.ring import CpRing, block_seconds, diagonal_step, run_ring
from simsp.training.context_parallel.ring_numeric import run_numeric_ring

FP16 = 2  # bytes per element
D = 128  # Llama 3 70B head dimension
# (cp, s, GPUs): the docs' placements; Llama 3 70B at t = 8 holds 8 query heads, 1 KV head
RING_CASES = ((2, 8192, (0, 1)), (2, 8192, (0, 8)), (8, 131072, tuple(range(8))))


def _network(gpus: tuple) -> tuple:
    cluster = Cluster(nodes=max(gpus) // 8 + 1)
    env = simpy.Environment()
    return env, Network(env, build_topology(cluster), LinkCalibration.from_cluster(cluster))


def ring_row(cp: int, s: int, gpus: tuple, heads: int = 8, groups: int = 1) -> str:
    """One row: K/V block bytes, one K/V transfer's time (forward step 0, the slowest rank's),
    the ring's forward and backward."""
    n = s // cp
    kv_bytes = 2 * groups * n * D * FP16  # K and V of the rank's n tokens, b = 1
    env, network = _network(gpus)
    ring = CpRing(env, network, gpus, kv_bytes)
    fwd = [[block_seconds(1, heads, n, D, i == diagonal_step("forward", cp), False)
            for i in range(cp)]] * cp
    bwd = [[block_seconds(1, heads, n, D, i == diagonal_step("backward", cp), True)
            for i in range(cp)]] * cp
    timeline = run_ring(env, ring, fwd, bwd)
    moved = [tr.end_s - tr.start_s for tr in network.transfers if "forward step 0" in tr.label]
    forward = max(timeline.ends[("forward", r)] for r in range(cp))
    backward = max(timeline.ends[("backward", r)] for r in range(cp)) - forward
    return (f"| {cp} | {s} | {gpus[0]}..{gpus[-1]} | {kv_bytes / 1e6:.2f} MB | "
            f"{max(moved) * 1e3:.3f} ms | {forward * 1e3:.3f} ms | {backward * 1e3:.3f} ms |")


def a2a_row(cp: int, s: int, gpus: tuple, heads: int = 64, groups: int = 8) -> str:
    """Ulysses at t = 1 (64 query, 8 KV heads split over cp): four all-to-alls around the
    whole-sequence attention of heads/cp heads."""
    n = s // cp
    qkv_bytes, out_bytes = (heads + 2 * groups) * n * D * FP16, heads * n * D * FP16
    env, network = _network(gpus)
    a2a = CpAllToAll(env, network, gpus, qkv_bytes, out_bytes)
    attention = block_seconds(1, heads // cp, s, D, True, False)
    attention_bwd = block_seconds(1, heads // cp, s, D, True, True)
    for rank in range(cp):
        env.process(a2a.run_rank(rank, attention, attention_bwd))
    env.run()
    forward = max(a2a.ends[("forward", r)] for r in range(cp))
    backward = max(a2a.ends[("backward", r)] for r in range(cp)) - forward
    return (f"| {cp} | {s} | {gpus[0]}..{gpus[-1]} | {qkv_bytes / 1e6:.2f} MB | "
            f"{forward * 1e3:.3f} ms | {backward * 1e3:.3f} ms |")


def numeric_check(cp: int = 4, s: int = 16, balanced: bool = True) -> dict:
    """Max |difference| between ring p2p, Ulysses a2a and the ring run on the links (out, dq,
    dk, dv gathered back in sequence order), and of per-chunk RoPE against whole-sequence RoPE."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, s, 8))  # (b, a, s, d)
    k, v = rng.standard_normal((2, 1, 4, s, 8))  # (b, G, s, d) each
    dout = rng.standard_normal(q.shape)  # (b, a, s, d)
    positions = shard_positions(s, cp, balanced)
    cut = lambda x, r: split_sequence(x, cp, r, balanced)  # noqa: E731
    shards = [CpShard(cut(q, r), cut(k, r), cut(v, r), positions[r]) for r in range(cp)]
    douts = [cut(dout, r) for r in range(cp)]
    outs, lses = zip(*ring_forward(shards))
    ring = [gather_sequence(list(outs), balanced)] + [
        gather_sequence(list(g), balanced) for g in zip(*ring_backward(shards, douts, outs, lses))]
    a2a_outs, saved = ulysses_forward(shards)
    a2a = [gather_sequence(a2a_outs, balanced)] + [
        gather_sequence(list(g), balanced) for g in zip(*ulysses_backward(shards, douts, saved))]
    env, network = _network(tuple(range(cp)))
    steps = [[1e-5] * cp] * cp
    on_links = run_numeric_ring(CpRing(env, network, tuple(range(cp)), 1), shards, douts,
                                steps, steps)
    links = [gather_sequence([res[j] for res in on_links], balanced) for j in range(4)]
    env, network = _network(tuple(range(cp)))
    a2a_on_links = run_numeric_a2a(CpAllToAll(env, network, tuple(range(cp)), 1, 1), shards,
                                   douts, 1e-5, 1e-5)
    a2a_links = [gather_sequence([res[j] for res in a2a_on_links], balanced) for j in range(4)]
    whole_cos, _ = rope_tables(np.arange(s), 8, 10000.0)  # (s, 8)
    chunk_cos = [rope_tables(local_positions(s, cp, r, balanced), 8, 10000.0)[0]
                 for r in range(cp)]
    return {
        "ring vs a2a": max(float(np.abs(a - b).max()) for a, b in zip(ring, a2a)),
        "ring vs ranks on the links": max(float(np.abs(a - b).max()) for a, b in zip(ring, links)),
        "a2a vs ranks on the links": max(float(np.abs(a - b).max())
                                         for a, b in zip(a2a, a2a_links)),
        "per-chunk vs whole RoPE": float(np.abs(gather_sequence(chunk_cos, balanced, axis=0)
                                                - whole_cos).max()),
    }


def memory_table() -> None:
    """Stage 0's rank 0 of Llama 3 70B at CP 2, by category, against the closed form."""
    from simsp.analytic import first_stage_activation_bytes
    from simsp.scenario.loading import load_scenario
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    overrides = {("parallel", "context_parallel_size"): 2, ("parallel", "data_parallel_size"): 1,
                 ("parallel", "global_batch_size"): 8}
    sc = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "llama3-70b.toml",
                       overrides)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
    peaks = run.inputs.world.ranks[0].ledger.summary().peak_by_category
    m, p = sc.model, sc.parallel
    h, a, g, d, f, t = (m.hidden_size, m.num_attention_heads, m.query_groups, m.head_dim,
                        m.ffn, p.tp)
    layer = (h * (a + 2 * g) * d + a * d * h + 2 * h * f + f * h) // t + 2 * h
    params = sc.padded_vocab_size * h // t + m.num_layers // p.pp * layer  # stage 0, per rank
    closed = {"weights": 2 * params, "gradients": 4 * params,
              "optimizer": 12 * params // (p.dp * p.cp),
              "activations": first_stage_activation_bytes(sc)}
    print(f"Llama 3 70B, t {t} SP, cp {p.cp}, p {p.pp} interleaved, d {p.dp}: stage 0, rank 0")
    print("| category | ledger (bytes) | closed form |\n|---|---:|---:|")
    for category, measured in peaks.items():
        form = closed.get(category)
        print(f"| {category} | {measured:,} | {'' if form is None else f'{int(form):,}'} |")
    print(f"iteration {max(run.results.end_s.values()):.4f} s; rank 0 blocked on CP exchanges "
          f"{run.inputs.world.ranks[0].exposed_s.get('cp_comm', 0.0):.6f} s")


def hierarchical_table() -> None:
    """Llama 3 70B on 64 GPUs at t 4 SP, CP 4, p 4, d 1: one ring of 4 against a2a pairs inside
    a node and rings across nodes (stage 0's time, CP exposure and activations)."""
    from simsp.analytic import first_stage_activation_bytes
    from simsp.scenario.loading import load_scenario
    from simsp.metrics.timing import exposure
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    print("| layout | iteration | compute | cp_comm | stage 0 activations | closed form |")
    print("|---|---:|---:|---:|---:|---:|")
    for comm in ("p2p", "a2a+p2p"):
        overrides = {("parallel", "tensor_model_parallel_size"): 4,
                     ("parallel", "context_parallel_size"): 4, ("parallel", "cp_comm_type"): comm,
                     ("parallel", "hierarchical_context_parallel_sizes"): "2 2",
                     ("parallel", "data_parallel_size"): 1, ("parallel", "global_batch_size"): 8}
        sc = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "llama3-70b.toml",
                           overrides)
        run = simulate_iteration(sc, Shortcuts.for_scale(sc), trace="none")
        stage0 = exposure(run)[0]
        peak = run.inputs.world.ranks[0].ledger.summary().peak_by_category["activations"]
        end_s = max(run.results.end_s.values())
        print(f"| c 4 {comm} | {end_s:.3f} s | {stage0['compute']:.3f} s | "
              f"{stage0['cp_comm']:.4f} s | {peak:,} | {int(first_stage_activation_bytes(sc)):,} |")


def main():
    if "--memory" in sys.argv[1:]:
        memory_table()
        return
    if "--hierarchical" in sys.argv[1:]:
        hierarchical_table()
        return
    print("| cp | s | GPUs | K/V block | transfer | forward | backward |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for case in RING_CASES:
        print(ring_row(*case))
    print("\nUlysses (a2a), Llama 3 70B heads at t = 1:\n")
    print("| cp | s | GPUs | QKV per rank | forward | backward |")
    print("|---:|---:|---|---:|---:|---:|")
    for cp, s, gpus in ((2, 8192, (0, 1)), (8, 131072, tuple(range(8)))):
        print(a2a_row(cp, s, gpus))
    cp, s = 4, 64
    print(f"\nring steps, cp = {cp}, s = {s}: which rank's K/V each rank holds; causal pairs")
    for step in range(cp):
        held = [source_rank(r, step, cp) for r in range(cp)]
        pairs = {visible_pairs(s, cp, r, step) for r in range(cp)}
        print(f"  step {step}: holds {held}; pairs per rank {sorted(pairs)} "
              f"(closed form {balanced_step_pairs(s, cp, step)})")
    print("\nnumeric agreement (max |difference|, float64):")
    for name, value in numeric_check().items():
        print(f"  {name}: {value:.1e}")


if __name__ == "__main__":
    main()
