"""Checks of context parallelism: the sequence and head splits, the hierarchical (a2a+p2p)
sizes, and the features that run without CP yet (Megatron-LM arguments.py, megatron/core/utils.py;
Transformer Engine's attention; docs/context-parallel.md)."""

import math
import re

from simsp.scenario.checks.rule import check
from simsp.scenario.config import Model, Parallel


def without_context_parallel(m: Model, p: Parallel) -> None:
    """Multi-latent attention and multi-token prediction run with cp 1 only."""
    check(not m.multi_latent_attention or p.cp == 1, "parallel.context_parallel_size",
          "multi-latent attention runs without context parallelism yet")
    check(m.mtp_num_layers is None or p.cp == 1, "parallel.context_parallel_size",
          "multi-token prediction runs without context parallelism yet")


def context_parallel(m: Model, p: Parallel) -> None:
    """CP's shape rules: Megatron-LM's get_batch_on_this_cp_rank (megatron/core/utils.py) views
    the sequence as 2*cp chunks; SP then splits each rank's s/cp tokens over t; TE's a2a
    (AttnFuncWithCPAndQKVOA2A) splits each TP rank's heads over cp. Checked when CP is asked
    for: cp > 1, a CP communication type or hierarchical sizes given."""
    if p.cp == 1 and p.cp_comm_type == Parallel.cp_comm_type and \
            p.hierarchical_context_parallel_sizes is None:
        return
    hierarchical_sizes(m, p)
    if p.cp == 1:
        return
    c = p.cp
    check(m.seq_length % (2 * c) == 0, "parallel.context_parallel_size",
          f"seq_length={m.seq_length} is not divisible by 2*context_parallel_size={2 * c} "
          "(the causal load-balancing split)")
    if p.sequence_parallel:
        check((m.seq_length // c) % p.tp == 0, "parallel.sequence_parallel",
              f"seq_length/context_parallel_size={m.seq_length // c} is not divisible by "
              f"tensor_model_parallel_size={p.tp}")
    if p.cp_comm_type == "a2a":
        heads = m.num_attention_heads // p.tp
        check(heads % c == 0 and (m.query_groups // p.tp) % c == 0, "parallel.cp_comm_type",
              f"a2a splits each TP rank's {heads} query and {m.query_groups // p.tp} KV heads "
              f"over context_parallel_size={c}; they are not divisible")
    check(m.flash, "parallel.context_parallel_size",
          "needs FlashAttention (--use-flash-attn): Megatron-LM runs context parallelism "
          "only in Transformer Engine's attention")


def hierarchical_sizes(m: Model, p: Parallel) -> None:
    """Megatron-LM's checks (megatron/training/arguments.py): the hierarchical sizes multiply to
    cp, and a2a+p2p needs them; Transformer Engine's AttnFuncWithCPAndKVP2P takes two levels
    (the a2a group, then the p2p group) and splits each TP rank's heads over the a2a size."""
    name, text = "parallel.hierarchical_context_parallel_sizes", \
        p.hierarchical_context_parallel_sizes
    if text is None:
        check(p.cp_comm_type != "a2a+p2p", name, "must be set when cp_comm_type is a2a+p2p "
              "(--hierarchical-context-parallel-sizes A P, A·P = context_parallel_size)")
        return
    words = text.split()
    check(bool(words) and all(re.fullmatch(r"[0-9]+", w) and int(w) > 0 for w in words), name,
          f"must be positive integers, got {text!r}")
    sizes = p.hcp_sizes
    check(math.prod(sizes) == p.cp, name, f"{' x '.join(words)} = {math.prod(sizes)} is not "
          f"context_parallel_size={p.cp}")
    if p.cp_comm_type != "a2a+p2p":
        return
    check(len(sizes) == 2, name, f"a2a+p2p takes two sizes (a2a, p2p), got {len(sizes)}")
    heads, groups = m.num_attention_heads // p.tp, m.query_groups // p.tp
    check(heads % sizes[0] == 0 and groups % sizes[0] == 0, name,
          f"a2a+p2p splits each TP rank's {heads} query and {groups} KV heads over the a2a "
          f"size {sizes[0]}; they are not divisible")
