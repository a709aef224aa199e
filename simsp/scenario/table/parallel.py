"""The [parallel] rows of the field table: Megatron-LM's layout (t, p, d, SP, CP, EP), batches,
the pipeline schedule and split, recompute, data-parallel overlap and sharding, and precision.

Names, meanings and defaults are Megatron-LM's (megatron/training/arguments.py); docs/MODEL.md,
docs/context-parallel.md, docs/fsdp.md, docs/moe.md and docs/hardware.md say what each does.
"""

from simsp.scenario.table.row import Bound, Field, Switch

RECOMPUTE_CHOICES = ("none", "selective", "full")
RECOMPUTE_METHOD_CHOICES = ("uniform", "block")
SCHEDULE_CHOICES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev",
                    "dualpipe")  # docs/schedules.md, docs/dualpipe.md
# Megatron-LM --cp-comm-type (Transformer Engine's cp_comm_type)
CP_COMM_TYPE_CHOICES = ("p2p", "a2a", "allgather", "a2a+p2p")
# Sharded data parallelism: Megatron-LM --data-parallel-sharding-strategy (docs/fsdp.md)
FSDP_STRATEGY_CHOICES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
MOE_DISPATCHER_CHOICES = ("allgather", "alltoall", "flex")  # --moe-token-dispatcher-type
# FP8 training and optimizer-state precision (Transformer Engine names; scenario/precision.py)
FP8_FORMAT_CHOICES = ("e4m3", "hybrid")  # hybrid: E4M3 forward, E5M2 gradients
FP8_RECIPE_CHOICES = ("delayed", "tensorwise", "blockwise", "mxfp8")
TE_VERSION_CHOICES = ("1.8",)
FP8_AMAX_COMPUTE_ALGO_CHOICES = ("most_recent", "max")  # Megatron-LM arguments.py
# Megatron-LM transformer_config.py cuda_graph_impl (docs/launch.md)
CUDA_GRAPH_IMPL_CHOICES = ("none", "local", "transformer_engine", "full_iteration")
MAIN_GRADS_DTYPE_CHOICES = ("fp32", "bf16")
MAIN_PARAMS_DTYPE_CHOICES = ("fp32", "fp16")
EXP_AVG_DTYPE_CHOICES = ("fp32", "fp16", "fp8")

SUPERPOD_SCALE = "a DGX SuperPOD-scale job; far beyond it the simulation cannot finish"

PARALLEL = (
    Field("parallel", "tensor_model_parallel_size", int, 1, "tensor-parallel size t (GPUs)", "t",
          bound=Bound(1, 4096, "GPUs", SUPERPOD_SCALE)),
    Field("parallel", "pipeline_model_parallel_size", int, 1, "pipeline-parallel size p (stages)",
          "p", bound=Bound(1, 4096, "GPUs", SUPERPOD_SCALE)),
    Field("parallel", "data_parallel_size", int, 1, "data-parallel size d (model replicas)", "d",
          bound=Bound(1, 32768, "GPUs", SUPERPOD_SCALE)),
    Field("parallel", "sequence_parallel", bool, False, switches=(
        Switch("--sequence-parallel", True,
               "shard layer norms and dropout along the sequence (K22 §4.2.2)", "sp"),
        Switch("--no-sequence-parallel", False, "turn off a scenario's sequence parallelism",
               "nosp"))),
    # Context parallelism (docs/context-parallel.md)
    Field("parallel", "context_parallel_size", int, 1, "context-parallel size cp (GPUs sharing "
          "each sequence)", "cp", bound=Bound(1, 4096, "GPUs", SUPERPOD_SCALE)),
    Field("parallel", "cp_comm_type", str, "p2p", "how CP ranks exchange attention inputs (p2p: "
          "ring; a2a: Ulysses)", "cpcomm", choices=CP_COMM_TYPE_CHOICES),
    # space-separated (a2a size, p2p size) of --cp-comm-type a2a+p2p, product cp
    Field("parallel", "hierarchical_context_parallel_sizes", str, None, "a2a+p2p: the a2a (inner) "
          "and p2p (outer) group sizes, product cp (default: none)", "hcp", words=True),
    Field("parallel", "recompute_granularity", str, "none", "activation recomputation (K22 §4-5)",
          "rc-", choices=RECOMPUTE_CHOICES),
    Field("parallel", "recompute_method", str, None, "full recompute: uniform or block (Megatron; "
          "default: uniform)", "rm-", choices=RECOMPUTE_METHOD_CHOICES),
    Field("parallel", "recompute_num_layers", int, None, "layers per recompute group/block "
          "(Megatron; default: 1)", "rnl",
          bound=Bound(1, 4096, "layers", "at most model.num_layers")),
    Field("parallel", "micro_batch_size", int, 1, "micro-batch size b (samples)", "mbs",
          bound=Bound(1, 65536, "samples", "far above any GPU's memory")),
    Field("parallel", "global_batch_size", int, None, "samples per iteration B (default: b x d, "
          "one micro-batch per replica)", "gbs",
          bound=Bound(1, 16777216, "samples", "16M samples per iteration")),
    Field("parallel", "num_layers_per_virtual_pipeline_stage", int, None,
          "layers per model chunk of the interleaved schedule (default: not interleaved)", "vp",
          bound=Bound(1, 4096, "layers", "at most model.num_layers")),
    Field("parallel", "schedule", str, None, "pipeline schedule (default: interleaved with "
          "virtual stages, else 1f1b)", choices=SCHEDULE_CHOICES),
    Field("parallel", "distributed_optimizer", bool, False, switches=(
        Switch("--use-distributed-optimizer", True,
               "shard optimizer state over data-parallel ranks (ZeRO-1)", "distopt",
               aliases=("--distributed-optimizer",)),)),  # simsp's older name
    # Runtime switches (docs/MODEL.md#runtime-mechanisms): p2p, scatter/gather, DP overlap
    Field("parallel", "overlap_p2p_communication", bool, False, switches=(
        Switch("--overlap-p2p-communication", True,
               "overlap pipeline sends/receives with compute", "p2pov"),)),
    Field("parallel", "tp_comm_overlap", bool, False, switches=(
        Switch("--tp-comm-overlap", True, "Transformer Engine's TP communication overlap "
               "(userbuffers; needs SP; docs/tp-overlap.md)", "tpov"),)),
    Field("parallel", "tp_comm_overlap_cfg", str, None, "a YAML or TOML file of per-GEMM "
          "userbuffers methods, as TE's ub_cfgs (default: TE's own; docs/tp-overlap.md)", None),
    # Megatron-LM --tp-comm-overlap-rs-dgrad (arguments.py 93da800: TE's ub_overlap_rs_dgrad)
    Field("parallel", "tp_comm_overlap_rs_dgrad", bool, False, switches=(
        Switch("--tp-comm-overlap-rs-dgrad", True, "TE's reduce-scatter overlap of the qkv and "
               "fc1 dgrad GEMMs (their file method pipeline or ring_exchange; docs/tp-overlap.md)",
               "rsdgrad"),)),
    Field("parallel", "scatter_gather_tensors_in_pipeline", bool, True, switches=(
        Switch("--no-scatter-gather-tensors-in-pipeline", False,
               "send whole (not TP-scattered) pipeline tensors", "nosg"),)),
    Field("parallel", "overlap_grad_reduce", bool, False, switches=(
        Switch("--overlap-grad-reduce", True, "overlap DP gradient reduction with backward",
               "ovgr"),)),
    Field("parallel", "overlap_param_gather", bool, False, switches=(
        Switch("--overlap-param-gather", True, "overlap distributed-optimizer parameter all-gather",
               "ovpg"),)),
    # Megatron-LM arguments.py (d98e8a64): chunk 0's optimizer step, then its all-gather
    Field("parallel", "overlap_param_gather_with_optimizer_step", bool, False, switches=(
        Switch("--overlap-param-gather-with-optimizer-step", True, "interleaved "
               "--overlap-param-gather: the first model chunk's all-gather issued right after "
               "its own optimizer step, beside the other chunks' (docs/MODEL.md)", "ovpgstep"),)),
    # Megatron-LM --ddp-average-in-collective (param_and_grad_buffer.py: ReduceOp.AVG)
    Field("parallel", "ddp_average_in_collective", bool, False, switches=(
        Switch("--ddp-average-in-collective", True, "divide the DP gradients by d inside the "
               "collective (NCCL's average), not by a scale kernel before it (docs/MODEL.md)",
               "avgcoll"),)),
    # Megatron-LM --no-align-grad-reduce (training.py grad_sync_func; default on)
    Field("parallel", "align_grad_reduce", bool, True, switches=(
        Switch("--no-align-grad-reduce", False, "--overlap-grad-reduce: reduce buckets as the "
               "last backward makes them on every stage, not chunk-wise (docs/MODEL.md)",
               "noagr"),)),
    # Megatron-LM --no-align-param-gather (arguments.py; forced off without interleaving)
    Field("parallel", "align_param_gather", bool, True, switches=(
        Switch("--no-align-param-gather", False, "interleaved --overlap-param-gather: each chunk "
               "gathers at its first forward, not a chunk ahead (docs/MODEL.md)", "noapg"),)),
    Field("parallel", "ddp_bucket_size", int, None, "data-parallel gradient bucket (parameters; "
          "default: max(40M, 1M x d) with --overlap-grad-reduce, else one bucket per chunk)",
          "bucket", bound=Bound(1, 10**13, "parameters", "10x a 1T model's parameters")),
    # NeMo's optim.bucket_cap_mb for Apex DistributedFusedAdam (training/data_parallel/
    # apex_buckets.py)
    Field("parallel", "bucket_cap_mb", float, None, "Apex DistributedFusedAdam's buckets as NeMo "
          "lays them out: per layer, of this many MiB of reduced gradients each, reduced and "
          "gathered whole; the embeddings' gradients reduced in fp32 (default: Megatron DDP's "
          "buckets; docs/MODEL.md)", "capmb",
          bound=Bound(0.001, 10**6, "MiB", "a bucket of at most a terabyte")),
    Field("parallel", "accumulate_allreduce_grads_in_fp32", bool, True, switches=(
        Switch("--accumulate-allreduce-grads-in-fp32", True, "reduce gradients in fp32",
               "fp32grad"),
        Switch("--no-accumulate-allreduce-grads-in-fp32", False, "reduce gradients in bf16",
               "nofp32grad"))),
    # Megatron-LM --grad-reduce-in-bf16 (arguments.py: accumulate_allreduce_grads_in_fp32 =
    # False, so distributed_data_parallel.py builds the gradient buffer in the parameters' BF16)
    Field("parallel", "grad_reduce_in_bf16", bool, False, switches=(
        Switch("--grad-reduce-in-bf16", True, "the DP gradient buffer (main gradients) in bf16: "
               "accumulated, zeroed, reduced and read by the optimizer at 2 bytes "
               "(docs/MODEL.md)", "bf16grad"),)),
    # FP8 GEMMs (fp8_format None: BF16) and optimizer-state dtypes (docs/hardware.md)
    Field("parallel", "fp8_format", str, None, "FP8 GEMMs (Transformer Engine): e4m3, or hybrid "
          "(E5M2 gradients) (default: off, BF16)", "fp8-", choices=FP8_FORMAT_CHOICES),
    Field("parallel", "fp8_recipe", str, "delayed", "FP8 scaling: per-tensor delayed or current "
          "(tensorwise), 128-blocks, or MXFP8 (Blackwell)", "rcp-", choices=FP8_RECIPE_CHOICES),
    Field("parallel", "fp8_amax_history_len", int, 1, "delayed scaling: steps of amax history "
          "kept per FP8 tensor (fp32, Transformer Engine's DelayedScaling)", "amaxh",
          bound=Bound(1, 1 << 20, "steps", "a history of at least one step")),
    Field("parallel", "fp8_amax_compute_algo", str, "most_recent", "delayed scaling: the scale "
          "from the most recent amax or the history's max", "amaxalg-",
          choices=FP8_AMAX_COMPUTE_ALGO_CHOICES),
    # Transformer Engine 1.8 (NeMo 24.07's): LayerNormLinear and LayerNormMLP write the FP8 norm
    # output row-wise only and transpose it in the backward (module/layernorm_linear.py and
    # layernorm_mlp.py at v1.8: tex.fp8_transpose(ln_out_total) before the wgrad GEMM)
    Field("parallel", "te_version", str, None, "Transformer Engine release where its FP8 kernels "
          "differ from today's: 1.8, the FP8 norm output written row-wise and transposed in the "
          "backward (default: today's TE, both directions from the norm)", "te-",
          choices=TE_VERSION_CHOICES),
    Field("parallel", "fp8_param_gather", bool, False, switches=(
        Switch("--fp8-param-gather", True, "FP8 parameters: no BF16 weight beside the FP8 copy",
               "fp8pg"),)),
    Field("parallel", "fp8_dot_product_attention", bool, False, switches=(
        Switch("--fp8-dot-product-attention", True, "the attention core in FP8 (cuDNN; "
               "docs/attention_kernels.md)", "fp8dpa"),)),
    # CUDA graphs (Megatron-LM arguments.py / transformer_config.py; docs/launch.md)
    Field("parallel", "cuda_graph_impl", str, "none", "CUDA graphs: none, local (Megatron-Core), "
          "transformer_engine (TE make_graphed_callables), full_iteration (the forward-backward "
          "as one graph)", "cg-", choices=CUDA_GRAPH_IMPL_CHOICES),
    Field("parallel", "cuda_graph_scope", str, None, "per-layer CUDA graphs: what each captures, "
          "among attn mlp moe moe_router moe_preprocess mamba, or full (default: the whole "
          "layer)", "cgs-", words=True),
    Field("parallel", "cuda_graph_modules", str, None, "Megatron's newer name of "
          "--cuda-graph-scope (default: the whole layer)", "cgm-", words=True),
    Field("parallel", "enable_cuda_graph", bool, False, switches=(
        Switch("--enable-cuda-graph", True, "deprecated Megatron spelling of --cuda-graph-impl "
               "local", "cg"),)),
    Field("parallel", "external_cuda_graph", bool, False, switches=(
        Switch("--external-cuda-graph", True, "deprecated Megatron spelling of "
               "--cuda-graph-impl transformer_engine", "tecg"),)),
    # Apex DistributedFusedAdam's store_param_remainders, as NeMo sets it for an fp32 optimizer
    # over BF16 weights (megatron_base_model.py setup_optimization); Megatron-Core's
    # OptimizerConfig.store_param_remainders (TE FusedAdam) is the same storage
    Field("parallel", "store_param_remainders", bool, False, switches=(
        Switch("--store-param-remainders", True, "the fp32 master weights kept as the 16 low "
               "bits their BF16 weights lack: 2 bytes of optimizer state per parameter, the step "
               "reading and writing weight and remainder (docs/MODEL.md)", "remainders"),)),
    Field("parallel", "use_precision_aware_optimizer", bool, False, switches=(
        Switch("--use-precision-aware-optimizer", True, "optimizer states in the dtypes given",
               "pao"),)),
    Field("parallel", "main_grads_dtype", str, "fp32", "main gradient dtype (precision-aware "
          "optimizer)", "mg-", choices=MAIN_GRADS_DTYPE_CHOICES),
    Field("parallel", "main_params_dtype", str, "fp32", "master parameter dtype (precision-aware "
          "optimizer)", "mp-", choices=MAIN_PARAMS_DTYPE_CHOICES),
    Field("parallel", "exp_avg_dtype", str, "fp32", "Adam first moment dtype (precision-aware "
          "optimizer)", "m1-", choices=EXP_AVG_DTYPE_CHOICES),
    Field("parallel", "exp_avg_sq_dtype", str, "fp32", "Adam second moment dtype (precision-aware "
          "optimizer)", "m2-", choices=EXP_AVG_DTYPE_CHOICES),
    # Uneven pipeline stages (Megatron-LM transformer_block.py get_num_layers_to_build)
    Field("parallel", "decoder_first_pipeline_num_layers", int, None, "layers of the first "
          "pipeline stage (default: an even split)", "first",
          bound=Bound(1, 4096, "layers", "at most model.num_layers")),
    Field("parallel", "decoder_last_pipeline_num_layers", int, None, "layers of the last pipeline "
          "stage (default: an even split)", "last",
          bound=Bound(1, 4096, "layers", "at most model.num_layers")),
    Field("parallel", "account_for_embedding_in_pipeline_split", bool, False, switches=(
        Switch("--account-for-embedding-in-pipeline-split", True,
               "count the embedding as a layer when splitting the pipeline", "acemb"),)),
    Field("parallel", "account_for_loss_in_pipeline_split", bool, False, switches=(
        Switch("--account-for-loss-in-pipeline-split", True,
               "count the loss as a layer when splitting the pipeline", "acloss"),)),
    Field("parallel", "num_virtual_stages_per_pipeline_rank", int, None, "model chunks per stage "
          "of the interleaved schedule (default: from the layers per virtual stage)", "vs",
          bound=Bound(1, 4096, "chunks", "at most model.num_layers")),
    Field("parallel", "pipeline_model_parallel_layout", str, None, "every virtual stage's "
          "layers, e.g. 'Et|(tt|)*30,mL': E embedding, t layer, m MTP, L loss, | between "
          "stages (Megatron; docs/pipeline-layout.md; default: the split above)", None),
    Field("parallel", "recompute_modules", str, None, "selective recompute: modules among "
          "core_attn, mlp, layernorm, space-separated in one argument (default: core_attn)",
          "rmod-", words=True),
    # Sharded data parallelism and activation offload (docs/fsdp.md)
    Field("parallel", "use_megatron_fsdp", bool, False, switches=(
        Switch("--use-megatron-fsdp", True,
               "Megatron-FSDP: per-layer units, sharded by the strategy", "mfsdp"),)),
    Field("parallel", "data_parallel_sharding_strategy", str, "no_shard",
          "Megatron-FSDP: what is sharded over DP (ZeRO-0..3)", "shard-",
          choices=FSDP_STRATEGY_CHOICES),
    Field("parallel", "use_torch_fsdp2", bool, False, switches=(
        Switch("--use-torch-fsdp2", True,
               "PyTorch FSDP2 fully_shard per layer (fp32 sharded parameters)", "fsdp2"),)),
    Field("parallel", "cpu_offloading", bool, False, switches=(
        Switch("--cpu-offloading", True,
               "move saved activations to host memory and back before backward", "offload"),)),
    Field("parallel", "cpu_offloading_num_layers", int, 0, "layers whose saved activations go to "
          "host memory", "offl", bound=Bound(0, 4096, "layers", "at most model.num_layers")),
    # Expert parallelism (docs/moe.md)
    Field("parallel", "expert_model_parallel_size", int, 1, "expert-parallel size (GPUs sharing a "
          "MoE layer's experts)", "ep", bound=Bound(1, 4096, "GPUs", "at most the experts' limit")),
    Field("parallel", "expert_tensor_parallel_size", int, None, "tensor-parallel size of each "
          "expert (default: t)", "etp", bound=Bound(1, 4096, "GPUs", SUPERPOD_SCALE)),
    Field("parallel", "moe_token_dispatcher_type", str, "allgather", "how tokens reach their "
          "experts' ranks: all-gather / reduce-scatter, all-to-all, or flex (DeepEP, with "
          "--moe-enable-deepep; docs/deepep.md)", "disp-", choices=MOE_DISPATCHER_CHOICES),
    Field("parallel", "moe_enable_deepep", bool, False, switches=(
        Switch("--moe-enable-deepep", True,
               "the flex dispatcher's DeepEP backend: two-hop RDMA-then-NVLink dispatch, "
               "tokens deduplicated per node (docs/deepep.md)", "deepep"),)),
    Field("parallel", "moe_grouped_gemm", bool, False, switches=(
        Switch("--moe-grouped-gemm", True,
               "each rank's experts as one grouped GEMM (default: a loop of GEMMs)", "ggemm"),)),
    # Megatron-Core's EP all-to-all overlap (transformer_config.py; docs/moe.md)
    Field("parallel", "overlap_moe_expert_parallel_comm", bool, False, switches=(
        Switch("--overlap-moe-expert-parallel-comm", True, "hide one micro-batch's expert "
               "dispatch/combine behind another's compute (Megatron's combined 1F1B)", "epov"),)),
    Field("parallel", "delay_wgrad_compute", bool, False, switches=(
        Switch("--delay-wgrad-compute", True, "with --overlap-moe-expert-parallel-comm: "
               "weight gradients deferred after the input gradients", "dwgrad"),)),
)
