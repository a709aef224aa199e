"""The runs benchmarks/estimate_constants.py measures, per group of the work estimate's constants
(simsp/scenario/work_constants.py): each group's constants and the runs that isolate their term,
built from benchmarks/scale.py's layout families and benchmarks/work_estimate.py's layouts."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import (_a2a, _cp_128k, _cp_128k_dp, _deepseek, _fsdp2, _gpt3,  # noqa: E402
                   _gpt3_tp_overlap, _llama405_fsdp, _mtp)

TINY = ["scenarios/tiny.toml"]


def _w175(layers: int, pp: int, dp: int, batch: int, chunk: int | None = None,
          tp: int = 8) -> list[str]:
    """GPT-3 175B width (t 8 unless given, SP, selective recompute; interleaved in chunks of
    `chunk` layers where given, on whole nodes of 8 GPUs), benchmarks/work_estimate.py's layouts: scenario fields as JSON (the CLI keeps
    paper-175b's chunks)."""
    fields = {"model.num_layers": layers, "model.hidden_size": 12288,
              "model.num_attention_heads": 96, "model.seq_length": 2048,
              "model.vocab_size": 51200, "parallel.tensor_model_parallel_size": tp,
              "parallel.pipeline_model_parallel_size": pp,
              "parallel.data_parallel_size": dp, "parallel.sequence_parallel": True,
              "parallel.recompute_granularity": "selective",
              "parallel.global_batch_size": batch, "cluster.nodes": max(1, tp * pp * dp // 8)}
    if chunk is not None:
        fields["parallel.num_layers_per_virtual_pipeline_stage"] = chunk
    return [json.dumps(fields)]


def _tiny(layers: int, tp: int, pp: int, dp: int, nodes: int, *extra: str) -> list[str]:
    """tests/test_work_estimate.py's TINY shape (h 64) in meta mode, one micro-batch per replica."""
    return [*TINY, "--num-layers", str(layers), "--num-attention-heads", str(max(4, tp)),
            "--seq-length", str(max(32, tp)), "--no-sequence-parallel",
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--data-parallel-size", str(dp), "--micro-batch-size", "1",
            "--global-batch-size", str(dp), "--nodes", str(nodes), *extra]


def _cp(cp: int, dp: int, kind: str, tp: int = 1) -> list[str]:
    """A 2-layer Llama 3 8B shape, s 4096, CP over cp ranks with `kind` (p2p, a2a), d replicas."""
    return ["scenarios/llama3-8b.toml", "--num-layers", "2", "--seq-length", "4096",
            "--tensor-model-parallel-size", str(tp), "--no-sequence-parallel",
            "--context-parallel-size", str(cp), "--cp-comm-type", kind,
            "--data-parallel-size", str(dp), "--global-batch-size", str(dp),
            "--world-size", str(tp * cp * dp)]


def _moe(ep: int, dispatcher: str) -> list[str]:
    """scale.py's 2-layer MoE at EP = d = ep with routing imbalance, so its all-to-alls step."""
    argv = _a2a(ep)
    argv[argv.index("--moe-token-dispatcher-type") + 1] = dispatcher
    return [*argv, "--moe-routing-imbalance", "0.5"]


def _visits(batch: int) -> list[str]:
    """benchmarks/work_estimate.py --visits: DeepSeek-V3 scaled down (13 layers, p 4, DualPipe,
    d = EP 64) under the quotient by rail symmetry."""
    return ["scenarios/deepseek-v3.toml", "--num-layers", "13", "--moe-layer-freq",
            "([0]*1+[1]*12)", "--pipeline-model-parallel-size", "4", "--schedule", "dualpipe",
            "--global-batch-size", str(batch), "--nodes", "32"]


def _fsdp2_t2(gpus: int) -> list[str]:
    """scale.py's fsdp2-d64 at t 2: its FSDP rings cannot run as one node's pieces."""
    argv = _fsdp2(gpus)
    argv[argv.index("--tensor-model-parallel-size") + 1] = "2"
    argv[argv.index("--world-size") + 1] = str(2 * gpus)
    return argv


# group -> (constants it measures, runs: (label, simsp run arguments, how: "run" run_seconds
# under Shortcuts.for_scale, "rule" meta_seconds without the counts (run's first check, sweep's
# cheapest price), "full" the rule under Shortcuts(), "check" the shortcut check alone, "visits"
# the CPU inside Network._reschedule against the visits the solves made (the estimate counts
# them, work_counts.py ep_visits, within 2.6x: docs/PERFORMANCE.md), "numeric" numeric_seconds, "bytes"
# peak RSS with run's default trace against meta_bytes, "full-bytes" the same under Shortcuts(),
# "span-bytes", "merged-span-bytes", "record-bytes" the bytes a run at --trace full frees when its
# detail spans, merged spans or DP ring records are dropped, per record (estimate_constants.py
# KEPT); spans and records under Shortcuts(), merged spans under the verdict's templates))
GROUPS = {
    "start": (("RUN_START_SECONDS",), [
        ("tiny L2 meta", _tiny(2, 2, 1, 1, 1), "run"),
        ("llama3-8b L2 8 GPUs", ["scenarios/llama3-8b.toml", "--num-layers", "2",
                                 "--global-batch-size", "4", "--world-size", "8"], "run")]),
    "layer-step": (("META_SECONDS_PER_LAYER_STEP", "META_SECONDS_PER_LAYER_STEP_PER_REPLICA",
                    "META_SECONDS_PER_CHUNK_STEP"), [
        ("175B width L48 m4", _w175(48, 1, 1, 4), "run"),
        ("175B width L96 p8 m64", _w175(96, 8, 1, 64), "run"),
        ("175B width L96 p8 m64 chunks of 4", _w175(96, 8, 1, 64, 4), "run"),
        ("175B width L96 p8 m64 chunks of 1", _w175(96, 8, 1, 64, 1), "run"),
        ("175B width L96 p8 m64 d4", _w175(96, 8, 4, 256), "run"),
        ("175B width L32 p4 m128 d64", _w175(32, 4, 64, 8192), "run")]),
    "full": (("FULL_SECONDS_PER_RANK_STEP", "FULL_SECONDS_PER_RING_RANK"), [
        ("tiny L2 t8 no shortcuts", _tiny(2, 8, 1, 1, 1), "full"),
        ("tiny L2 t16 no shortcuts", _tiny(2, 16, 1, 1, 2), "full"),
        ("tiny L2 t64 no shortcuts", _tiny(2, 64, 1, 1, 8), "full")]),
    "plan": (("PLAN_SECONDS_PER_RANK_LAYER",), [
        ("tiny L = p = 256", _tiny(256, 1, 256, 1, 32), "run"),
        ("tiny L = p = 512", _tiny(512, 1, 512, 1, 64), "run")]),
    "buckets": (("SECONDS_PER_BUCKET",), [
        ("22B d16 one-tensor buckets", ["scenarios/paper-22b.toml", "--data-parallel-size", "16",
         "--global-batch-size", "16", "--micro-batch-size", "1", "--ddp-bucket-size", "1",
         "--overlap-grad-reduce", "--nodes", "16"], "run"),
        ("22B d4 one-tensor buckets", ["scenarios/paper-22b.toml", "--data-parallel-size", "4",
         "--global-batch-size", "4", "--micro-batch-size", "1", "--ddp-bucket-size", "1",
         "--overlap-grad-reduce", "--nodes", "4"], "run")]),
    "fsdp-rule": (("FSDP_SECONDS_PER_COLLECTIVE_D2", "FSDP_SECONDS_PER_COLLECTIVE_PIECE"), [
        ("fsdp2-d64 d16 t2", _fsdp2_t2(16), "rule"),
        ("fsdp2-d64 d32 t2", _fsdp2_t2(32), "rule"),
        ("fsdp2-d64 d16", _fsdp2(16), "rule"),
        ("fsdp2-d64 d32", _fsdp2(32), "rule"),
        ("fsdp2-d64 d64", _fsdp2(64), "rule")]),
    "fsdp-flows": (("FSDP_SECONDS_PER_FLOW", "PIECE_SECONDS_PER_FLOW", "TRAIN_SECONDS_PER_STEP",
                    "TRAIN_SECONDS_PER_COLLECTIVE"), [
        ("fsdp2-d64 d16 t2", _fsdp2_t2(16), "run"),
        ("fsdp2-d64 d32 t2", _fsdp2_t2(32), "run"),
        ("fsdp2-d64 d16", _fsdp2(16), "run"),
        ("fsdp2-d64 d64", _fsdp2(64), "run"),
        ("llama3.1-405b-fsdp 2048", _llama405_fsdp(2048), "run"),
        ("llama3.1-405b-fsdp 4096", _llama405_fsdp(4096), "run")]),
    "cp-pairs": (("CP_SECONDS_PER_RANK_PAIR",), [
        ("cp 32 p2p d2", _cp(32, 2, "p2p"), "run"),
        ("cp 64 p2p d2", _cp(64, 2, "p2p"), "run"),
        ("cp 8 a2a d4", _cp(8, 4, "a2a"), "run")]),
    # layer templates split at the CP calls (model/replay.py SplitTemplate) in these runs,
    # every CP rank its own program (d = 2: no CP shadows); fitted (q46b) on the d = 1 runs of
    # cp-shadows below, before the shadows ran them
    "cp-lone": (("CP_TEMPLATE_SECONDS_PER_RANK_STEP", "CP_PASS_SECONDS_PER_RANK_PAIR"), [
        ("cp 16 p2p d2", _cp(16, 2, "p2p"), "run"),
        ("cp 64 p2p d2", _cp(64, 2, "p2p"), "run"),
        ("cp-128k-dp 1024", _cp_128k_dp(1024), "run")]),
    # a CP group run as one program (training/context_parallel/shadows.py): d = 1
    "cp-shadows": (("CP_SHADOW_SECONDS_PER_LEADER_STEP", "CP_SHADOW_SECONDS_PER_RANK_STEP",
                    "CP_SHADOW_SECONDS_PER_RANK_PAIR", "CP_CHECK_SECONDS_PER_MEMBER"), [
        ("cp 16 p2p", _cp(16, 1, "p2p"), "run"),
        ("cp 64 p2p", _cp(64, 1, "p2p"), "run"),
        ("cp-128k 256", _cp_128k(256), "run"),
        ("cp-128k 512", _cp_128k(512), "run"),
        ("cp-128k 1024", _cp_128k(1024), "run"),
        ("cp-128k-dp 2048", _cp_128k_dp(2048), "run"),
        ("cp-128k-dp 8192", _cp_128k_dp(8192), "run"),
        ("cp-128k-dp 16384", _cp_128k_dp(16384), "run")]),
    # SMs shared: ring_pass.py and the split templates are off
    "cp-lone-shared": (("CP_SECONDS_PER_RANK_STEP", "CP_LONE_SECONDS_PER_RANK_PAIR"), [
        ("cp 16 p2p, SM contention", _cp(16, 1, "p2p") + ["--sm-contention"], "run"),
        ("cp 64 p2p, SM contention", _cp(64, 1, "p2p") + ["--sm-contention"], "run")]),
    "flows": (("SECONDS_PER_FLOW",), [
        ("gpt3-175b-h100 128", _gpt3(128), "run"),
        ("gpt3-175b-h100 256", _gpt3(256), "run")]),
    "exchange": (("EXCHANGE_SECONDS_PER_FLOW",), [
        ("gpt3-175b-h100-tpo 128", _gpt3_tp_overlap(128), "run")]),
    "ep-pairs": (("EP_SECONDS_PER_RANK_PAIR[alltoall]", "EP_SECONDS_PER_RANK_PAIR_SQUARED"), [
        ("a2a imbalanced ep 32", _moe(32, "alltoall"), "rule"),
        ("a2a imbalanced ep 64", _moe(64, "alltoall"), "rule"),
        ("a2a imbalanced ep 128", _moe(128, "alltoall"), "rule"),
        ("a2a imbalanced ep 256", _moe(256, "alltoall"), "rule")]),
    "ep-allgather": (("EP_SECONDS_PER_RANK_PAIR[allgather]",), [
        ("allgather ep 32", _moe(32, "allgather"), "rule"),
        ("allgather ep 64", _moe(64, "allgather"), "rule")]),
    "a2a-alone": (("A2A_ALONE_SECONDS_PER_FLOW", "CHECK_SECONDS_PER_MEMBER"), [
        ("a2a-dispatch 64", _a2a(64), "run"),
        ("a2a-dispatch 128", _a2a(128), "run"),
        ("deepseek-v3 1024", _deepseek(1024), "run"),
        ("deepseek-v3 4096", _deepseek(4096), "run")]),
    "visits": (("SECONDS_PER_FLOW_VISIT",), [
        ("deepseek-v3 L13 p4 dualpipe m8, solves", _visits(512), "visits"),
        ("deepseek-v3 L13 p4 dualpipe m16, solves", _visits(1024), "visits")]),
    "gather": (("SECONDS_PER_GATHER_FLOW",), [
        ("deepseek-v3 L13 p4 dualpipe m8", _visits(512), "run"),
        ("deepseek-v3 L13 p4 dualpipe m16", _visits(1024), "run")]),
    "mtp": (("MTP_SECONDS_PER_DEPTH_STEP",), [
        ("mtp-deep 256", _mtp(256), "run"),
        ("mtp-deep 1024", _mtp(1024), "run")]),
    "symmetry": (("SYMMETRY_SECONDS_PER_RANK",), [
        ("gpt3-175b-h100 4096, the check", _gpt3(4096), "check"),
        ("gpt3-175b-h100 16384, the check", _gpt3(16384), "check")]),
    "numeric": (("NUMERIC_SECONDS_PER_LAYER_STEP", "NUMERIC_FLOPS_PER_SECOND"), [
        ("tiny numeric", ["scenarios/tiny.toml"], "numeric"),
        ("tiny numeric h 256", ["scenarios/tiny.toml", "--hidden-size", "256"], "numeric"),
        ("tiny numeric h 128", ["scenarios/tiny.toml", "--hidden-size", "128"], "numeric")]),
    "bytes": (("META_BYTES_PER_LAYER_STEP", "PLAN_BYTES_PER_RANK_LAYER"), [
        ("paper-1t, peak RSS", ["scenarios/paper-1t.toml"], "bytes"),
        ("tiny L = p = 512, peak RSS", _tiny(512, 1, 512, 1, 64), "bytes")]),
    "full-bytes": (("FULL_BYTES_PER_RANK_STEP", "FULL_BYTES_PER_RING_STEP",
                    "FULL_BYTES_PER_RANK_LAYER", "FULL_BYTES_PER_RANK"), [
        ("175B width L8 t8 m4, full", _w175(8, 1, 1, 4), "full-bytes"),
        ("175B width L16 t8 m8, full", _w175(16, 1, 1, 8), "full-bytes"),
        ("175B width L16 t4 p2 d2 m8, full", _w175(16, 2, 2, 16, tp=4), "full-bytes"),
        ("175B width L32 t8 p4 d2 m8, full", _w175(32, 4, 2, 16), "full-bytes"),
        ("175B width L8 t2 d8 m4, full", _w175(8, 1, 8, 32, tp=2), "full-bytes"),
        ("175B width L8 t8 p8 m8, full", _w175(8, 8, 1, 8), "full-bytes")]),
    "span-bytes": (("BYTES_PER_SPAN",), [
        ("tiny L8, full trace", [*TINY, "--num-layers", "8"], "span-bytes"),
        ("llama3-8b L2 t2, full trace", ["scenarios/llama3-8b.toml", "--num-layers", "2",
                                         "--tensor-model-parallel-size", "2",
                                         "--global-batch-size", "4", "--world-size", "2"],
         "span-bytes")]),
    "merged-span-bytes": (("BYTES_PER_MERGED_SPAN",), [
        ("paper-175b m16, templated, full trace",
         ["scenarios/paper-175b.toml", "--global-batch-size", "16"], "merged-span-bytes")]),
    "record-bytes": (("BYTES_PER_TRANSFER_RECORD",), [
        ("tiny t1 p2 d8 on 2 nodes, DP rings", _tiny(4, 1, 2, 8, 2), "record-bytes"),
        ("tiny t1 d32 on 4 nodes, distributed optimizer, DP rings",
         _tiny(4, 1, 1, 32, 4, "--use-distributed-optimizer"), "record-bytes")]),
}
