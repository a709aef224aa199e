"""Megatron-LM-style flags that override any scenario field, and the argparse plumbing for them.

The command line is a contract: no abbreviations, a flag given twice is an error, an empty
argument is an error, and every flag's --help gives its meaning, unit and default.
"""

import argparse
from dataclasses import fields
from pathlib import Path
import sys
from typing import NamedTuple

from simsp.scenario.config import (ATTENTION_BACKEND_CHOICES, CP_COMM_TYPE_CHOICES, DTYPE_CHOICES, MODE_CHOICES,
                          NCCL_ALGO_CHOICES, NCCL_PROTO_CHOICES, NORMALIZATION_CHOICES,
                          MOE_BALANCING_CHOICES, MOE_DISPATCHER_CHOICES, MOE_SCORE_CHOICES,
                          POSITION_EMBEDDING_CHOICES, RECOMPUTE_CHOICES,
                          RECOMPUTE_METHOD_CHOICES, SCHEDULE_CHOICES, SECTIONS, Scenario,
                          load_scenario)
from simsp.scenario.config import FSDP_STRATEGY_CHOICES
from simsp.scenario.config import (EXP_AVG_DTYPE_CHOICES, FP8_FORMAT_CHOICES, FP8_RECIPE_CHOICES,
                          MAIN_GRADS_DTYPE_CHOICES, MAIN_PARAMS_DTYPE_CHOICES)
from simsp.errors import UserError, one_line


class Flag(NamedTuple):
    """One row of the flag table. `help` is the meaning and unit (the default is appended from
    the dataclass unless it is None, then say it in `help`); `token` names the override in the
    default report folder (t4, rc-full; '' for a string value alone: 'meta'; None: not named)."""

    section: str
    key: str
    kind: type
    choices: tuple | None = None
    help: str = ""
    token: str | None = ""


# The one table of scenario flags: every field of every scenario section (simsp/scenario/config.py) has
# a row here or in SWITCHES, and `run`, `layer`, `sweep` and `search` all build their flags,
# help and defaults from these rows (tests/test_field_table.py). A new field: add its row.
# flag -> Flag(section, key, type, choices, help, token); every flag defaults to "not given".
# A plain 4-tuple row (section, key, type, choices) also works.
SCENARIO_FLAGS = {
    "--num-layers": ("model", "num_layers", int, None, "transformer layers L", "L"),
    "--hidden-size": ("model", "hidden_size", int, None, "hidden size h (elements)", "h"),
    "--num-attention-heads": ("model", "num_attention_heads", int, None, "attention heads a",
                              "a"),
    "--seq-length": ("model", "seq_length", int, None, "sequence length s (tokens)", "s"),
    "--vocab-size": ("model", "vocab_size", int, None, "vocabulary size v (tokens)", "v"),
    "--make-vocab-size-divisible-by": ("model", "make_vocab_size_divisible_by", int, None,
                                       "pad the vocabulary to a multiple of this x t (tokens)",
                                       "vdiv"),
    "--ffn-hidden-size": ("model", "ffn_hidden_size", int, None,
                          "MLP width (elements; default 4 x hidden size)", "ffn"),
    "--hidden-dropout": ("model", "hidden_dropout", float, None,
                         "dropout probability after attention and MLP, in [0, 1)", "hd"),
    "--attention-dropout": ("model", "attention_dropout", float, None,
                            "dropout probability of the attention scores, in [0, 1)", "ad"),
    # Llama-class layers (Megatron-LM arguments.py; docs/llama.md)
    "--num-query-groups": ("model", "num_query_groups", int, None,
                           "KV head groups G of group-query attention (default: one per head)",
                           "G"),
    "--kv-channels": ("model", "kv_channels", int, None,
                      "head dimension d (elements; default: hidden size / heads)", "kv"),
    "--normalization": ("model", "normalization", str, NORMALIZATION_CHOICES,
                        "layer normalization kind", ""),
    "--norm-epsilon": ("model", "norm_epsilon", float, None, "epsilon of the normalization",
                       "eps"),
    "--position-embedding-type": ("model", "position_embedding_type", str,
                                  POSITION_EMBEDDING_CHOICES, "position embedding", "pos-"),
    "--rotary-base": ("model", "rotary_base", int, None, "RoPE base (theta)", "rb"),
    "--rotary-percent": ("model", "rotary_percent", float, None,
                         "fraction of each head's channels RoPE rotates", "rp"),
    "--attention-backend": ("model", "attention_backend", str, ATTENTION_BACKEND_CHOICES,
                            "attention core: unfused (s x s tensors kept) or flash "
                            "(FlashAttention)", "attn-"),
    # Mixture of experts (Megatron-LM arguments.py; docs/moe.md)
    "--num-experts": ("model", "num_experts", int, None,
                      "routed experts of each MoE layer (default: dense MLPs)", "E"),
    "--moe-router-topk": ("model", "moe_router_topk", int, None,
                          "experts each token is routed to (default 2)", "topk"),
    "--moe-ffn-hidden-size": ("model", "moe_ffn_hidden_size", int, None,
                              "expert MLP width (elements; default: ffn hidden size)", "mffn"),
    "--moe-router-score-function": ("model", "moe_router_score_function", str,
                                    MOE_SCORE_CHOICES, "router score function", "score-"),
    "--moe-router-load-balancing-type": ("model", "moe_router_load_balancing_type", str,
                                         MOE_BALANCING_CHOICES, "load balancing", "lb-"),
    "--moe-aux-loss-coeff": ("model", "moe_aux_loss_coeff", float, None,
                             "coefficient of the load-balancing aux loss (default 0)", "aux"),
    "--moe-layer-freq": ("model", "moe_layer_freq", lambda text: int(text) if text.isdigit()
                         else text, None, "a MoE layer every N layers from layer 0 (default 1), "
                         "or Megatron's per-layer pattern such as \"([0]*3+[1]*58)\"", "mfreq"),
    "--moe-expert-capacity-factor": ("model", "moe_expert_capacity_factor", float, None,
                                     "expert capacity factor: tokens over capacity are dropped "
                                     "(default: dropless)", "cap"),
    "--moe-shared-expert-intermediate-size": ("model", "moe_shared_expert_intermediate_size",
                                              int, None, "shared experts' total MLP width "
                                              "(elements; default: no shared experts)", "shx"),
    "--moe-routing-imbalance": ("model", "moe_routing_imbalance", float, None,
                                "simsp's meta-mode routing model: expert loads ∝ (i+1)^-alpha "
                                "over a seeded order of the experts (0: balanced)", "imb"),
    "--expert-model-parallel-size": ("parallel", "expert_model_parallel_size", int, None,
                                     "expert-parallel size (GPUs sharing a MoE layer's experts)",
                                     "ep"),
    "--expert-tensor-parallel-size": ("parallel", "expert_tensor_parallel_size", int, None,
                                      "tensor-parallel size of each expert (default: t)", "etp"),
    "--moe-token-dispatcher-type": ("parallel", "moe_token_dispatcher_type", str,
                                    MOE_DISPATCHER_CHOICES, "how tokens reach their experts' "
                                    "ranks: all-gather / reduce-scatter, or all-to-all",
                                    "disp-"),
    # Multi-head latent attention (Megatron-LM arguments.py _add_mla_args; docs/mla.md)
    "--q-lora-rank": ("model", "q_lora_rank", int, None,
                      "MLA query latent rank r_q (elements; default: none, a plain query projection)", "qlr"),
    "--kv-lora-rank": ("model", "kv_lora_rank", int, None, "MLA key/value latent rank r_kv "
                       "(elements)", "kvlr"),
    "--qk-head-dim": ("model", "qk_head_dim", int, None,
                      "MLA per-head query/key width without RoPE d_n (elements)", "qkd"),
    "--qk-pos-emb-head-dim": ("model", "qk_pos_emb_head_dim", int, None,
                              "MLA RoPE width d_r, one key shared by all heads (elements)",
                              "qkpd"),
    "--v-head-dim": ("model", "v_head_dim", int, None, "MLA per-head value width d_v (elements)",
                     "vd"),
    # Multi-token prediction (Megatron-LM arguments.py; docs/mtp.md)
    "--mtp-num-layers": ("model", "mtp_num_layers", int, None, "multi-token prediction depths D "
                         "on the last pipeline stage (default: none)", "mtp"),
    "--mtp-loss-scaling-factor": ("model", "mtp_loss_scaling_factor", float, None,
                                  "weight of the MTP losses, split over the D depths",
                                  "mtpw"),
    "--micro-batch-size": ("parallel", "micro_batch_size", int, None,
                           "micro-batch size b (samples)", "mbs"),
    "--global-batch-size": ("parallel", "global_batch_size", int, None,
                            "samples per iteration B (default: b x d, one micro-batch per "
                            "replica)", "gbs"),
    "--tensor-model-parallel-size": ("parallel", "tensor_model_parallel_size", int, None,
                                     "tensor-parallel size t (GPUs)", "t"),
    "--pipeline-model-parallel-size": ("parallel", "pipeline_model_parallel_size", int, None,
                                       "pipeline-parallel size p (stages)", "p"),
    "--data-parallel-size": ("parallel", "data_parallel_size", int, None,
                             "data-parallel size d (model replicas)", "d"),
    "--context-parallel-size": ("parallel", "context_parallel_size", int, None,
                                "context-parallel size cp (GPUs sharing each sequence)", "cp"),
    "--cp-comm-type": ("parallel", "cp_comm_type", str, CP_COMM_TYPE_CHOICES,
                       "how CP ranks exchange attention inputs (p2p: ring; a2a: Ulysses)",
                       "cpcomm"),
    "--hierarchical-context-parallel-sizes": ("parallel", "hierarchical_context_parallel_sizes",
                                              str, None, "a2a+p2p: the a2a (inner) and p2p "
                                              "(outer) group sizes, product cp (default: none)",
                                              "hcp"),
    "--data-parallel-sharding-strategy": ("parallel", "data_parallel_sharding_strategy", str,
                                          FSDP_STRATEGY_CHOICES,
                                          "Megatron-FSDP: what is sharded over DP (ZeRO-0..3)",
                                          "shard-"),
    "--cpu-offloading-num-layers": ("parallel", "cpu_offloading_num_layers", int, None,
                                    "layers whose saved activations go to host memory", "offl"),
    "--num-layers-per-virtual-pipeline-stage":
        ("parallel", "num_layers_per_virtual_pipeline_stage", int, None,
         "layers per model chunk of the interleaved schedule (default: not interleaved)", "vp"),
    "--schedule": ("parallel", "schedule", str, SCHEDULE_CHOICES,
                   "pipeline schedule (default: interleaved with virtual stages, else 1f1b)", ""),
    "--ddp-bucket-size": ("parallel", "ddp_bucket_size", int, None,
                          "data-parallel gradient bucket (parameters; default: max(40M, 1M x d) with "
                          "--overlap-grad-reduce, else one bucket per chunk)", "bucket"),
    "--recompute-method": ("parallel", "recompute_method", str, RECOMPUTE_METHOD_CHOICES,
                           "full recompute: uniform or block (Megatron; default: uniform)", "rm-"),
    "--recompute-num-layers": ("parallel", "recompute_num_layers", int, None,
                               "layers per recompute group/block (Megatron; default: 1)", "rnl"),
    "--recompute-granularity": ("parallel", "recompute_granularity", str, RECOMPUTE_CHOICES,
                                "activation recomputation (K22 §4-5)", "rc-"),
    "--fp8-format": ("parallel", "fp8_format", str, FP8_FORMAT_CHOICES,
                     "FP8 GEMMs (Transformer Engine): e4m3, or hybrid (E5M2 gradients) "
                     "(default: off, BF16)", "fp8-"),
    "--fp8-recipe": ("parallel", "fp8_recipe", str, FP8_RECIPE_CHOICES,
                     "FP8 scaling: per-tensor delayed or current (tensorwise), 128-blocks, or "
                     "MXFP8 (Blackwell)", "rcp-"),
    "--main-grads-dtype": ("parallel", "main_grads_dtype", str, MAIN_GRADS_DTYPE_CHOICES,
                           "main gradient dtype (precision-aware optimizer)", "mg-"),
    "--main-params-dtype": ("parallel", "main_params_dtype", str, MAIN_PARAMS_DTYPE_CHOICES,
                            "master parameter dtype (precision-aware optimizer)", "mp-"),
    "--exp-avg-dtype": ("parallel", "exp_avg_dtype", str, EXP_AVG_DTYPE_CHOICES,
                        "Adam first moment dtype (precision-aware optimizer)", "m1-"),
    "--exp-avg-sq-dtype": ("parallel", "exp_avg_sq_dtype", str, EXP_AVG_DTYPE_CHOICES,
                           "Adam second moment dtype (precision-aware optimizer)", "m2-"),
    "--decoder-first-pipeline-num-layers": ("parallel", "decoder_first_pipeline_num_layers",
                                            int, None, "layers of the first pipeline stage "
                                            "(default: an even split)", "first"),
    "--decoder-last-pipeline-num-layers": ("parallel", "decoder_last_pipeline_num_layers", int,
                                           None, "layers of the last pipeline stage (default: "
                                           "an even split)", "last"),
    "--num-virtual-stages-per-pipeline-rank": ("parallel", "num_virtual_stages_per_pipeline_rank",
                                               int, None, "model chunks per stage of the "
                                               "interleaved schedule (default: from the layers "
                                               "per virtual stage)", "vs"),
    "--recompute-modules": ("parallel", "recompute_modules", str, None,
                            "selective recompute: modules among core_attn, mlp, layernorm, "
                            "space-separated in one argument (default: core_attn)", "rmod-"),
    "--nodes": ("cluster", "nodes", int, None, "DGX A100 nodes", "n"),
    "--gpus-per-node": ("cluster", "gpus_per_node", int, None, "GPUs per node", "gpn"),
    "--gpu": ("cluster", "gpu", str, None,
              "GPU profile: a100-sxm-40gb, a100-sxm-80gb, h100-sxm-80gb, h200-sxm-141gb, b200, "
              "gb200, or a .toml file (`simsp hardware` lists them)", ""),
    "--system": ("cluster", "system", str, None,
                 "system profile (sets gpu, GPUs per NVLink domain, link speeds): dgx-a100, "
                 "dgx-h100, dgx-h200, dgx-b200, gb200-nvl72, or a .toml file (default: none, "
                 "DGX A100-like nodes of the GPU)", ""),
    # the links, as `sweep` varies them (simsp.hardware.constants.LinkCalibration documents the defaults)
    "--nvlink-bandwidth-GBps": ("cluster", "nvlink_bandwidth_GBps", float, None,
                                "NVLink bandwidth per GPU per direction (GB/s)", "nvbw"),
    "--ib-bandwidth-GBps": ("cluster", "ib_bandwidth_GBps", float, None,
                            "InfiniBand bandwidth per NIC per direction (GB/s)", "ib"),
    "--nvlink-latency-us": ("cluster", "nvlink_latency_us", float, None,
                            "latency per NVSwitch hop (us)", "nvlat"),
    "--ib-latency-us": ("cluster", "ib_latency_us", float, None,
                        "latency per InfiniBand link (us)", "iblat"),
    "--nvlink-efficiency": ("cluster", "nvlink_efficiency", float, None,
                            "achieved fraction of NVLink bandwidth, in (0, 1]", "nveff"),
    "--ib-efficiency": ("cluster", "ib_efficiency", float, None,
                        "achieved fraction of InfiniBand bandwidth, in (0, 1]", "ibeff"),
    "--transfer-overhead-us": ("cluster", "transfer_overhead_us", float, None,
                               "software cost per transfer (us)", "xfer"),
    "--nccl-algo": ("cluster", "nccl_algo", str, NCCL_ALGO_CHOICES,
                    "NCCL algorithm of every collective, as NCCL_ALGO (auto: NCCL's choice; "
                    "tree: all-reduces only)", "algo-"),
    "--nccl-proto": ("cluster", "nccl_proto", str, NCCL_PROTO_CHOICES,
                     "NCCL protocol of every collective, as NCCL_PROTO (auto: NCCL's choice)",
                     "proto-"),
    "--mode": ("run", "mode", str, MODE_CHOICES,
               "numeric (numpy arrays, small models) or meta (shapes only, any size)", ""),
    "--seed": ("run", "seed", int, None, "random seed of weights, data and dropout", "seed"),
    "--numeric-dtype": ("run", "numeric_dtype", str, DTYPE_CHOICES,
                        "numpy dtype of numeric mode (accounting stays 2-byte)", ""),
    "--name": ("run", "name", str, None, "the run's name: titles its reports and names its "
               "default report folder (default: the scenario file's name, else default)", None),
}
SWITCHES = {  # flag -> (section, key, value, help, token)
    "--group-query-attention": ("model", "group_query_attention", True,
                                "group-query attention (with --num-query-groups)", "gqa"),
    "--swiglu": ("model", "swiglu", True, "SwiGLU MLP (gate and up projections)", "swiglu"),
    "--moe-pad-expert-input-to-capacity": ("model", "moe_pad_expert_input_to_capacity", True,
                                           "pad every expert's input to its capacity", "pad"),
    "--multi-latent-attention": ("model", "multi_latent_attention", True,
                                 "multi-head latent attention (DeepSeek-V2/V3; docs/mla.md)",
                                 "mla"),
    "--moe-grouped-gemm": ("parallel", "moe_grouped_gemm", True,
                           "each rank's experts as one grouped GEMM (default: a loop of GEMMs)",
                           "ggemm"),
    "--untie-embeddings-and-output-weights": ("model", "untie_embeddings_and_output_weights",
                                              True, "an output layer of its own", "untied"),
    "--disable-bias-linear": ("model", "add_bias_linear", False, "no biases in linear layers",
                              "nobias"),
    "--use-flash-attn": ("model", "attention_backend", "flash",
                         "FlashAttention (same as --attention-backend flash)", "flash"),
    "--sequence-parallel": ("parallel", "sequence_parallel", True,
                            "shard layer norms and dropout along the sequence (K22 §4.2.2)", "sp"),
    "--no-sequence-parallel": ("parallel", "sequence_parallel", False,
                               "turn off a scenario's sequence parallelism", "nosp"),
    "--account-for-embedding-in-pipeline-split":
        ("parallel", "account_for_embedding_in_pipeline_split", True,
         "count the embedding as a layer when splitting the pipeline", "acemb"),
    "--account-for-loss-in-pipeline-split":
        ("parallel", "account_for_loss_in_pipeline_split", True,
         "count the loss as a layer when splitting the pipeline", "acloss"),
    "--use-distributed-optimizer": ("parallel", "distributed_optimizer", True,
                                    "shard optimizer state over data-parallel ranks (ZeRO-1)",
                                    "distopt"),
    "--overlap-p2p-communication": ("parallel", "overlap_p2p_communication", True,
                                    "overlap pipeline sends/receives with compute", "p2pov"),
    "--no-scatter-gather-tensors-in-pipeline":
        ("parallel", "scatter_gather_tensors_in_pipeline", False,
         "send whole (not TP-scattered) pipeline tensors", "nosg"),
    "--overlap-grad-reduce": ("parallel", "overlap_grad_reduce", True,
                              "overlap DP gradient reduction with backward", "ovgr"),
    "--overlap-param-gather": ("parallel", "overlap_param_gather", True,
                               "overlap distributed-optimizer parameter all-gather", "ovpg"),
    "--accumulate-allreduce-grads-in-fp32": ("parallel", "accumulate_allreduce_grads_in_fp32",
                                             True, "reduce gradients in fp32", "fp32grad"),
    "--no-accumulate-allreduce-grads-in-fp32":
        ("parallel", "accumulate_allreduce_grads_in_fp32", False, "reduce gradients in bf16",
         "nofp32grad"),
}
SWITCHES.update({
    "--fp8-param-gather": ("parallel", "fp8_param_gather", True,
                           "FP8 parameters: no BF16 weight beside the FP8 copy", "fp8pg"),
    "--use-precision-aware-optimizer": ("parallel", "use_precision_aware_optimizer", True,
                                        "optimizer states in the dtypes given", "pao"),
})
# Sharded data parallelism and activation offload (docs/fsdp.md)
SWITCHES.update({
    "--use-megatron-fsdp": ("parallel", "use_megatron_fsdp", True,
                            "Megatron-FSDP: per-layer units, sharded by the strategy", "mfsdp"),
    "--use-torch-fsdp2": ("parallel", "use_torch_fsdp2", True,
                          "PyTorch FSDP2 fully_shard per layer (fp32 sharded parameters)",
                          "fsdp2"),
    "--cpu-offloading": ("parallel", "cpu_offloading", True,
                         "move saved activations to host memory and back before backward",
                         "offload"),
})
ALIASES = {"--use-distributed-optimizer": ("--distributed-optimizer",)}  # simsp's older name
LIST_FLAGS = ("--recompute-modules", "--hierarchical-context-parallel-sizes")  # Megatron's nargs='*' flags: one or more words, joined


class Parser(argparse.ArgumentParser):
    """ArgumentParser with no abbreviations, no repeated flags and no usage dump: every error is
    one `error:` line and exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        sys.stderr.write(f"error: {one_line(message)}\n")
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        """Refuse a flag given twice (under any of its names) before argparse keeps the last."""
        argv = sys.argv[1:] if args is None else list(args)
        self._refuse_empty(argv)
        seen, dests = {}, {}
        for token in argv:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is not None and action in seen:
                self.error(f"argument {seen[action]}: given more than once")
            if action is not None and dests.get(action.dest, action) is not action:
                self.error(f"argument {name}: conflicts with {seen[dests[action.dest]]}")
            if action is not None:
                seen[action] = name
                dests[action.dest] = action
        return super().parse_known_args(argv, namespace)

    def _refuse_empty(self, argv: list[str]) -> None:
        """An empty argument never means "not given": `--out ''` or `--out=` is an error."""
        for index, token in enumerate(argv):
            name, equals, value = token.partition("=")
            if token.startswith("--") and equals and value == "":
                self.error(f"argument {name}: must not be empty")
            if token == "":
                before = argv[index - 1] if index else ""
                if before.startswith("-") and "=" not in before:
                    self.error(f"argument {before}: must not be empty")
                if self._subparsers is None:  # the command's own parser names its positional
                    self.error(f"argument {self._positional_name()}: must not be empty")

    def _positional_name(self) -> str:
        """How argparse names this parser's first positional argument (SCENARIO, FILE...)."""
        for action in self._positionals._group_actions:
            return action.metavar or action.dest
        return "(an empty word)"


def nonempty(text: str) -> str:
    """argparse type for free text (paths): an empty string is an error, not 'use the default'."""
    if text == "":
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _row(flag: str) -> Flag:
    return Flag(*SCENARIO_FLAGS[flag])


def _switch(flag: str) -> tuple:
    """A SWITCHES row padded to (section, key, value, help, token); 3-tuple rows work too."""
    row = tuple(SWITCHES[flag])
    return row + ("", flag.lstrip("-"))[len(row) - 3:]


def _dest(flag: str) -> str:
    return "scn_" + flag.lstrip("-").replace("-", "_")


def _default_text(section: str, key: str) -> str:
    """'; default: X' from the dataclass default, '' when the default is None (said in help)."""
    default = {f.name: f.default for f in fields(SECTIONS[section])}[key]
    return "" if default is None else f"; default: {default}"


def _switch_default(flag: str) -> str:
    """'on' when the field's default is the value this switch sets, else 'off'."""
    section, key, value = _switch(flag)[:3]
    default = {f.name: f.default for f in fields(SECTIONS[section])}[key]
    return "on" if default == value else "off"


def _metavar(row: Flag) -> str | None:
    if row.choices:
        return "{" + ",".join(row.choices) + "}"
    return {int: "N", float: "X"}.get(row.kind, "TEXT")


def flag_help(flag: str) -> str:
    """The --help text of a scenario flag: meaning and unit, default, and the scenario key."""
    row = _row(flag)
    meaning = row.help or row.key.replace("_", " ")
    return f"{meaning}{_default_text(row.section, row.key)} [{row.section}.{row.key}]"


def switch_help(flag: str) -> str:
    """The --help text of a switch: meaning, whether it is on by default, the scenario key."""
    section, key, _, meaning, _ = _switch(flag)
    return (f"{meaning or key.replace('_', ' ')}; default: {_switch_default(flag)} "
            f"[{section}.{key}]")


def add_scenario_arguments(parser: argparse.ArgumentParser, positional: bool = True) -> None:
    """Add the optional scenario file, every Megatron-style override flag, --world-size and
    --force."""
    if positional:
        parser.add_argument("scenario", nargs="?", type=nonempty, metavar="SCENARIO",
                            help="scenario TOML file (default: the built-in small GPT)")
    group = parser.add_argument_group("scenario overrides (Megatron-LM flags)")
    for flag in SCENARIO_FLAGS:
        row = _row(flag)
        group.add_argument(flag, dest=_dest(flag), type=row.kind, choices=row.choices,
                           default=None, metavar=_metavar(row), help=flag_help(flag),
                           nargs="+" if flag in LIST_FLAGS else None)
    for flag in SWITCHES:
        group.add_argument(flag, *ALIASES.get(flag, ()), dest=_dest(flag), action="store_true",
                           help=switch_help(flag))
    group.add_argument("--world-size", dest="world_size", type=int, default=None, metavar="N",
                       help="total GPUs; derives d = N / (t x p) as Megatron does (default: "
                            "the scenario's d)")
    parser.add_argument("--force", action="store_true",
                        help="run even if the estimated time is above the limit (never lifts "
                             "the memory limit; see README 'Limits')")


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The {(section, key): value} overrides the user gave on the command line."""
    found = {}
    for flag in SCENARIO_FLAGS:
        value = getattr(args, _dest(flag), None)
        if isinstance(value, list):
            value = " ".join(value)
        if value is not None:
            row = _row(flag)
            found[(row.section, row.key)] = value
    for flag in SWITCHES:
        section, key, value, _, _ = _switch(flag)
        if getattr(args, _dest(flag), False):
            found[(section, key)] = value
    if getattr(args, _dest("--sequence-parallel")) and getattr(args, _dest("--no-sequence-parallel")):
        raise UserError("--sequence-parallel", "conflicts with --no-sequence-parallel")
    backend = getattr(args, _dest("--attention-backend"), None)
    if getattr(args, _dest("--use-flash-attn"), False) and backend not in (None, "flash"):
        raise UserError("--use-flash-attn", f"conflicts with --attention-backend {backend}")
    return found


def override_tokens(args: argparse.Namespace) -> list[str]:
    """One short token per override in flag-table order (t4, p16, rc-full, sp, w64): names the
    default report folder, so variants never overwrite each other."""
    tokens = []
    for flag in SCENARIO_FLAGS:
        value = getattr(args, _dest(flag), None)
        if isinstance(value, list):
            value = "-".join(value)
        if value is not None and _row(flag).token is not None:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            text = Path(text).stem if "/" in text else text  # a profile's path: its name
            tokens.append(f"{_row(flag).token}{text}")
    tokens += [_switch(f)[4] for f in SWITCHES if getattr(args, _dest(f), False)]
    if getattr(args, "world_size", None) is not None:
        tokens.append(f"w{args.world_size}")
    return tokens


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """Load the scenario file (if any) and apply the command-line overrides."""
    return load_scenario(getattr(args, "scenario", None), overrides_from_args(args),
                         getattr(args, "world_size", None))
