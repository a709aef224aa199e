"""The attention layer of `simsp ring --collective ring_attention`, read from Megatron-LM's flags
(defaults: Llama 3 70B) and checked."""

from simsp.errors import UserError
from simsp.scenario.limits import check_field

# flag -> (argparse dest, default: Llama 3 70B's attention, meaning)
ATTENTION_FLAGS = {
    "--seq-length": ("seq_length", 8192, "tokens in the sequence the CP ranks share"),
    "--num-attention-heads": ("num_attention_heads", 64, "query heads of the layer"),
    "--num-query-groups": ("num_query_groups", 8, "K/V heads (group-query attention)"),
    "--kv-channels": ("kv_channels", 128, "head dimension"),
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", 8,
                                     "TP ranks sharing the heads"),
    "--micro-batch-size": ("micro_batch_size", 1, "sequences per micro-batch")}


def add_attention_flags(parser) -> None:
    """The attention whose K/V the ring carries, by Megatron-LM's flags."""
    group = parser.add_argument_group("--collective ring_attention (Megatron-LM's flags; "
                                      "defaults: Llama 3 70B)")
    for flag, (dest, default, meaning) in ATTENTION_FLAGS.items():
        group.add_argument(flag, dest=dest, type=int, default=None,
                           help=f"{meaning} (default {default})")


def refuse_attention_flags(args) -> None:
    """The attention flags describe ring_attention only."""
    for flag, (dest, _default, _meaning) in ATTENTION_FLAGS.items():
        if getattr(args, dest) is not None:
            raise UserError(flag, "describes --collective ring_attention only")


def attention_shape(args):
    """One TP rank's attention (report/lessons/ring_attention.py AttentionShape) from the
    flags (defaults filled), checked."""
    from simsp.report.lessons.ring_attention import AttentionShape
    value = {dest: default if getattr(args, dest) is None else getattr(args, dest)
             for dest, default, _meaning in ATTENTION_FLAGS.values()}
    for flag, (dest, _default, _meaning) in ATTENTION_FLAGS.items():
        if value[dest] < 1:
            raise UserError(flag, f"must be positive, got {value[dest]}")
        section = "parallel" if dest in ("tensor_model_parallel_size", "micro_batch_size") \
            else "model"
        try:  # the range table run uses (a 10**12-token sequence printed 10**50-byte blocks)
            check_field(f"{section}.{dest}", value[dest])
        except UserError as exc:
            raise UserError(flag, exc.reason) from None
    t, chunks = value["tensor_model_parallel_size"], 2 * args.ranks
    if value["seq_length"] % chunks:
        raise UserError("--seq-length", f"{value['seq_length']} tokens do not cut into "
                                        f"2 x cp = {chunks} equal chunks")
    for flag, dest in (("--num-attention-heads", "num_attention_heads"),
                       ("--num-query-groups", "num_query_groups")):
        if value[dest] % t:
            raise UserError(flag, f"{value[dest]} heads do not split over "
                                  f"--tensor-model-parallel-size {t}")
    if value["num_attention_heads"] % value["num_query_groups"]:
        raise UserError("--num-query-groups", "must divide --num-attention-heads")
    return AttentionShape(value["seq_length"], value["num_attention_heads"] // t,
                          value["num_query_groups"] // t, value["kv_channels"],
                          value["micro_batch_size"])
