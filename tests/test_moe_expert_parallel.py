"""Expert parallelism in training (docs/moe.md): every gradient of tiny numeric MoE scenarios
with EP, ETP, TP+SP, PP and DP against the single-device reference (and central finite
differences on the MoE weights of one layout), the EP dispatch sharing a NIC with a DP
reduce-scatter (hand-worked), and meta mode's routing model (counts worked out here)."""

from dataclasses import fields, replace
import math

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import SECTIONS, Cluster
from simsp.scenario.loading import load_scenario
from simsp.engine.communicator import Communicator
from simsp.engine.network import Network
from simsp.errors import UserError
from simsp.hardware.constants import LinkCalibration
from simsp.metrics.collect import collect
from simsp.model.blocks.moe import router as K
from simsp.model.blocks.moe.routing import kept_counts, routed_counts
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.gradcheck import gradient_check
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from tests.test_moe_shortcuts import as_flows

BASE = {("model", "num_layers"): 2, ("model", "hidden_size"): 16,
        ("model", "num_attention_heads"): 2, ("model", "seq_length"): 8,
        ("model", "vocab_size"): 64, ("model", "ffn_hidden_size"): 24,
        ("model", "hidden_dropout"): 0.0, ("model", "attention_dropout"): 0.0,
        ("model", "add_bias_linear"): False, ("model", "num_experts"): 4,
        ("model", "moe_router_topk"): 2, ("model", "moe_aux_loss_coeff"): 0.01,
        ("parallel", "micro_batch_size"): 2, ("parallel", "global_batch_size"): 8,
        ("parallel", "data_parallel_size"): 2, ("parallel", "expert_model_parallel_size"): 2,
        ("parallel", "moe_token_dispatcher_type"): "alltoall"}
FIELDS = {section: {f.name for f in fields(cls)} for section, cls in SECTIONS.items()}


def scenario(**extra):
    overrides = dict(BASE)
    for key, value in extra.items():
        overrides[(next(s for s, names in FIELDS.items() if key in names), key)] = value
    return load_scenario(None, overrides)


TP_SP = dict(tensor_model_parallel_size=2, sequence_parallel=True)
LAYOUTS = {
    "ep2 pp2 dp2 top2 dropping": dict(pipeline_model_parallel_size=2,
                                      moe_expert_capacity_factor=0.5),
    "ep4 dp4 top1 sigmoid dropless swiglu": dict(data_parallel_size=4,
                                                 expert_model_parallel_size=4,
                                                 moe_router_topk=1, swiglu=True,
                                                 moe_router_score_function="sigmoid"),
    "ep2 shared experts, a dense first layer": dict(moe_shared_expert_intermediate_size=12,
                                                    swiglu=True, moe_layer_freq="([0]*1+[1]*1)"),
    "ep2 edp2 padded full recompute": dict(data_parallel_size=4, moe_expert_capacity_factor=1.0,
                                           moe_pad_expert_input_to_capacity=True,
                                           recompute_granularity="full"),
    "t2 sp etp1 ep4 dropping": dict(TP_SP, expert_tensor_parallel_size=1,
                                    expert_model_parallel_size=4,
                                    moe_expert_capacity_factor=0.5),
    "t2 sp etp2 ep2 pp2 top1 swiglu dropping shared": dict(
        TP_SP, pipeline_model_parallel_size=2, moe_router_topk=1, swiglu=True,
        moe_expert_capacity_factor=0.5, moe_shared_expert_intermediate_size=8),
    "etp2 over dp (t 1) ep2 dp4": dict(expert_tensor_parallel_size=2, data_parallel_size=4),
    "allgather ep2 dropping shared": dict(moe_token_dispatcher_type="allgather",
                                          moe_expert_capacity_factor=0.5,
                                          moe_shared_expert_intermediate_size=8),
    "allgather t2 sp etp2 ep2 padded swiglu": dict(TP_SP, moe_token_dispatcher_type="allgather",
                                                   moe_expert_capacity_factor=1.0, swiglu=True,
                                                   moe_pad_expert_input_to_capacity=True),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_gradient_matches_the_single_device_reference(name):
    run = simulate_iteration(scenario(**LAYOUTS[name]))
    dispatcher = run.inputs.sc.parallel.moe_token_dispatcher_type
    kinds = {kind for _, kind in run.inputs.world.ranks[0].comm_bytes}
    assert ("all_to_all_dispatch" if dispatcher == "alltoall" else "all_gather_moe") in kinds
    errors = compare_with_reference(run)
    assert f"layers.{1 if 'dense first' in name else 0}.mlp.experts.fc1.weight" in errors
    assert max(errors.values()) < 1e-13, max(errors, key=errors.get)


def test_finite_differences_agree_on_the_moe_weights_with_tp_etp_ep_pp_dp():
    sc = scenario(**LAYOUTS["t2 sp etp2 ep2 pp2 top1 swiglu dropping shared"])
    names = [f"layers.{i}.mlp.{w}.weight" for i in (0, 1)
             for w in ("router", "experts.fc1", "experts.fc2", "shared_experts.fc1")]
    errors = gradient_check(sc, names + ["embedding_output"]).errors
    assert max(errors.values()) < 1e-5, errors


def test_reference_discriminates_the_sequence_shards_routing():
    # each TP rank drops against its own s/t tokens' capacity: routing the whole micro-batch
    # at once (chunks 1) gives other gradients
    from simsp.model.reference import reference_forward_backward, relative_error
    from simsp.training.driver.compare import gathered_grads
    sc = scenario(**LAYOUTS["t2 sp etp1 ep4 dropping"])
    run = simulate_iteration(sc)
    data = run.inputs.data
    _, whole = reference_forward_backward(data.params, data.tokens, data.targets, sc.model,
                                          sc.run.seed, moe_group=2, moe_chunks=1)
    grads = gathered_grads(run)
    assert max(relative_error(grads[n], whole[n]) for n in grads) > 1e-2


def test_dispatch_shares_a_nic_with_the_data_parallel_reduce_scatter():
    # GPU 0 (node 0) and GPU 8 (node 1), both rail 0: the EP all-to-all sends C each way and
    # the DP ring reduce-scatter S/2 each way through the same two NICs. Alone the all-to-all
    # takes C/ib + 2 IB hops' latency; once the ring's flow starts at t0 (after NCCL's base
    # latency) both share the NIC at ib/2.
    cluster = Cluster(nodes=2, nccl_algo="ring", nccl_proto="Simple")
    cal = LinkCalibration.from_cluster(cluster)
    ib, lat = cluster.ib_bandwidth_GBps * 1e9 * cal.ib_efficiency, 2 * cluster.ib_latency_us * 1e-6
    C, S = 4_000_000, 8_000_000

    def run(with_dp: bool):
        env = simpy.Environment()
        network = Network(env, build_topology(cluster), cal)
        comm = Communicator(env, network)
        ends = {}

        def ep(rank):
            yield from comm.all_to_all((0, 8), rank, None, [0 if r == rank else C
                                                            for r in (0, 8)], "dispatch")
            ends["a2a"] = env.now

        def dp(rank):
            yield from comm.reduce_scatter((0, 8), rank, None, S, "dp_grads")
            ends["rs"] = env.now

        for rank in (0, 8):
            env.process(ep(rank))
            if with_dp:
                env.process(dp(rank))
        env.run()
        return ends, network.transfers

    alone, _ = run(False)
    assert alone["a2a"] == pytest.approx(C / ib + lat, rel=1e-12)
    shared, transfers = run(True)
    t0 = next(t.start_s for t in transfers if t.label.startswith("dp_grads"))
    assert 0 < t0 < C / ib
    drained = t0 + (C - ib * t0) / (ib / 2)  # the all-to-all's last byte leaves
    assert shared["a2a"] == pytest.approx(drained + lat, rel=1e-12)
    ring_left = S / 2 - (ib / 2) * (drained - t0)
    # the ring's one step pays NCCL's step latency, not the links': one rank per node, so the
    # tree's network Simple step, 14 us (tuning.cc hwLatencies)
    assert shared["rs"] == pytest.approx(drained + ring_left / ib + 14e-6, rel=1e-12)


def _zipf_counts(pairs: int, E: int, alpha: float, order, cap: int):
    """Largest remainder of pairs · (i+1)^-α / H over popularity rank i, none above cap."""
    weights = [(i + 1) ** -alpha for i in range(E)]
    raw = [pairs * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in raw]
    for i in sorted(range(E), key=lambda i: -(raw[i] - counts[i]))[:pairs - sum(counts)]:
        counts[i] += 1
    assert max(counts) <= cap  # the test's case needs no spill-over
    by_expert = [0] * E
    for rank, expert in enumerate(order):
        by_expert[expert] = counts[rank]
    return by_expert


def test_zipf_routing_counts_and_capacity():
    spec = K.MoeSpec(num_experts=8, topk=2, capacity_factor=1.25)
    T = 4096
    counts = routed_counts(T, spec, 1.0, 1234, 3)
    order = np.random.default_rng([1234, 3, 7919]).permutation(8)
    assert counts.tolist() == _zipf_counts(T * 2, 8, 1.0, order, T)
    C = math.ceil(T * 2 / 8 * 1.25)
    assert kept_counts(counts, T, spec).tolist() == [min(n, C) for n in counts]
    assert routed_counts(T, spec, 0.0, 1, 1).tolist() == [T * 2 // 8] * 8
    # alpha large: one expert would get every pair, but a token picks it once: T, the rest
    # spills to the next most popular
    assert routed_counts(T, spec, 16.0, 1, 1).max() == T


META = dict(mode="meta", data_parallel_size=8, expert_model_parallel_size=8,
            global_batch_size=8, micro_batch_size=1, num_experts=8, moe_router_topk=2,
            moe_aux_loss_coeff=0.0, hidden_size=256, num_attention_heads=4,
            ffn_hidden_size=512, seq_length=256, nodes=1)


def _meta(**extra):
    overrides = {**META, **extra}
    overrides.pop("nodes")
    sc = scenario(**overrides)
    run = simulate_iteration(sc, Shortcuts.for_scale(sc))
    return run, collect(run, Shortcuts.for_scale(sc))


def test_imbalanced_routing_slows_the_slowest_expert_rank():
    run0, balanced = _meta()
    run1, skewed = _meta(moe_routing_imbalance=1.0, moe_expert_capacity_factor=2.0)
    T, k = 256, 2
    # balanced: every rank's one expert gets T·k/E rows from each of the 8 ranks, per layer
    assert balanced["moe"]["slowest_expert_rows"] == 2 * 8 * T * k // 8
    assert balanced["moe"]["expert_load_imbalance"] == 1.0
    assert balanced["moe"]["dropped_pairs"] == 0
    # skewed: per layer the hottest expert's rank gets min(count, C) from each of 8 sources
    spec = K.MoeSpec(8, 2, capacity_factor=2.0)
    C = math.ceil(T * k / 8 * 2.0)
    rows, dropped = np.zeros(8, dtype=int), 0
    for layer in (0, 1):
        counts = routed_counts(T, spec, 1.0, run1.inputs.sc.run.seed, layer)
        rows += 8 * np.minimum(counts, C)
        dropped += 8 * int(np.maximum(counts - C, 0).sum())  # 8 ranks, 1 micro-batch each
    assert skewed["moe"]["slowest_expert_rows"] == rows.max()
    assert skewed["moe"]["slowest_expert_rank"] == int(rows.argmax())
    assert skewed["moe"]["dropped_pairs"] == dropped
    assert skewed["iteration_time_s"] > balanced["iteration_time_s"]
    # dispatched bytes: each rank sends (EP-1)/EP of its T·k rows of h bf16 values per layer
    sent = balanced["moe"]["dispatched_bytes_per_rank"]["0"]
    assert sent == 2 * (7 * T * k // 8) * 256 * 2


@pytest.mark.parametrize("extra, field", [
    (dict(expert_model_parallel_size=3), "parallel.expert_model_parallel_size"),
    (dict(expert_model_parallel_size=2, num_experts=6, data_parallel_size=1,
          global_batch_size=4), "parallel.expert_model_parallel_size"),
    (dict(moe_routing_imbalance=1.0), "model.moe_routing_imbalance"),
    (dict(moe_token_dispatcher_type="flex"), "parallel.moe_token_dispatcher_type"),
    (dict(expert_tensor_parallel_size=0), "parallel.expert_tensor_parallel_size"),
    (dict(moe_layer_freq="([0]*1+[1]*2)"), "model.moe_layer_freq"),  # 3 layers, not 2
    (dict(moe_layer_freq="([0]*1+[2])"), "model.moe_layer_freq"),
])
def test_bad_expert_layouts_name_their_field(extra, field):
    with pytest.raises(UserError) as caught:
        scenario(**extra)
    assert str(caught.value).startswith(field)


@pytest.mark.parametrize("modules", ["moe", "moe_act", "shared_experts"])
def test_recomputed_moe_modules_keep_less_and_compute_the_same(modules):
    # meta: one layer's kept bytes against the closed form of the tables of simsp/model/blocks/moe/
    # (balanced, dropless: N = T·k rows), less what the module recomputes
    from simsp.training.driver.layer_sim import simulate_layer
    s, b, h, a, E, k, f, fs = 64, 2, 32, 4, 8, 2, 48, 40
    sizes = dict(seq_length=s, micro_batch_size=b, hidden_size=h, num_attention_heads=a,
                 num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=f, hidden_dropout=0.1,
                 attention_dropout=0.1, moe_shared_expert_intermediate_size=fs)
    T, N = s * b, s * b * k
    attention = 15 * s * b * h + 5 * a * s * s * b  # K22, nothing of it recomputed here
    routed = 2 * N * h + 2 * N * f + 2 * N * f + 2 * N * h  # rows, GeLU in/out, expert output
    moe = 2 * T * h + 4 * T * E + T * E + routed + 2 * T * fs + 2 * T * fs + T * h
    recomputed = {"moe": 4 * T * E + T * E + routed + 4 * T * fs, "moe_act": 2 * N * f,
                  "shared_experts": 4 * T * fs}[modules]
    sc = scenario(mode="meta", data_parallel_size=1, global_batch_size=None,
                  expert_model_parallel_size=1, recompute_granularity="selective",
                  recompute_modules=modules, **sizes)
    kept = simulate_layer(sc).records[0].activation_bytes
    assert kept == attention + moe - recomputed
    # numeric: the same gradients as without recompute; GEMMs redone count as recompute FLOPs
    small = dict(recompute_granularity="selective", recompute_modules=modules,
                 moe_shared_expert_intermediate_size=8)
    run = simulate_iteration(scenario(**small))
    assert max(compare_with_reference(run).values()) < 1e-13
    recomputed = run.inputs.world.ranks[0].flops["recompute"]
    assert (recomputed > 0) == (modules != "moe_act")  # act: no GEMM


@pytest.mark.parametrize("imbalance, simulated", [(1.0, 4), (0.0, 2)])
def test_representatives_stand_for_the_others(imbalance, simulated):
    # meta: simulating only the EDP-index-0 expert groups (whole ETP·EP groups; imbalanced
    # routing), or one rank per stage (uniform routing: absent EP members send as it does),
    # gives the iteration time, loads and memory of simulating every rank
    sc = scenario(mode="meta", data_parallel_size=4, expert_model_parallel_size=2,
                  pipeline_model_parallel_size=2, global_batch_size=8, micro_batch_size=1,
                  num_experts=8, moe_routing_imbalance=imbalance, hidden_size=256,
                  num_attention_heads=4, ffn_hidden_size=512, seq_length=256)
    fast = Shortcuts.for_scale(sc)
    assert fast.representative
    full = replace(fast, representative=False, templates=False, methods=as_flows(fast.methods))
    runs = [simulate_iteration(sc, shortcuts) for shortcuts in (fast, full)]
    assert len(runs[0].inputs.world.ranks) == simulated and len(runs[1].inputs.world.ranks) == 8
    metrics = [collect(run, shortcuts) for run, shortcuts in zip(runs, (fast, full))]
    assert metrics[0]["iteration_time_s"] == pytest.approx(metrics[1]["iteration_time_s"],
                                                           rel=1e-12)
    for key in ("slowest_expert_rows", "routed_pairs", "dropped_pairs"):
        assert metrics[0]["moe"][key] == metrics[1]["moe"][key]
    assert [r["peak_bytes"] for r in metrics[0]["ranks"]] == \
        [r["peak_bytes"] for r in metrics[1]["ranks"]]


def test_calibrate_reads_alltoall_perf_and_gives_the_links_back(tmp_path, capsys):
    # an alltoall_perf log (2 nodes x 2 GPUs) whose times are the engine's all-to-all at known
    # inter-node parameters: the fit returns them
    import tomllib
    from simsp.cli import main
    from simsp.engine.collectives.all_to_all import time_all_to_all
    truth = Cluster(nodes=2, ib_efficiency=0.8, ib_latency_us=1.5)
    gpus = [0, 1, 8, 9]
    graph, cal = build_topology(truth), LinkCalibration.from_cluster(truth)
    lines = ["# Collective test starting: alltoall_perf", "# nThread 1 nGpus 1", "#"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on  dgx-{r // 2:02d} device {r % 2:2d} "
              "[0x07] NVIDIA A100-SXM4-80GB" for r in range(4)]
    lines.append("#       size         count      type   redop    root     time   algbw   busbw "
                 "#wrong     time   algbw   busbw #wrong")
    for size in [2 ** k for k in range(10, 29, 2)]:
        t = time_all_to_all(graph, gpus, size, cal)[1] * 1e6
        lines.append(f"{size:12d} {size // 16:12d} {'float':>8s} {'none':>6s} {-1:6d}"
                     + f" {t:9.3f} {size / t / 1e3:7.2f} {0.75 * size / t / 1e3:7.2f} {0:6d}" * 2)
    log = tmp_path / "alltoall.txt"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "links.toml"
    assert main(["calibrate", "nccl-tests", str(log), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "all_to_all" in printed
    fitted = tomllib.loads(out.read_text())["cluster"]
    assert fitted["ib_efficiency"] == pytest.approx(0.8, rel=1e-3)
    assert fitted["ib_latency_us"] == pytest.approx(1.5, rel=1e-2)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_one_layer_with_its_experts_split_over_tp_matches_the_reference(dispatcher):
    # `simsp layer`: one MoE layer on a TP group of 2 with SP, the experts' f over ETP = 2,
    # shared experts, capacity dropping per sequence shard
    from simsp.training.driver.layer_sim import simulate_layer
    sc = scenario(**TP_SP, data_parallel_size=1, global_batch_size=None,
                  expert_model_parallel_size=1, moe_token_dispatcher_type=dispatcher,
                  moe_expert_capacity_factor=0.5, moe_shared_expert_intermediate_size=8)
    assert simulate_layer(sc).max_rel_err < 1e-13


def test_a_loop_of_gemms_costs_each_experts_own_gemm():
    # meta, one layer, E = 8 local experts with Zipf loads: the loop (SequentialMLP) takes
    # Σ_e t(n_e) per expert GEMM where the grouped GEMM takes t(Σ n_e); the rest is identical
    from simsp.hardware.costmodel import kernel_time
    from simsp.hardware.constants import cluster_compute
    from simsp.training.driver.layer_sim import simulate_layer
    s, b, h, E, k, f = 256, 1, 64, 8, 2, 96
    sizes = dict(mode="meta", seq_length=s, micro_batch_size=b, hidden_size=h,
                 num_attention_heads=4, num_experts=E, moe_router_topk=k,
                 moe_ffn_hidden_size=f, moe_routing_imbalance=1.0, data_parallel_size=1,
                 global_batch_size=None, expert_model_parallel_size=1, moe_aux_loss_coeff=0.0)
    times = {}
    for grouped in (False, True):
        sc = scenario(moe_grouped_gemm=grouped, **sizes)
        result = simulate_layer(sc)
        times[grouped] = result.forward_time_s + result.backward_time_s
    cal = cluster_compute(sc.cluster)
    counts = routed_counts(s * b, K.MoeSpec(E, k), 1.0, sc.run.seed, 0)

    def cost(rows, kk, n, passes):
        return kernel_time("gemm", passes * 2 * rows * kk * n, 0, (rows, kk, n), cal)

    shapes = ((h, f, 1), (f, h, 1), (f, h, 2), (h, f, 2))  # fc1, fc2, their backwards
    loop = sum(cost(int(n), kk, nn, p) for kk, nn, p in shapes for n in counts if n)
    grouped = sum(cost(int(counts.sum()), kk, nn, p) for kk, nn, p in shapes)
    assert times[False] - times[True] == pytest.approx(loop - grouped, rel=1e-9)
    assert loop > grouped


def test_megatron_layer_patterns():
    from simsp.scenario.moe_pattern import moe_layer_pattern
    assert moe_layer_pattern("([0]*3+[1]*58)") == (0,) * 3 + (1,) * 58  # DeepSeek-V3
    assert moe_layer_pattern("([1]*3+[0]*1)*3") == (1, 1, 1, 0) * 3
    assert moe_layer_pattern("[1, 0, 1, 0]") == (1, 0, 1, 0)
    sc = scenario(moe_layer_freq="([0]+[1])")
    assert [sc.model.is_moe_layer(i) for i in range(2)] == [False, True]


def test_run_reports_the_expert_load(tmp_path):
    from inprocess import cli
    argv = ["run", "--mode", "meta", "--num-layers", "2", "--num-experts", "8",
            "--disable-bias-linear", "--data-parallel-size", "4", "--global-batch-size", "4",
            "--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "alltoall",
            "--moe-routing-imbalance", "2", "--moe-expert-capacity-factor", "1.0",
            "--out", str(tmp_path / "r")]
    rc, out, err = cli(argv)
    assert rc == 0, err
    assert "## Mixture of experts: expert load" in out and "EP comm exposed" in out
    rc, out, err = cli(["run", "--mode", "numeric"] + argv[3:-2])  # imbalance is meta's model
    assert rc == 2 and err.startswith("error: model.moe_routing_imbalance:")


def test_layer_templates_replay_a_moe_layer_without_expert_parallelism():
    # t = 1, EP = 1, balanced routing: the layer templates record a MoE layer once (its routing
    # counts are kept outside the ledger) and replay it; the time, memory and expert load equal
    # simulating every rank and every layer step (which once crashed on the ledger-less counts)
    sc = scenario(mode="meta", data_parallel_size=2, pipeline_model_parallel_size=2,
                  expert_model_parallel_size=1, global_batch_size=4, micro_batch_size=1,
                  num_experts=4, hidden_size=256,
                  num_attention_heads=4, ffn_hidden_size=512, seq_length=256)
    fast = Shortcuts.for_scale(sc)
    assert fast.templates
    runs = [simulate_iteration(sc, shortcuts) for shortcuts in (fast, Shortcuts())]
    metrics = [collect(run, shortcuts) for run, shortcuts in zip(runs, (fast, Shortcuts()))]
    assert metrics[0]["iteration_time_s"] == pytest.approx(metrics[1]["iteration_time_s"],
                                                           rel=1e-12)
    assert metrics[0]["moe"]["routed_pairs"] == metrics[1]["moe"]["routed_pairs"]
    assert [r["peak_bytes"] for r in metrics[0]["ranks"]] == \
        [r["peak_bytes"] for r in metrics[1]["ranks"]]
