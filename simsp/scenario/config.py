"""The frozen configuration: the model, parallel layout, cluster and run sections of a
scenario, made from the field table (simsp/scenario/table/), with their derived quantities.

Every field has the name of its Megatron-LM flag (dashes become underscores), in TOML, in the
dataclasses and on the command line alike. scenario/loading.py builds a Scenario from TOML and
flags; scenario/checks/ holds every cross-field check.
"""

from dataclasses import dataclass, field, replace

from simsp.scenario.moe_pattern import moe_layer_pattern
from simsp.scenario.pipeline_layout import parse_layout
from simsp.scenario.table import SECTION_ROWS


def table_dataclass(cls: type, rows) -> type:
    """`cls` made a frozen dataclass whose fields are `rows` (table Fields), in order, each typed
    and defaulted by its row; the class body holds only the derived properties. A row named
    twice, or named as a member of the class, is an error at import."""
    annotations = {}
    for row in rows:
        if row.name in annotations or row.name in vars(cls):
            raise TypeError(f"{row.path}: a second row, or a member of {cls.__name__}")
        annotations[row.name] = row.annotation
        setattr(cls, row.name, row.default)
    cls.__annotations__ = annotations
    return dataclass(frozen=True)(cls)


def _from_table(section: str):
    """Class decorator: table_dataclass over the table's rows of `section`."""
    return lambda cls: table_dataclass(cls, SECTION_ROWS[section])


@_from_table("model")
class Model:
    """GPT shape (K22 notation: L layers, h hidden, a heads, s sequence, v vocabulary)."""

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
        """A fused core that keeps no s x s tensor (flash, fused, auto); unfused and local
        (Megatron's own unfused path) keep them."""
        return self.attention_backend in ("flash", "fused", "auto")

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


@_from_table("parallel")
class Parallel:
    """Megatron-LM parallel layout: t, p, d, SP, recompute, batches and the pipeline schedule."""

    @property
    def uneven_pipeline(self) -> bool:
        """A Megatron uneven split is asked for. With one stage the accounted embedding and loss
        change nothing: Megatron's get_num_layers_to_build gives it (L + e + l) − e − l = L."""
        accounted = (self.account_for_embedding_in_pipeline_split
                     or self.account_for_loss_in_pipeline_split)
        return (self.decoder_first_pipeline_num_layers is not None
                or self.decoder_last_pipeline_num_layers is not None
                or self.pipeline_model_parallel_layout is not None
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
        if self.pipeline_model_parallel_layout is not None:  # Megatron arguments.py: VPP =
            # the layout's virtual stages / p, and None (1F1B) when that is 1
            stages = len(parse_layout(self.pipeline_model_parallel_layout))
            virtual = stages // self.pp > 1
        return "interleaved" if virtual else "1f1b"


@_from_table("cluster")
class Cluster:
    """DGX A100 nodes: NVLink/NVSwitch inside a node, one HDR InfiniBand NIC per GPU between nodes."""

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@_from_table("run")
class Run:
    """How to execute: numeric (numpy arrays) or meta (shapes only), seed, numeric dtype."""


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


SECTIONS = {"model": Model, "parallel": Parallel, "cluster": Cluster, "run": Run}


def padded_vocab_size(m: Model, t: int) -> int:
    """v rounded up to a multiple of make_vocab_size_divisible_by · t (Megatron-LM
    megatron/training/tokenizer/tokenizer.py `_vocab_size_with_padding`)."""
    multiple = m.make_vocab_size_divisible_by * t
    return -(-m.vocab_size // multiple) * multiple


def one_layer_fields(m: Model) -> dict:
    """Model overrides that cut it to its layer 0 alone (`simsp layer`, the reports' layer
    table): one layer, and a --moe-layer-freq pattern cut to its first entry."""
    fields_ = {"num_layers": 1}
    if isinstance(m.moe_layer_freq, str):
        fields_["moe_layer_freq"] = f"[{moe_layer_pattern(m.moe_layer_freq)[0]}]"
    return fields_


# Megatron DDP's gradient bucket size (megatron/core/distributed/distributed_data_parallel.py):
# a property of the configuration, read by the work estimate (scenario/work.py) and the buckets
# (training/data_parallel/grad_buckets.py) alike.
BUCKET_MIN_PARAMS = 40_000_000  # Megatron DDP default bucket size: max(40M, 1M·d) parameters
BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def bucket_size(d: int, overlap_grad_reduce: bool, given: int | None = None) -> int | None:
    """Megatron DDP: --ddp-bucket-size or max(40M, 1M·d) parameters; unlimited without
    --overlap-grad-reduce (distributed_data_parallel.py)."""
    if not overlap_grad_reduce:
        return None
    return given or max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * d)


def sms_shared(sc) -> bool:
    """Whether communication kernels hold SMs beside compute (engine/sm_share.py): NCCL's
    channels under --sm-contention, TE's userbuffers kernels under --tp-comm-overlap."""
    return sc.cluster.sm_contention or sc.parallel.tp_comm_overlap
