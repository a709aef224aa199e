"""Checks of the parallel layout's divisibility: what tensor parallelism splits (heads, MLP, KV
groups, the padded vocabulary), sequence parallelism and the global batch (Megatron-LM
arguments.py; K22 §4)."""

from simsp.hardware.profiles import gpu_profile
from simsp.scenario.checks.rule import check
from simsp.scenario.config import Model, Parallel, padded_vocab_size
from simsp.scenario.tp_overlap import DGRAD_RS_GEMMS, PIPELINE, is_dgrad_rs, ub_gemms


def tensor_parallel(m: Model, p: Parallel) -> None:
    """Every tensor-parallel rank holds whole heads, KV groups, MLP columns and vocabulary rows."""
    t = p.tp
    check(m.num_attention_heads % t == 0, "parallel.tensor_model_parallel_size",
          f"num_attention_heads={m.num_attention_heads} is not divisible by {t}")
    check(m.ffn % t == 0, "parallel.tensor_model_parallel_size",
          f"ffn_hidden_size={m.ffn} is not divisible by {t}")
    check(m.query_groups % t == 0, "parallel.tensor_model_parallel_size",
          f"num_query_groups={m.query_groups} is not divisible by {t} (Megatron: each TP "
          "rank holds whole KV groups)")
    padded = padded_vocab_size(m, t)
    check(padded % t == 0, "parallel.tensor_model_parallel_size",
          f"padded vocab_size={padded} is not divisible by {t} (the vocabulary is split over TP)")


def sequence_parallel(m: Model, p: Parallel) -> None:
    """SP splits the sequence over the TP ranks (K22 §4.2.2)."""
    if not p.sequence_parallel:
        return
    t = p.tp
    check(t > 1, "parallel.sequence_parallel", "needs tensor_model_parallel_size > 1")
    check(m.seq_length % t == 0, "parallel.sequence_parallel",
          f"seq_length={m.seq_length} is not divisible by tensor_model_parallel_size={t}")


def global_batch(p: Parallel) -> None:
    """B splits into whole micro-batches on every data-parallel replica."""
    check(p.global_batch % (p.micro_batch_size * p.dp) == 0, "parallel.global_batch_size",
          f"{p.global_batch} is not divisible by micro_batch_size*data_parallel_size="
          f"{p.micro_batch_size * p.dp}")


def tp_comm_overlap(s) -> None:
    """Transformer Engine's TP overlap needs SP (Megatron-LM arguments.py: "Tensor parallel
    communication/GEMM overlap can happen only when sequence parallelism is enabled"), the GPU's
    SM count, a readable per-GEMM file, and hidden columns that split evenly into each
    pipelined GEMM's chunks (docs/tp-overlap.md)."""
    p = s.parallel
    if not p.tp_comm_overlap:
        check(p.tp_comm_overlap_cfg is None, "parallel.tp_comm_overlap_cfg",
              "needs tp_comm_overlap (--tp-comm-overlap)")
        check(not p.tp_comm_overlap_rs_dgrad, "parallel.tp_comm_overlap_rs_dgrad",
              "needs tp_comm_overlap (--tp-comm-overlap)")
        return
    check(p.sequence_parallel, "parallel.tp_comm_overlap",
          "needs sequence_parallel (TE overlaps SP's all-gathers and reduce-scatters)")
    gpu = gpu_profile(s.cluster.gpu)
    check("sm_count" in gpu.attention, "parallel.tp_comm_overlap",
          f"{gpu.name}'s profile gives no sm_count ([attention] section)")
    dgrad_reduce_scatter(p)
    for gemm in ub_gemms(p.tp, p.tp_comm_overlap_cfg).values():
        if gemm.method == PIPELINE:
            check(s.model.hidden_size % gemm.num_splits == 0, "parallel.tp_comm_overlap_cfg",
                  f"{gemm.name}: hidden_size={s.model.hidden_size} does not split into "
                  f"num_splits={gemm.num_splits} column chunks")
        taken = gemm.num_sm if gemm.set_sm_margin else gemm.comm_sms
        check(taken < gpu.attention["sm_count"], "parallel.tp_comm_overlap_cfg",
              f"{gemm.name}: num_sm={gemm.num_sm} leaves the GEMM no SM of "
              f"{int(gpu.attention['sm_count'])}")


def dgrad_reduce_scatter(p) -> None:
    """TE runs the dgrad reduce-scatter overlap when Megatron passes ub_overlap_rs_dgrad
    (--tp-comm-overlap-rs-dgrad) to every qkv and fc1 layer, through the buffer initialize_ub
    built for the file's method: pipeline or ring_exchange (a bulk buffer in that code path,
    or a reduce-scatter buffer under the bulk code path, is not what TE builds it for;
    docs/tp-overlap.md)."""
    for name in DGRAD_RS_GEMMS:
        moved = is_dgrad_rs(ub_gemms(p.tp, p.tp_comm_overlap_cfg)[name])
        if p.tp_comm_overlap_rs_dgrad:
            check(moved, "parallel.tp_comm_overlap_cfg", f"{name}: tp_comm_overlap_rs_dgrad "
                  "needs method pipeline or ring_exchange here, not bulk")
        else:
            check(not moved, "parallel.tp_comm_overlap_cfg", f"{name}: a reduce-scatter "
                  "method needs tp_comm_overlap_rs_dgrad (--tp-comm-overlap-rs-dgrad)")
