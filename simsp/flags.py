"""Megatron-LM-style flags that override any scenario field, and the argparse plumbing for them."""

import argparse
import sys

from simsp.config import (DTYPE_CHOICES, MODE_CHOICES, RECOMPUTE_METHOD_CHOICES, SCHEDULE_CHOICES,
                          Scenario, load_scenario)
from simsp.errors import UserError

# flag -> (section, key, python type, choices); every flag defaults to "not given".
SCENARIO_FLAGS = {
    "--num-layers": ("model", "num_layers", int, None),
    "--hidden-size": ("model", "hidden_size", int, None),
    "--num-attention-heads": ("model", "num_attention_heads", int, None),
    "--seq-length": ("model", "seq_length", int, None),
    "--vocab-size": ("model", "vocab_size", int, None),
    "--make-vocab-size-divisible-by": ("model", "make_vocab_size_divisible_by", int, None),
    "--ffn-hidden-size": ("model", "ffn_hidden_size", int, None),
    "--hidden-dropout": ("model", "hidden_dropout", float, None),
    "--attention-dropout": ("model", "attention_dropout", float, None),
    "--micro-batch-size": ("parallel", "micro_batch_size", int, None),
    "--global-batch-size": ("parallel", "global_batch_size", int, None),
    "--tensor-model-parallel-size": ("parallel", "tensor_model_parallel_size", int, None),
    "--pipeline-model-parallel-size": ("parallel", "pipeline_model_parallel_size", int, None),
    "--data-parallel-size": ("parallel", "data_parallel_size", int, None),
    "--num-layers-per-virtual-pipeline-stage":
        ("parallel", "num_layers_per_virtual_pipeline_stage", int, None),
    "--schedule": ("parallel", "schedule", str, SCHEDULE_CHOICES),
    "--ddp-bucket-size": ("parallel", "ddp_bucket_size", int, None),
    "--recompute-method": ("parallel", "recompute_method", str, RECOMPUTE_METHOD_CHOICES),
    "--recompute-num-layers": ("parallel", "recompute_num_layers", int, None),
    "--nodes": ("cluster", "nodes", int, None),
    "--gpus-per-node": ("cluster", "gpus_per_node", int, None),
    "--mode": ("run", "mode", str, MODE_CHOICES),
    "--seed": ("run", "seed", int, None),
    "--numeric-dtype": ("run", "numeric_dtype", str, DTYPE_CHOICES),
}
SWITCHES = {  # flag -> (section, key, value)
    "--sequence-parallel": ("parallel", "sequence_parallel", True),
    "--no-sequence-parallel": ("parallel", "sequence_parallel", False),
    "--distributed-optimizer": ("parallel", "distributed_optimizer", True),
    "--overlap-p2p-communication": ("parallel", "overlap_p2p_communication", True),
    "--no-scatter-gather-tensors-in-pipeline":
        ("parallel", "scatter_gather_tensors_in_pipeline", False),
    "--overlap-grad-reduce": ("parallel", "overlap_grad_reduce", True),
    "--overlap-param-gather": ("parallel", "overlap_param_gather", True),
    "--accumulate-allreduce-grads-in-fp32": ("parallel", "accumulate_allreduce_grads_in_fp32", True),
    "--no-accumulate-allreduce-grads-in-fp32":
        ("parallel", "accumulate_allreduce_grads_in_fp32", False),
}


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one `error:` line and exit status 2, without the usage."""

    def error(self, message):
        sys.stderr.write(f"error: {message}\n")
        sys.exit(2)


def _dest(flag: str) -> str:
    return "scn_" + flag.lstrip("-").replace("-", "_")


def add_scenario_arguments(parser: argparse.ArgumentParser, positional: bool = True) -> None:
    """Add the optional scenario file and every Megatron-style override flag."""
    if positional:
        parser.add_argument("scenario", nargs="?", help="scenario TOML file (default: built-in)")
    group = parser.add_argument_group("scenario overrides (Megatron-LM flags)")
    for flag, (section, key, kind, choices) in SCENARIO_FLAGS.items():
        group.add_argument(flag, dest=_dest(flag), type=kind, choices=choices, default=None,
                           help=f"{section}.{key}")
    for flag, (section, key, _) in SWITCHES.items():
        group.add_argument(flag, dest=_dest(flag), action="store_true", help=f"{section}.{key}")
    group.add_argument("--recompute-granularity", dest="scn_recompute", default=None,
                       choices=("full", "selective"), help="parallel.recompute_granularity "
                       "(absent: none)")


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The {(section, key): value} overrides the user gave on the command line."""
    found = {}
    for flag, (section, key, _, _) in SCENARIO_FLAGS.items():
        value = getattr(args, _dest(flag), None)
        if value is not None:
            found[(section, key)] = value
    for flag, (section, key, value) in SWITCHES.items():
        if getattr(args, _dest(flag), False):
            found[(section, key)] = value
    if args.scn_recompute is not None:
        found[("parallel", "recompute_granularity")] = args.scn_recompute
    if getattr(args, _dest("--sequence-parallel")) and getattr(args, _dest("--no-sequence-parallel")):
        raise UserError("--sequence-parallel", "conflicts with --no-sequence-parallel")
    return found


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """Load the scenario file (if any) and apply the command-line overrides."""
    return load_scenario(getattr(args, "scenario", None), overrides_from_args(args))
