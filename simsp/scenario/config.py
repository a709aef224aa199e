"""Frozen, validated configuration: model, parallel layout, cluster and run sections of a scenario.

Every field has the name of its Megatron-LM flag (dashes become underscores), in TOML, in the
dataclasses and on the command line alike. Cross-field checks live in `validate`.
"""

from dataclasses import dataclass, field, fields, replace
import functools
import math
import re
from pathlib import Path

from simsp.scenario.bounds import check_ranges
from simsp import io_in
from simsp.errors import UserError
from simsp.hardware.profiles import (gpu_cluster_fields, gpu_profile, system_cluster_fields,
                            system_profile)

RECOMPUTE_CHOICES = ("none", "selective", "full")
RECOMPUTE_METHOD_CHOICES = ("uniform", "block")
SCHEDULE_CHOICES = ("gpipe", "1f1b", "interleaved")
MODE_CHOICES = ("numeric", "meta")
DTYPE_CHOICES = ("float64", "float32")
NORMALIZATION_CHOICES = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDING_CHOICES = ("learned_absolute", "rope", "none")
ATTENTION_BACKEND_CHOICES = ("unfused", "flash")
MOE_SCORE_CHOICES = ("softmax", "sigmoid")  # --moe-router-score-function
MOE_BALANCING_CHOICES = ("aux_loss", "none")  # --moe-router-load-balancing-type
MOE_DISPATCHER_CHOICES = ("allgather", "alltoall")  # --moe-token-dispatcher-type
# Megatron-LM --cp-comm-type (Transformer Engine's cp_comm_type)
CP_COMM_TYPE_CHOICES = ("p2p", "a2a", "allgather", "a2a+p2p")
# Sharded data parallelism: Megatron-LM --data-parallel-sharding-strategy (docs/fsdp.md)
FSDP_STRATEGY_CHOICES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
NCCL_ALGO_CHOICES = ("auto", "ring", "tree")  # NCCL_ALGO (engine/collectives/nccl_tuning.py); auto: NCCL's
NCCL_PROTO_CHOICES = ("auto", "LL", "LL128", "Simple")  # NCCL_PROTO


@dataclass(frozen=True)
class Model:
    """GPT shape (K22 notation: L layers, h hidden, a heads, s sequence, v vocabulary)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 32
    vocab_size: int = 128
    make_vocab_size_divisible_by: int = 128  # Megatron pads v to a multiple of this times t
    ffn_hidden_size: int | None = None  # None means 4h
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # Llama-class layers (Megatron-LM megatron/training/arguments.py flag names; docs/llama.md)
    group_query_attention: bool = False
    num_query_groups: int | None = None  # KV groups G (group_query_attention); None means a
    kv_channels: int | None = None  # head dimension d; None means h / a
    swiglu: bool = False
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000
    rotary_percent: float = 1.0
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True  # --disable-bias-linear turns it off
    attention_backend: str = "unfused"  # --use-flash-attn / --attention-backend flash
    # Mixture of experts (Megatron-LM megatron/core/transformer/moe/; docs/moe.md)
    num_experts: int | None = None  # None: every MLP dense
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # None: ffn_hidden_size
    moe_router_score_function: str = "softmax"
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = 0.0
    moe_layer_freq: int | str = 1  # a MoE layer at every i with i % freq == 0, or a pattern
    moe_expert_capacity_factor: float | None = None  # None: dropless
    moe_pad_expert_input_to_capacity: bool = False
    # Shared experts and simsp's routing model of meta mode (docs/moe.md)
    moe_shared_expert_intermediate_size: int | None = None  # None: no shared experts
    moe_routing_imbalance: float = 0.0  # Zipf exponent of the experts' loads; 0: balanced
    # Multi-head latent attention (Megatron-LM multi_latent_attention.py, arguments.py
    # _add_mla_args; docs/mla.md)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None  # query latent r_q (DeepSeek-V3 1536); None: linear_q_proj
    kv_lora_rank: int = 32  # key/value latent r_kv
    qk_head_dim: int = 128  # d_n: per-head query/key width without RoPE
    qk_pos_emb_head_dim: int = 64  # d_r: the RoPE part of query/key, one key shared by heads
    v_head_dim: int = 128  # d_v
    # Multi-token prediction (Megatron-LM multi_token_prediction.py; docs/mtp.md)
    mtp_num_layers: int | None = None  # D prediction depths on the last stage; None: none
    mtp_loss_scaling_factor: float = 0.1  # the MTP losses' weight, split over the D depths

    @property
    def ffn(self) -> int:
        """FFN width: ffn_hidden_size, or 4h when unset."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """d: kv_channels, or h / a when unset."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """G: KV head groups (num_query_groups under GQA, else one per head)."""
        if self.group_query_attention and self.num_query_groups:
            return self.num_query_groups
        return self.num_attention_heads

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i's MLP is a mixture of experts (--moe-layer-freq: an int N, a MoE
        layer every N from layer 0; or Megatron's pattern string, 1 for MoE, per layer)."""
        if self.num_experts is None:
            return False
        i = min(i, self.num_layers - 1)  # an MTP depth's layer is built as the last layer
        if isinstance(self.moe_layer_freq, str):
            return moe_layer_pattern(self.moe_layer_freq)[i] == 1
        return i % self.moe_layer_freq == 0

    @property
    def moe_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def flash(self) -> bool:
        return self.attention_backend == "flash"

    @property
    def rmsnorm(self) -> bool:
        return self.normalization == "RMSNorm"

    @property
    def tied(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    @property
    def llama_layer(self) -> bool:
        """Whether any layer variant differs from the GPT layer of K22 (the default path)."""
        return (self.query_groups != self.num_attention_heads or self.swiglu or self.rmsnorm
                or self.position_embedding_type == "rope" or not self.add_bias_linear
                or self.flash or self.head_dim * self.num_attention_heads != self.hidden_size)


@dataclass(frozen=True)
class Parallel:
    """Megatron-LM parallel layout: t, p, d, SP, recompute, batches and the pipeline schedule."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int = 1
    sequence_parallel: bool = False
    # Context parallelism (Megatron-LM --context-parallel-size, --cp-comm-type; docs/context-parallel.md)
    context_parallel_size: int = 1
    cp_comm_type: str = "p2p"
    # Megatron-LM --hierarchical-context-parallel-sizes: space-separated (a2a size, p2p size) of
    # --cp-comm-type a2a+p2p, product cp; None: not hierarchical (docs/context-parallel.md)
    hierarchical_context_parallel_sizes: str | None = None
    recompute_granularity: str = "none"
    recompute_method: str | None = None  # full recompute only; None means uniform
    recompute_num_layers: int | None = None  # full recompute only; None means 1
    micro_batch_size: int = 1
    global_batch_size: int | None = None  # None: one micro-batch per DP replica
    num_layers_per_virtual_pipeline_stage: int | None = None
    schedule: str | None = None  # None: interleaved if virtual stages are set, else 1f1b
    distributed_optimizer: bool = False
    # Megatron-LM runtime switches (docs/MODEL.md#runtime-mechanisms): p2p, scatter/gather,
    # DP gradient overlap.
    overlap_p2p_communication: bool = False
    scatter_gather_tensors_in_pipeline: bool = True
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    ddp_bucket_size: int | None = None  # parameters per DP bucket; None: max(40M, 1M*d)
    accumulate_allreduce_grads_in_fp32: bool = True  # Megatron turns it on for bf16
    # FP8 training and optimizer-state precision (Megatron-LM / Transformer Engine names;
    # simsp/scenario/precision.py, docs/hardware.md). fp8_format None: BF16 GEMMs.
    fp8_format: str | None = None  # "e4m3" | "hybrid" (E4M3 forward, E5M2 gradients)
    fp8_recipe: str = "delayed"  # delayed | tensorwise | blockwise | mxfp8
    fp8_param_gather: bool = False  # FP8 parameters, no BF16 weight beside the FP8 copy
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    # Uneven pipeline stages (Megatron-LM transformer_block.py get_num_layers_to_build)
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    num_virtual_stages_per_pipeline_rank: int | None = None  # interleaved: chunks per stage
    recompute_modules: str | None = None  # selective: space-separated; None means core_attn
    # Sharded data parallelism and activation offload (Megatron-LM --use-megatron-fsdp,
    # --data-parallel-sharding-strategy, --use-torch-fsdp2, --cpu-offloading,
    # --cpu-offloading-num-layers; docs/fsdp.md)
    use_megatron_fsdp: bool = False
    data_parallel_sharding_strategy: str = "no_shard"
    use_torch_fsdp2: bool = False
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    # Expert parallelism (Megatron-LM arguments.py; docs/moe.md)
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: tensor_model_parallel_size
    moe_token_dispatcher_type: str = "allgather"
    moe_grouped_gemm: bool = False

    @property
    def uneven_pipeline(self) -> bool:
        """A Megatron uneven split is asked for. With one stage the accounted embedding and loss
        change nothing: Megatron's get_num_layers_to_build gives it (L + e + l) − e − l = L."""
        accounted = (self.account_for_embedding_in_pipeline_split
                     or self.account_for_loss_in_pipeline_split)
        return (self.decoder_first_pipeline_num_layers is not None
                or self.decoder_last_pipeline_num_layers is not None
                or (accounted and self.pp > 1))

    @property
    def recompute_module_set(self) -> frozenset:
        """Megatron's --recompute-modules for selective recompute (core_attn by default)."""
        if self.recompute_granularity != "selective":
            return frozenset()
        if self.recompute_modules is None:
            return frozenset(("core_attn",))
        return frozenset(self.recompute_modules.split())

    @property
    def hcp_sizes(self) -> tuple[int, ...]:
        """--hierarchical-context-parallel-sizes as integers, innermost (a2a) first; () unset."""
        text = self.hierarchical_context_parallel_sizes
        return () if text is None else tuple(int(w) for w in text.split())

    @property
    def fsdp(self) -> str | None:
        """The FSDP strategy in force: a Megatron-FSDP sharding strategy, "fsdp2", or None."""
        if self.use_torch_fsdp2:
            return "fsdp2"
        return self.data_parallel_sharding_strategy if self.use_megatron_fsdp else None

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def etp(self) -> int:
        """Expert tensor-parallel size (--expert-tensor-parallel-size, default t)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def dp(self) -> int:
        return self.data_parallel_size

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """B: samples per iteration (global_batch_size, or one micro-batch per replica)."""
        return self.global_batch_size or self.micro_batch_size * self.dp

    @property
    def num_micro_batches(self) -> int:
        """m: micro-batches per pipeline per iteration = B / (b * d)."""
        return self.global_batch // (self.micro_batch_size * self.dp)

    @property
    def schedule_name(self) -> str:
        if self.schedule:
            return self.schedule
        virtual = self.num_layers_per_virtual_pipeline_stage or \
            self.num_virtual_stages_per_pipeline_rank
        return "interleaved" if virtual else "1f1b"


@dataclass(frozen=True)
class Cluster:
    """DGX A100 nodes: NVLink/NVSwitch inside a node, one HDR InfiniBand NIC per GPU between nodes."""

    gpu: str = "a100-sxm-80gb"  # a GPU profile (simsp/hardware/data/gpus) or a .toml path
    system: str | None = None  # a system profile: fills gpu, gpus_per_node and link speeds
    gpus_per_node: int = 8
    nodes: int = 1
    nvlink_bandwidth_GBps: float = 300.0  # per GPU per direction (docs/MODEL.md#hardware)
    ib_bandwidth_GBps: float = 25.0  # per NIC per direction: 200 Gb/s HDR
    nvlink_latency_us: float = 2.0  # per hop through the NVSwitch
    ib_latency_us: float = 1.0  # per InfiniBand link (GPU-NIC-leaf-spine: a cross-rail route has 4)
    # Achieved fractions of link speed and the per-transfer software cost: the link calibration
    # (simsp.hardware.constants.LinkCalibration takes these defaults; `simsp calibrate` fits them).
    # nccl-tests all_reduce on one DGX A100 (8 GPUs, NVSwitch) reports busbw ~230 GB/s for large
    # messages against 300 GB/s of NVLink per GPU per direction: 0.78 x 300 = 234 GB/s.
    nvlink_efficiency: float = 0.78
    # NCCL over HDR InfiniBand reaches ~22-23 GB/s of a NIC's 25 GB/s (200 Gb/s) per direction.
    ib_efficiency: float = 0.90
    # Software cost added to every point-to-point transfer (NCCL step synchronisation) on top of
    # the per-hop link latencies. Zero: the configured nvlink_latency_us (2 us per switch hop)
    # already exceeds NCCL's measured per-step latency on NVLink (~1 us, LL protocol).
    transfer_overhead_us: float = 0.0
    # NCCL_ALGO / NCCL_PROTO: force every collective's algorithm / protocol (docs/nccl.md)
    nccl_algo: str = "auto"
    nccl_proto: str = "auto"

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Run:
    """How to execute: numeric (numpy arrays) or meta (shapes only), seed, numeric dtype."""

    mode: str = "numeric"
    seed: int = 1234
    numeric_dtype: str = "float64"
    name: str = "default"


@dataclass(frozen=True)
class Scenario:
    """A whole, validated scenario."""

    model: Model = field(default_factory=Model)
    parallel: Parallel = field(default_factory=Parallel)
    cluster: Cluster = field(default_factory=Cluster)
    run: Run = field(default_factory=Run)

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary the embedding and the head hold (tokens still come from vocab_size)."""
        return padded_vocab_size(self.model, self.parallel.tp)

    @property
    def padded_model(self) -> Model:
        """The model as simulated: its vocabulary padded (every shape, FLOP and byte uses it)."""
        return replace(self.model, vocab_size=self.padded_vocab_size)


def pipeline_layer_counts(m: Model, p: Parallel) -> tuple[int, ...]:
    """Transformer layers of each pipeline stage, as Megatron-LM builds them
    (megatron/core/transformer/transformer_block.py get_num_layers_to_build, non-interleaved):
    the given first/last stage counts and the rest spread evenly over the middle stages; or
    (L + 1 per accounted embedding/loss) / p per stage, one fewer on the first (embedding) and
    last (loss) stage; else L / p each."""
    first, last, L, n = (p.decoder_first_pipeline_num_layers,
                         p.decoder_last_pipeline_num_layers, m.num_layers, p.pp)
    if first is not None or last is not None:
        middle_stages = n - (first is not None) - (last is not None)
        middle_layers = L - (first or 0) - (last or 0)
        each = middle_layers // middle_stages if middle_stages > 0 else 0
        counts = [each] * n
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return tuple(counts)
    total = L + p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split
    counts = [total // n] * n
    counts[0] -= p.account_for_embedding_in_pipeline_split
    counts[-1] -= p.account_for_loss_in_pipeline_split
    return tuple(counts)


def virtual_stage_layer_counts(m: Model, p: Parallel) -> tuple[int, ...]:
    """Layers of each virtual stage k = chunk·p + stage, contiguous in k order. Interleaved with
    accounted embedding/loss (Megatron arguments.py: vp = ((L + e + l)/p) / N): N each, one
    fewer on the first (embedding) and the last (loss); otherwise pipeline_layer_counts."""
    virtual = p.num_layers_per_virtual_pipeline_stage
    chunks = model_chunks(m, p)
    if p.schedule_name != "interleaved" or chunks == 1:
        return pipeline_layer_counts(m, p)
    if virtual:
        counts = [virtual] * (p.pp * chunks)
    else:  # --num-virtual-stages-per-pipeline-rank: each stage's layers (embedding/loss
        # counted) in equal chunks (transformer_block.py get_num_layers_to_build)
        per_stage = list(pipeline_layer_counts(m, p))
        per_stage[0] += p.account_for_embedding_in_pipeline_split
        per_stage[-1] += p.account_for_loss_in_pipeline_split
        counts = [per_stage[k % p.pp] // chunks for k in range(p.pp * chunks)]
    counts[0] -= p.account_for_embedding_in_pipeline_split
    counts[-1] -= p.account_for_loss_in_pipeline_split
    return tuple(counts)


def model_chunks(m: Model, p: Parallel) -> int:
    """v: model chunks per stage: --num-virtual-stages-per-pipeline-rank, or
    ((L + accounted embedding/loss) / p) / N interleaved, else 1 (Megatron arguments.py)."""
    if p.num_virtual_stages_per_pipeline_rank:
        return p.num_virtual_stages_per_pipeline_rank
    virtual = p.num_layers_per_virtual_pipeline_stage
    if not virtual:
        return 1
    total = m.num_layers + p.account_for_embedding_in_pipeline_split + \
        p.account_for_loss_in_pipeline_split
    return total // p.pp // virtual


def _validate_uneven_pipeline(m: Model, p: Parallel) -> None:
    """Megatron's checks on uneven stages (transformer_block.py, arguments.py); simsp also needs
    one layer or more per stage and a non-interleaved schedule."""
    first, last = p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers
    _positive("parallel", p, ("decoder_first_pipeline_num_layers",
                              "decoder_last_pipeline_num_layers"))
    given = (first is not None) + (last is not None)
    accounted = p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split
    name = "parallel.decoder_first_pipeline_num_layers" if first is not None else \
        "parallel.decoder_last_pipeline_num_layers" if last is not None else \
        "parallel.account_for_embedding_in_pipeline_split"
    _check(not (given and accounted), name, "cannot be combined with account_for_embedding/"
           "loss_in_pipeline_split (Megatron: not supported with uneven pp)")
    _check(p.pp > 1, name, "needs pipeline_model_parallel_size > 1")
    _check(p.schedule_name != "interleaved" or not given
           or p.num_virtual_stages_per_pipeline_rank is not None, name,
           "interleaving uneven first/last stages needs --num-virtual-stages-per-pipeline-rank "
           "(Megatron arguments.py), not --num-layers-per-virtual-pipeline-stage")
    middle_stages = p.pp - given
    middle_layers = m.num_layers - (first or 0) - (last or 0)
    if given:
        _check(middle_layers >= 0 and (middle_stages > 0 or middle_layers == 0), name,
               f"the first/last stage layers do not add up to num_layers={m.num_layers}")
        _check(middle_stages == 0 or middle_layers % middle_stages == 0, name,
               f"the {middle_layers} remaining layers do not divide over {middle_stages} "
               "middle stages")
    else:
        total = m.num_layers + p.account_for_embedding_in_pipeline_split + \
            p.account_for_loss_in_pipeline_split
        _check(total % p.pp == 0, name, f"num_layers + accounted embedding/loss = {total} is "
               f"not divisible by {p.pp} stages")
    chunks = p.num_virtual_stages_per_pipeline_rank
    if p.schedule_name == "interleaved" and chunks:
        stages = list(pipeline_layer_counts(m, p))
        stages[0] += p.account_for_embedding_in_pipeline_split
        stages[-1] += p.account_for_loss_in_pipeline_split
        _check(all(n % chunks == 0 for n in stages),
               "parallel.num_virtual_stages_per_pipeline_rank",
               f"{chunks} chunks do not divide every stage's layers {tuple(stages)}")
    elif p.schedule_name == "interleaved" and p.num_layers_per_virtual_pipeline_stage:
        per_stage = (m.num_layers + p.account_for_embedding_in_pipeline_split +
                     p.account_for_loss_in_pipeline_split) // p.pp
        _check(per_stage % p.num_layers_per_virtual_pipeline_stage == 0,
               "parallel.num_layers_per_virtual_pipeline_stage",
               f"{p.num_layers_per_virtual_pipeline_stage} does not divide the {per_stage} "
               "layers (embedding/loss counted) of each pipeline stage")
    counts = virtual_stage_layer_counts(m, p)
    _check(min(counts) >= 1, name, f"gives a stage without layers ({counts})")


def padded_vocab_size(m: Model, t: int) -> int:
    """v rounded up to a multiple of make_vocab_size_divisible_by · t (Megatron-LM
    megatron/training/tokenizer/tokenizer.py `_vocab_size_with_padding`)."""
    multiple = m.make_vocab_size_divisible_by * t
    return -(-m.vocab_size // multiple) * multiple


SECTIONS = {"model": Model, "parallel": Parallel, "cluster": Cluster, "run": Run}


def one_layer_fields(m: Model) -> dict:
    """Model overrides that cut it to its layer 0 alone (`simsp layer`, the reports' layer
    table): one layer, and a --moe-layer-freq pattern cut to its first entry."""
    fields_ = {"num_layers": 1}
    if isinstance(m.moe_layer_freq, str):
        fields_["moe_layer_freq"] = f"[{moe_layer_pattern(m.moe_layer_freq)[0]}]"
    return fields_


INT_OR_STR = (int, str)  # a field that takes either (Megatron's --moe-layer-freq)


def _field_types(cls) -> dict[str, type]:
    """Map each dataclass field to the python type its value must have."""
    kinds = {}
    for f in fields(cls):
        text = str(f.type)
        kinds[f.name] = (
            bool if "bool" in text else INT_OR_STR if "int | str" in text else
            int if "int" in text else float if "float" in text else str
        )
    return kinds


def _coerce(section: str, key: str, value, kind: type):
    """Check one value's type: bool is not an int, an int is a fine float."""
    name = f"{section}.{key}"
    if value is None:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(name, f"must be true or false, got {value!r}")
    elif kind is INT_OR_STR:  # --moe-layer-freq: N or a pattern string
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UserError(name, f"must be an integer or a pattern string, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(name, f"must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(name, f"must be a number, got {value!r}")
        value = float(value)
    elif not isinstance(value, str):
        raise UserError(name, f"must be a string, got {value!r}")
    return value


def _build_section(section: str, values: dict):
    """Build one section's dataclass from a dict, rejecting unknown keys."""
    cls = SECTIONS[section]
    kinds = _field_types(cls)
    for key in values:
        if key not in kinds:
            known = ", ".join(sorted(kinds))
            raise UserError(f"{section}.{key}", f"unknown key (known: {known})")
    if isinstance(values.get("recompute_modules"), list):  # Megatron's list, as TOML writes it
        words = values["recompute_modules"]
        if not all(isinstance(w, str) for w in words):
            raise UserError(f"{section}.recompute_modules", "must be a list of module names")
        values = {**values, "recompute_modules": " ".join(words)}
    values = _joined_sizes(section, values)
    return cls(**{k: _coerce(section, k, v, kinds[k]) for k, v in values.items()})


def _joined_sizes(section: str, values: dict) -> dict:
    """hierarchical_context_parallel_sizes as TOML writes Megatron's list ([2, 2]) -> "2 2"."""
    sizes = values.get("hierarchical_context_parallel_sizes")
    if not isinstance(sizes, list):
        return values
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        raise UserError(f"{section}.hierarchical_context_parallel_sizes",
                        f"must be a list of integers, got {sizes!r}")
    return {**values, "hierarchical_context_parallel_sizes": " ".join(map(str, sizes))}


def read_toml(path: str | Path) -> dict:
    """Read a scenario file into nested dicts (simsp.io_in: size-capped, one UserError naming
    the file for I/O and syntax problems)."""
    data = io_in.read_toml(path, "scenario")
    for section, body in data.items():
        if not isinstance(body, dict):
            raise UserError(section, f"must be inside a [section] (known: {', '.join(SECTIONS)})")
        if section not in SECTIONS:
            raise UserError(section, f"unknown section (known: {', '.join(SECTIONS)})")
    return data


def load_scenario(path: str | Path | None = None, overrides: dict | None = None,
                  world_size: int | None = None) -> Scenario:
    """Scenario from an optional TOML file, then `overrides` {(section, key): value}, validated.
    A `world_size` (Megatron's --world-size) derives data_parallel_size = world / (t * p)."""
    data = read_toml(path) if path else {}
    for (section, key), value in (overrides or {}).items():
        data.setdefault(section, {})[key] = value
    _fill_from_hardware(data.setdefault("cluster", {}))
    if world_size is not None:
        _derive_data_parallel(data, world_size, ("parallel", "data_parallel_size") in (overrides or {}))
    if path and "name" not in data.get("run", {}):
        data.setdefault("run", {})["name"] = Path(path).stem
    scenario = Scenario(**{s: _build_section(s, data.get(s, {})) for s in SECTIONS})
    validate(scenario)
    return scenario


def _fill_from_hardware(cluster: dict) -> None:
    """A system profile fills the [cluster] keys it implies (gpu, gpus_per_node, link speeds),
    then the GPU profile its NVLink speed; keys the scenario or a flag gives win."""
    for name, kind in (("system", system_cluster_fields), ("gpu", gpu_cluster_fields)):
        if isinstance(cluster.get(name), str):
            for key, value in kind(cluster[name]).items():
                cluster.setdefault(key, value)


def _derive_data_parallel(data: dict, world_size: int, explicit_d: bool) -> None:
    """d = world / (t * p), as Megatron's initialize does; an explicit, different d conflicts."""
    parallel = data.setdefault("parallel", {})
    t = parallel.get("tensor_model_parallel_size", Parallel.tensor_model_parallel_size)
    p = parallel.get("pipeline_model_parallel_size", Parallel.pipeline_model_parallel_size)
    c = parallel.get("context_parallel_size", Parallel.context_parallel_size)
    _check(world_size > 0, "--world-size", f"must be positive, got {world_size}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (t, p, c)):
        return  # the section's own checks will name the bad t, p or cp
    if c == 1:
        _check(world_size % (t * p) == 0, "--world-size",
               f"{world_size} is not divisible by tensor*pipeline = {t}*{p} = {t * p}")
    else:  # Megatron-LM initialize: world = t * cp * d * p
        _check(world_size % (t * c * p) == 0, "--world-size",
               f"{world_size} is not divisible by tensor*context*pipeline = {t}*{c}*{p} = "
               f"{t * c * p}")
    d = world_size // (t * c * p)
    given = parallel.get("data_parallel_size")
    _check(not explicit_d or given == d, "--world-size",
           f"gives data_parallel_size {d} but --data-parallel-size is {given}")
    parallel["data_parallel_size"] = d


def _positive(section: str, obj, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value <= 0:
            raise UserError(f"{section}.{name}", f"must be positive, got {value}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(name, f"must be one of {', '.join(choices)}, got {value!r}")


def _check(condition: bool, name: str, reason: str) -> None:
    if not condition:
        raise UserError(name, reason)


def validate_model(m: Model) -> None:
    """Shape checks of the model alone."""
    _positive("model", m, ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                           "vocab_size", "ffn_hidden_size", "make_vocab_size_divisible_by"))
    _check(m.kv_channels is not None or m.hidden_size % m.num_attention_heads == 0,
           "model.hidden_size",
           f"{m.hidden_size} is not divisible by num_attention_heads={m.num_attention_heads}")
    _validate_llama_model(m)
    _validate_moe_model(m)
    _validate_mla_model(m)
    _validate_mtp_model(m)
    for name in ("hidden_dropout", "attention_dropout"):
        p = getattr(m, name)
        _check(0.0 <= p < 1.0, f"model.{name}", f"must be in [0, 1), got {p}")


def _validate_llama_model(m: Model) -> None:
    """Megatron-LM's checks on the Llama-class fields (arguments.py, transformer_config.py)."""
    _positive("model", m, ("num_query_groups", "kv_channels", "rotary_base"))
    _choice("model.normalization", m.normalization, NORMALIZATION_CHOICES)
    _choice("model.position_embedding_type", m.position_embedding_type,
            POSITION_EMBEDDING_CHOICES)
    _choice("model.attention_backend", m.attention_backend, ATTENTION_BACKEND_CHOICES)
    _check(m.num_query_groups is None or m.group_query_attention, "model.num_query_groups",
           "needs group_query_attention (--group-query-attention)")
    _check(m.num_attention_heads % m.query_groups == 0, "model.num_query_groups",
           f"{m.query_groups} does not divide num_attention_heads={m.num_attention_heads}")
    _check(m.norm_epsilon > 0, "model.norm_epsilon", f"must be positive, got {m.norm_epsilon}")
    _check(0 < m.rotary_percent <= 1, "model.rotary_percent",
           f"must be in (0, 1], got {m.rotary_percent}")
    rope_width = m.qk_pos_emb_head_dim if m.multi_latent_attention else m.head_dim
    rotary = int(rope_width * m.rotary_percent)
    _check(m.position_embedding_type != "rope" or (rotary > 0 and rotary % 2 == 0),
           "model.rotary_percent", f"rotates {rotary} of the {rope_width} head channels: "
           "needs an even, positive number")


def _validate_mtp_model(m: Model) -> None:
    """Multi-token prediction as simsp builds it (docs/mtp.md): D >= 1 depths, a non-negative
    loss weight, positions from RoPE or none (a learned table would be rolled as the tokens)."""
    _positive("model", m, ("mtp_num_layers",))
    _check(m.mtp_loss_scaling_factor >= 0, "model.mtp_loss_scaling_factor",
           f"must be >= 0, got {m.mtp_loss_scaling_factor}")
    _check(m.mtp_num_layers is None or m.position_embedding_type != "learned_absolute",
           "model.mtp_num_layers", "simsp's multi-token prediction needs "
           "--position-embedding-type rope or none")


def _validate_mla_model(m: Model) -> None:
    """Megatron-LM's checks on multi-latent attention (training.py asserts no GQA), and what
    simsp's MLA has (docs/mla.md): RMSNorm latents, RoPE."""
    _positive("model", m, ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                           "v_head_dim"))
    if not m.multi_latent_attention:
        return
    _check(not m.group_query_attention, "model.group_query_attention",
           "conflicts with multi_latent_attention (Megatron asserts it)")
    _check(m.rmsnorm, "model.normalization", "multi-latent attention's latents are RMSNorm'd "
           "in simsp (DeepSeek's): use RMSNorm")
    _check(m.position_embedding_type == "rope", "model.position_embedding_type",
           "multi-latent attention needs rope (its decoupled RoPE key)")
@functools.lru_cache(maxsize=64)
def moe_layer_pattern(text: str) -> tuple[int, ...]:
    """Megatron's --moe-layer-freq pattern, e.g. "([0]*3+[1]*58)" or "([1]*3+[0]*1)*3", as its
    per-layer 0/1 list (arguments.py moe_freq_type evaluates it as a Python list expression;
    simsp parses lists, +, * by an integer and parentheses only). ValueError if malformed."""
    tokens = re.findall(r"\d+|[\[\]()+*,]|\S", text.replace(" ", ""))
    values, end = _pattern_sum(tokens, 0)
    if end != len(tokens):
        raise ValueError(f"unexpected {''.join(tokens[end:])!r}")
    return tuple(values)


def _pattern_sum(tokens: list, i: int) -> tuple[list, int]:
    values, i = _pattern_term(tokens, i)
    while i < len(tokens) and tokens[i] == "+":
        more, i = _pattern_term(tokens, i + 1)
        values = values + more
    return values, i


def _pattern_term(tokens: list, i: int) -> tuple[list, int]:
    if i < len(tokens) and tokens[i] == "(":
        values, i = _pattern_sum(tokens, i + 1)
        if i >= len(tokens) or tokens[i] != ")":
            raise ValueError("unbalanced parentheses")
        i += 1
    elif i < len(tokens) and tokens[i] == "[":
        values, i = [], i + 1
        while i < len(tokens) and tokens[i] != "]":
            if not tokens[i].isdigit() or int(tokens[i]) not in (0, 1):
                raise ValueError(f"list items must be 0 or 1, got {tokens[i]!r}")
            values.append(int(tokens[i]))
            i += 2 if i + 1 < len(tokens) and tokens[i + 1] == "," else 1
        if i >= len(tokens):
            raise ValueError("unclosed [")
        i += 1
    else:
        raise ValueError(f"expected [ or ( at {''.join(tokens[i:]) or 'the end'!r}")
    while i + 1 < len(tokens) and tokens[i] == "*" and tokens[i + 1].isdigit():
        values, i = values * int(tokens[i + 1]), i + 2
    return values, i


def _validate_moe_layer_freq(m: Model) -> None:
    """An int >= 1, or a pattern of num_layers 0/1 entries (Megatron arguments.py)."""
    freq = m.moe_layer_freq
    if not isinstance(freq, str):
        _positive("model", m, ("moe_layer_freq",))
        return
    try:
        pattern = moe_layer_pattern(freq)
    except ValueError as exc:
        raise UserError("model.moe_layer_freq", f"{freq!r}: {exc}") from None
    _check(len(pattern) == m.num_layers, "model.moe_layer_freq",
           f"{freq!r} gives {len(pattern)} layers, not num_layers={m.num_layers}")


def _validate_moe_model(m: Model) -> None:
    """Megatron-LM's checks on the MoE fields (arguments.py), and what simsp's MoE layer has."""
    if m.num_experts is None:
        return
    _positive("model", m, ("num_experts", "moe_router_topk", "moe_ffn_hidden_size"))
    _validate_moe_layer_freq(m)
    _check(m.moe_router_topk <= m.num_experts, "model.moe_router_topk",
           f"{m.moe_router_topk} exceeds num_experts={m.num_experts}")
    _choice("model.moe_router_score_function", m.moe_router_score_function, MOE_SCORE_CHOICES)
    _choice("model.moe_router_load_balancing_type", m.moe_router_load_balancing_type,
            MOE_BALANCING_CHOICES)
    _check(m.moe_aux_loss_coeff >= 0, "model.moe_aux_loss_coeff",
           f"must be non-negative, got {m.moe_aux_loss_coeff}")
    cf = m.moe_expert_capacity_factor
    _check(cf is None or cf > 0, "model.moe_expert_capacity_factor", f"must be positive, got {cf}")
    _check(cf is not None or not m.moe_pad_expert_input_to_capacity,
           "model.moe_pad_expert_input_to_capacity", "needs moe_expert_capacity_factor")
    _check(not m.add_bias_linear, "model.num_experts",
           "simsp's experts have no biases: add --disable-bias-linear")
    _positive("model", m, ("moe_shared_expert_intermediate_size",))
    _check(m.moe_routing_imbalance >= 0, "model.moe_routing_imbalance",
           f"must be non-negative, got {m.moe_routing_imbalance}")


def _validate_expert_parallel(m: Model, p: Parallel) -> None:
    """Megatron-LM's checks on the expert layout (arguments.py, parallel_state.py
    initialize_model_parallel: tp·cp·dp = etp·ep·edp) and what simsp's MoE layer has."""
    _positive("parallel", p, ("expert_model_parallel_size", "expert_tensor_parallel_size"))
    _choice("parallel.moe_token_dispatcher_type", p.moe_token_dispatcher_type,
            MOE_DISPATCHER_CHOICES)
    if m.num_experts is None:
        _check(p.ep == 1 and p.expert_tensor_parallel_size is None,
               "parallel.expert_model_parallel_size", "needs num_experts (a MoE model)")
        return
    t, ep, etp = p.tp, p.ep, p.etp
    _check(m.num_experts % ep == 0, "parallel.expert_model_parallel_size",
           f"num_experts={m.num_experts} is not divisible by {ep}")
    dense = f"tensor*data parallel = {t}*{p.dp}" if p.cp == 1 else \
        f"tensor*context*data parallel = {t}*{p.cp}*{p.dp}"
    _check((t * p.cp * p.dp) % (etp * ep) == 0, "parallel.expert_model_parallel_size",
           f"{dense} is not divisible by expert tensor*expert "
           f"parallel = {etp}*{ep} (Megatron: the expert grid tiles each stage's ranks)")
    _check(m.moe_ffn % etp == 0, "parallel.expert_tensor_parallel_size",
           f"moe_ffn_hidden_size={m.moe_ffn} is not divisible by {etp}")
    _check(t == 1 or p.sequence_parallel, "parallel.sequence_parallel",
           "MoE with tensor parallelism needs sequence parallelism (Megatron arguments.py)")
    _check(not m.moe_shared_expert_intermediate_size or m.moe_shared_expert_intermediate_size % t == 0,
           "model.moe_shared_expert_intermediate_size",
           f"{m.moe_shared_expert_intermediate_size} is not divisible by "
           f"tensor_model_parallel_size={t}")
    modules = p.recompute_module_set or frozenset()
    _check(p.recompute_granularity != "selective" or not modules & {"mlp", "layernorm"},
           "parallel.recompute_modules", "MoE layers: recomputing mlp or layernorm is not "
           "built yet (core_attn is)")


def _validate_context_parallel(m: Model, p: Parallel) -> None:
    """CP's shape rules: Megatron-LM's get_batch_on_this_cp_rank (megatron/core/utils.py) views
    the sequence as 2*cp chunks; SP then splits each rank's s/cp tokens over t; TE's a2a
    (AttnFuncWithCPAndQKVOA2A) splits each TP rank's heads over cp."""
    _positive("parallel", p, ("context_parallel_size",))
    _choice("parallel.cp_comm_type", p.cp_comm_type, CP_COMM_TYPE_CHOICES)
    _validate_hierarchical_cp(m, p)
    if p.cp == 1:
        return
    c = p.cp
    _check(m.seq_length % (2 * c) == 0, "parallel.context_parallel_size",
           f"seq_length={m.seq_length} is not divisible by 2*context_parallel_size={2 * c} "
           "(the causal load-balancing split)")
    if p.sequence_parallel:
        _check((m.seq_length // c) % p.tp == 0, "parallel.sequence_parallel",
               f"seq_length/context_parallel_size={m.seq_length // c} is not divisible by "
               f"tensor_model_parallel_size={p.tp}")
    if p.cp_comm_type == "a2a":
        heads = m.num_attention_heads // p.tp
        _check(heads % c == 0 and (m.query_groups // p.tp) % c == 0, "parallel.cp_comm_type",
               f"a2a splits each TP rank's {heads} query and {m.query_groups // p.tp} KV heads "
               f"over context_parallel_size={c}; they are not divisible")
    _check(m.flash, "parallel.context_parallel_size",
           "needs FlashAttention (--use-flash-attn): Megatron-LM runs context parallelism "
           "only in Transformer Engine's attention")


def _validate_hierarchical_cp(m: Model, p: Parallel) -> None:
    """Megatron-LM's checks (megatron/training/arguments.py): the hierarchical sizes multiply to
    cp, and a2a+p2p needs them; Transformer Engine's AttnFuncWithCPAndKVP2P takes two levels
    (the a2a group, then the p2p group) and splits each TP rank's heads over the a2a size."""
    name, text = "parallel.hierarchical_context_parallel_sizes", \
        p.hierarchical_context_parallel_sizes
    if text is None:
        _check(p.cp_comm_type != "a2a+p2p", name, "must be set when cp_comm_type is a2a+p2p "
               "(--hierarchical-context-parallel-sizes A P, A·P = context_parallel_size)")
        return
    words = text.split()
    _check(bool(words) and all(re.fullmatch(r"[0-9]+", w) and int(w) > 0 for w in words), name,
           f"must be positive integers, got {text!r}")
    sizes = p.hcp_sizes
    _check(math.prod(sizes) == p.cp, name, f"{' x '.join(words)} = {math.prod(sizes)} is not "
           f"context_parallel_size={p.cp}")
    if p.cp_comm_type != "a2a+p2p":
        return
    _check(len(sizes) == 2, name, f"a2a+p2p takes two sizes (a2a, p2p), got {len(sizes)}")
    heads, groups = m.num_attention_heads // p.tp, m.query_groups // p.tp
    _check(heads % sizes[0] == 0 and groups % sizes[0] == 0, name,
           f"a2a+p2p splits each TP rank's {heads} query and {groups} KV heads over the a2a "
           f"size {sizes[0]}; they are not divisible")


def validate_parallel(m: Model, p: Parallel) -> None:
    """Cross-field checks between the model and the parallel layout."""
    _positive("parallel", p, ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                              "data_parallel_size", "micro_batch_size", "global_batch_size",
                              "num_layers_per_virtual_pipeline_stage", "ddp_bucket_size"))
    _choice("parallel.recompute_granularity", p.recompute_granularity, RECOMPUTE_CHOICES)
    if p.schedule is not None:
        _choice("parallel.schedule", p.schedule, SCHEDULE_CHOICES)
    t = p.tp
    _check(m.num_attention_heads % t == 0, "parallel.tensor_model_parallel_size",
           f"num_attention_heads={m.num_attention_heads} is not divisible by {t}")
    _check(m.ffn % t == 0, "parallel.tensor_model_parallel_size",
           f"ffn_hidden_size={m.ffn} is not divisible by {t}")
    _check(m.query_groups % t == 0, "parallel.tensor_model_parallel_size",
           f"num_query_groups={m.query_groups} is not divisible by {t} (Megatron: each TP "
           "rank holds whole KV groups)")
    padded = padded_vocab_size(m, t)
    _check(padded % t == 0, "parallel.tensor_model_parallel_size",
           f"padded vocab_size={padded} is not divisible by {t} (the vocabulary is split over TP)")
    _validate_expert_parallel(m, p)
    _check(not m.multi_latent_attention or p.cp == 1, "parallel.context_parallel_size",
           "multi-latent attention runs without context parallelism yet")
    _check(m.mtp_num_layers is None or p.cp == 1, "parallel.context_parallel_size",
           "multi-token prediction runs without context parallelism yet")
    _check(m.mtp_num_layers is None or p.fsdp is None, "parallel.use_megatron_fsdp",
           "FSDP with multi-token prediction is not modelled yet")
    if p.sequence_parallel:
        _check(t > 1, "parallel.sequence_parallel", "needs tensor_model_parallel_size > 1")
        _check(m.seq_length % t == 0, "parallel.sequence_parallel",
               f"seq_length={m.seq_length} is not divisible by tensor_model_parallel_size={t}")
    if p.cp > 1 or p.cp_comm_type != Parallel.cp_comm_type or \
            p.hierarchical_context_parallel_sizes is not None:
        _validate_context_parallel(m, p)
    if p.uneven_pipeline:
        _validate_uneven_pipeline(m, p)
    else:
        _check(m.num_layers % p.pp == 0, "parallel.pipeline_model_parallel_size",
               f"num_layers={m.num_layers} is not divisible by {p.pp} stages")
    _check(p.global_batch % (p.micro_batch_size * p.dp) == 0, "parallel.global_batch_size",
           f"{p.global_batch} is not divisible by micro_batch_size*data_parallel_size="
           f"{p.micro_batch_size * p.dp}")
    _validate_schedule(m, p)
    _validate_fsdp(m, p)
    _validate_overlap(p)
    _validate_recompute_method(m, p)
    _validate_recompute_modules(p, m.num_experts is not None)


def _validate_fsdp(m: Model, p: Parallel) -> None:
    """Megatron-LM's checks on FSDP and activation offload (arguments.py, transformer_config.py)
    and what simsp does not model with them yet (docs/fsdp.md)."""
    _choice("parallel.data_parallel_sharding_strategy", p.data_parallel_sharding_strategy,
            FSDP_STRATEGY_CHOICES)
    _check(not (p.use_megatron_fsdp and p.use_torch_fsdp2), "parallel.use_torch_fsdp2",
           "choose one of use_megatron_fsdp and use_torch_fsdp2")
    _check(p.use_megatron_fsdp or p.data_parallel_sharding_strategy == "no_shard",
           "parallel.data_parallel_sharding_strategy", "needs use_megatron_fsdp")
    if p.fsdp is not None:
        _check(m.num_experts is None, "parallel.use_megatron_fsdp",
               "FSDP with MoE layers is not modelled yet")
        _check(p.fp8_format is None, "parallel.use_megatron_fsdp",
               "FSDP with FP8 parameters is not modelled yet")
    _check(p.cpu_offloading_num_layers >= 0, "parallel.cpu_offloading_num_layers",
           "must not be negative")
    if not p.cpu_offloading:
        _check(p.cpu_offloading_num_layers == 0, "parallel.cpu_offloading_num_layers",
               "needs cpu_offloading")
        return
    _check(p.cpu_offloading_num_layers < m.num_layers, "parallel.cpu_offloading_num_layers",
           f"must be below num_layers={m.num_layers} (Megatron transformer_config.py)")
    _check(p.pp == 1, "parallel.cpu_offloading",
           "Megatron: no support for pipeline parallelism with CPU offloading")
    _check(p.recompute_granularity == "none", "parallel.cpu_offloading",
           "Megatron: CPU offloading does not work with activation recomputation")


def _validate_overlap(p: Parallel) -> None:
    """Megatron-LM's own checks (arguments.py, schedules.py) on the overlap switches."""
    _check(not p.overlap_p2p_communication or p.schedule_name == "interleaved",
           "parallel.overlap_p2p_communication", "needs the interleaved schedule (Megatron: "
           "non-interleaved pipelining does not support overlapping p2p communication)")
    _check(not p.overlap_param_gather or (p.distributed_optimizer and p.overlap_grad_reduce),
           "parallel.overlap_param_gather", "needs distributed_optimizer and overlap_grad_reduce")


def _validate_recompute_method(m: Model, p: Parallel) -> None:
    """Megatron's --recompute-method/--recompute-num-layers: full granularity only; uniform
    groups must tile each model chunk's layers, block cannot exceed them (transformer_block.py)."""
    method, n = p.recompute_method, p.recompute_num_layers
    _positive("parallel", p, ("recompute_num_layers",))
    if method is not None:
        _choice("parallel.recompute_method", method, RECOMPUTE_METHOD_CHOICES)
    if p.recompute_granularity != "full":
        for name in ("recompute_method", "recompute_num_layers"):
            _check(getattr(p, name) is None, f"parallel.{name}",
                   f"only applies to recompute_granularity full, not {p.recompute_granularity}")
        return
    n = n or 1
    chunk_sizes = (virtual_stage_layer_counts(m, p) if p.uneven_pipeline else
                   (p.num_layers_per_virtual_pipeline_stage
                    or m.num_layers // p.pp // model_chunks(m, p),))
    for per_chunk in sorted(set(chunk_sizes)):
        if method == "block":
            _check(n <= per_chunk, "parallel.recompute_num_layers",
                   f"block recomputes {n} layers but each model chunk has {per_chunk}")
        else:
            _check(per_chunk % n == 0, "parallel.recompute_num_layers",
                   f"uniform groups of {n} do not divide the {per_chunk} layers of each model "
                   "chunk")


RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm")  # Megatron's names for a dense layer
MOE_RECOMPUTE_MODULES = ("moe", "moe_act", "shared_experts")  # and for a MoE layer


def _validate_recompute_modules(p: Parallel, moe: bool = False) -> None:
    """--recompute-modules, checked (and used) under selective granularity only, as Megatron's
    transformer_config.py does: its module names of the dense layer, and of a MoE layer in a
    MoE model (moe, moe_act, shared_experts; docs/moe.md); an empty list recomputes nothing."""
    if p.recompute_modules is None or p.recompute_granularity != "selective":
        return
    known = RECOMPUTE_MODULES + (MOE_RECOMPUTE_MODULES if moe else ())
    names = p.recompute_modules.split()
    for name in names:
        _check(name in known, "parallel.recompute_modules",
               f"{name!r} is not one of {', '.join(known)}")
        _check(names.count(name) == 1, "parallel.recompute_modules", f"{name!r} is named twice")


def _validate_schedule(m: Model, p: Parallel) -> None:
    """Interleaving needs virtual stages that tile the layers and m a multiple of p."""
    virtual = p.num_layers_per_virtual_pipeline_stage
    _positive("parallel", p, ("num_virtual_stages_per_pipeline_rank",))
    if p.schedule_name != "interleaved":
        _check(virtual is None, "parallel.num_layers_per_virtual_pipeline_stage",
               f"only applies to the interleaved schedule, not {p.schedule_name}")
        _check(p.num_virtual_stages_per_pipeline_rank is None,
               "parallel.num_virtual_stages_per_pipeline_rank",
               f"only applies to the interleaved schedule, not {p.schedule_name}")
        return
    chunks = p.num_virtual_stages_per_pipeline_rank
    _check(virtual is None or chunks is None, "parallel.num_virtual_stages_per_pipeline_rank",
           "give it or num_layers_per_virtual_pipeline_stage, not both (Megatron)")
    _check(virtual is not None or chunks is not None, "parallel.schedule",
           "interleaved needs num_layers_per_virtual_pipeline_stage")
    _check(p.pp > 1, "parallel.schedule", "interleaved needs pipeline_model_parallel_size > 1")
    if chunks is not None:
        _check(chunks > 1, "parallel.num_virtual_stages_per_pipeline_rank",
               "interleaving needs 2 or more chunks per stage")
        if not p.uneven_pipeline:
            _check(m.num_layers // p.pp % chunks == 0,
                   "parallel.num_virtual_stages_per_pipeline_rank",
                   f"{chunks} chunks do not divide the {m.num_layers // p.pp} layers of each "
                   "pipeline stage")
        _check(p.num_micro_batches % p.pp == 0, "parallel.global_batch_size",
               f"interleaving needs the {p.num_micro_batches} micro-batches to be a multiple of "
               f"pipeline_model_parallel_size={p.pp}")
        return
    per_stage = (m.num_layers + p.account_for_embedding_in_pipeline_split
                 + p.account_for_loss_in_pipeline_split) // p.pp
    _check(per_stage % virtual == 0, "parallel.num_layers_per_virtual_pipeline_stage",
           f"{virtual} does not divide the {per_stage} layers of each pipeline stage")
    _check(p.num_micro_batches % p.pp == 0, "parallel.global_batch_size",
           f"interleaving needs the {p.num_micro_batches} micro-batches to be a multiple of "
           f"pipeline_model_parallel_size={p.pp}")


def validate_cluster(c: Cluster, p: Parallel) -> None:
    """The cluster must exist and hold every rank."""
    gpu_profile(c.gpu)  # a known GPU profile (or a readable file): else one error line
    if c.system is not None:
        system_profile(c.system)
    _choice("cluster.nccl_algo", c.nccl_algo, NCCL_ALGO_CHOICES)
    _choice("cluster.nccl_proto", c.nccl_proto, NCCL_PROTO_CHOICES)
    _positive("cluster", c, ("gpus_per_node", "nodes", "nvlink_bandwidth_GBps",
                             "ib_bandwidth_GBps"))
    for name in ("nvlink_latency_us", "ib_latency_us", "transfer_overhead_us"):
        _check(getattr(c, name) >= 0, f"cluster.{name}", "must not be negative")
    for name in ("nvlink_efficiency", "ib_efficiency"):
        _check(0 < getattr(c, name) <= 1, f"cluster.{name}", "must be in (0, 1]")
    _check(p.world_size <= c.num_gpus, "cluster.nodes",
           f"the layout needs {'t*cp*p*d' if p.cp > 1 else 't*p*d'}={p.world_size} GPUs but "
           f"{c.nodes} node(s) of "
           f"{c.gpus_per_node} hold {c.num_gpus}")


FP8_FORMAT_CHOICES = ("e4m3", "hybrid")
FP8_RECIPE_CHOICES = ("delayed", "tensorwise", "blockwise", "mxfp8")
MAIN_GRADS_DTYPE_CHOICES = ("fp32", "bf16")
MAIN_PARAMS_DTYPE_CHOICES = ("fp32", "fp16")
EXP_AVG_DTYPE_CHOICES = ("fp32", "fp16", "fp8")


def validate_precision(p: Parallel, c: Cluster) -> None:
    """FP8 needs FP8 tensor cores (Hopper and later), MXFP8 Blackwell (Transformer Engine
    transformer_engine/pytorch/fp8.py check_mxfp8_support); state dtypes other than fp32 need
    the precision-aware optimizer (Megatron-LM arguments.py)."""
    if p.fp8_format is not None:
        _choice("parallel.fp8_format", p.fp8_format, FP8_FORMAT_CHOICES)
        gpu = gpu_profile(c.gpu)
        _check(gpu.peak_fp8_flops is not None, "parallel.fp8_format",
               f"{gpu.name} has no FP8 tensor cores (FP8 GEMMs need Hopper or later: "
               f"h100-sxm-80gb, h200-sxm-141gb, b200, gb200)")
        _check(p.fp8_recipe != "mxfp8" or gpu.nvlink_generation >= 5, "parallel.fp8_recipe",
               f"mxfp8 needs Blackwell (b200, gb200); {gpu.name} is not")
    _choice("parallel.fp8_recipe", p.fp8_recipe, FP8_RECIPE_CHOICES)
    _check(not p.fp8_param_gather or p.fp8_format is not None, "parallel.fp8_param_gather",
           "needs fp8_format (FP8 parameters are FP8 training's)")
    for name, choices in (("main_grads_dtype", MAIN_GRADS_DTYPE_CHOICES),
                          ("main_params_dtype", MAIN_PARAMS_DTYPE_CHOICES),
                          ("exp_avg_dtype", EXP_AVG_DTYPE_CHOICES),
                          ("exp_avg_sq_dtype", EXP_AVG_DTYPE_CHOICES)):
        value = getattr(p, name)
        _choice(f"parallel.{name}", value, choices)
        _check(value == "fp32" or p.use_precision_aware_optimizer, f"parallel.{name}",
               f"{value} needs use_precision_aware_optimizer (Megatron-LM)")


def validate(s: Scenario) -> None:
    """Every field finite and in range (simsp.scenario.bounds), then every cross-field check; raises
    UserError naming the first bad field."""
    check_ranges({name: getattr(s, name) for name in SECTIONS})
    validate_model(s.model)
    validate_parallel(s.model, s.parallel)
    validate_cluster(s.cluster, s.parallel)
    validate_precision(s.parallel, s.cluster)
    _choice("run.mode", s.run.mode, MODE_CHOICES)
    _choice("run.numeric_dtype", s.run.numeric_dtype, DTYPE_CHOICES)
    _check(0 <= s.run.seed < 2**32, "run.seed", f"must be in [0, 2**32), got {s.run.seed}")
    _check(s.run.name.isprintable() and len(s.run.name) <= 200, "run.name",
           "must be printable text of at most 200 characters")
    _check(not s.parallel.cpu_offloading or gpu_profile(s.cluster.gpu).host_link_GBps,
           "parallel.cpu_offloading", f"GPU profile {s.cluster.gpu} has no host_link_GBps")
    _check(not (s.parallel.distributed_optimizer and s.run.mode == "numeric"
                and s.parallel.fsdp is None),
           "parallel.distributed_optimizer", "is modelled in meta mode only (use --mode meta)")
    _check(s.model.moe_routing_imbalance == 0 or s.run.mode == "meta",
           "model.moe_routing_imbalance", "is meta mode's routing model (numeric mode routes "
           "the real tokens): use --mode meta")


def with_overrides(s: Scenario, **sections) -> Scenario:
    """A copy with some fields replaced, e.g. with_overrides(s, parallel={"tensor_model_parallel_size": 2})."""
    parts = {name: replace(getattr(s, name), **values) for name, values in sections.items()}
    result = replace(s, **parts)
    validate(result)
    return result


# Megatron DDP's gradient bucket size (megatron/core/distributed/distributed_data_parallel.py):
# a property of the configuration, read by the work estimate (scenario/bounds.py) and the buckets
# (training/data_parallel/grad_buckets.py) alike.
BUCKET_MIN_PARAMS = 40_000_000  # Megatron DDP default bucket size: max(40M, 1M·d) parameters
BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def bucket_size(d: int, overlap_grad_reduce: bool, given: int | None = None) -> int | None:
    """Megatron DDP: --ddp-bucket-size or max(40M, 1M·d) parameters; unlimited without
    --overlap-grad-reduce (distributed_data_parallel.py)."""
    if not overlap_grad_reduce:
        return None
    return given or max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * d)
