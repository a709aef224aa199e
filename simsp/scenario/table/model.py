"""The [model] rows of the field table: the GPT shape (K22 notation: L layers, h hidden, a heads,
s sequence, v vocabulary), Llama-class layers, mixture of experts, MLA and multi-token prediction.

Names, meanings and defaults are Megatron-LM's (megatron/training/arguments.py); docs/llama.md,
docs/moe.md, docs/mla.md and docs/mtp.md say what each does in simsp.
"""

from simsp.scenario.table.row import INT_OR_STR, Bound, Field, Switch

NORMALIZATION_CHOICES = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDING_CHOICES = ("learned_absolute", "rope", "none")
ATTENTION_BACKEND_CHOICES = ("unfused", "flash", "fused", "local", "auto")  # Megatron's AttnBackend
MOE_SCORE_CHOICES = ("softmax", "sigmoid")  # --moe-router-score-function
MOE_BALANCING_CHOICES = ("aux_loss", "none")  # --moe-router-load-balancing-type

# The model sizes' limits are ~8x the largest published dense GPT (1T: L 128, h 25600).
MODEL = (
    Field("model", "num_layers", int, 2, "transformer layers L", "L",
          bound=Bound(1, 4096, "layers", "32x the 1T model's 128 layers")),
    Field("model", "hidden_size", int, 64, "hidden size h (elements)", "h",
          bound=Bound(1, 262144, "elements", "10x the 1T model's 25600")),
    Field("model", "num_attention_heads", int, 4, "attention heads a", "a",
          bound=Bound(1, 8192, "heads", "50x the 1T model's 160")),
    Field("model", "seq_length", int, 32, "sequence length s (tokens)", "s",
          bound=Bound(1, 1048576, "tokens", "a 1M-token context")),
    Field("model", "vocab_size", int, 128, "vocabulary size v (tokens)", "v",
          bound=Bound(2, 4194304, "tokens", "one token makes the loss 0; 80x GPT 51200")),
    # Megatron pads v to a multiple of this times t
    Field("model", "make_vocab_size_divisible_by", int, 128, "pad the vocabulary to a multiple of "
          "this x t (tokens)", "vdiv",
          bound=Bound(1, 65536, "tokens", "512x Megatron's default 128")),
    Field("model", "ffn_hidden_size", int, None, "MLP width (elements; default 4 x hidden size)",
          "ffn", bound=Bound(1, 1048576, "elements", "4x the largest hidden size")),
    Field("model", "hidden_dropout", float, 0.1, "dropout probability after attention and MLP, in "
          "[0, 1)", "hd",
          bound=Bound(0.0, 1.0, "probability", "a probability (1 itself excluded)")),
    Field("model", "attention_dropout", float, 0.1, "dropout probability of the attention scores, "
          "in [0, 1)", "ad",
          bound=Bound(0.0, 1.0, "probability", "a probability (1 itself excluded)")),
    # Llama-class layers (docs/llama.md)
    Field("model", "group_query_attention", bool, False, switches=(
        Switch("--group-query-attention", True, "group-query attention (with --num-query-groups)",
               "gqa"),)),
    Field("model", "num_query_groups", int, None, "KV head groups G of group-query attention "
          "(default: one per head)", "G",
          bound=Bound(1, 8192, "groups", "at most the heads' limit")),
    Field("model", "kv_channels", int, None, "head dimension d (elements; default: hidden size / "
          "heads)", "kv", bound=Bound(1, 65536, "elements", "512x Llama's head dimension 128")),
    Field("model", "swiglu", bool, False, switches=(
        Switch("--swiglu", True, "SwiGLU MLP (gate and up projections)", "swiglu"),)),
    Field("model", "squared_relu", bool, False, switches=(
        Switch("--squared-relu", True, "squared ReLU MLP activation, relu(x)² (Megatron-LM "
               "activations.py squared_relu)", "sqrelu"),)),
    Field("model", "normalization", str, "LayerNorm", "layer normalization kind",
          choices=NORMALIZATION_CHOICES),
    Field("model", "norm_epsilon", float, 1e-5, "epsilon of the normalization", "eps",
          bound=Bound(0.0, 1.0, "", "a small positive constant (Llama: 1e-5)")),
    Field("model", "position_embedding_type", str, "learned_absolute", "position embedding", "pos-",
          choices=POSITION_EMBEDDING_CHOICES),
    Field("model", "rotary_base", int, 10000, "RoPE base (theta)", "rb",
          bound=Bound(1, 1e9, "", "2000x Llama 3's 500000")),
    Field("model", "rotary_percent", float, 1.0, "fraction of each head's channels RoPE rotates",
          "rp", bound=Bound(0.0, 1.0, "fraction", "a fraction of the head dimension")),
    Field("model", "untie_embeddings_and_output_weights", bool, False, switches=(
        Switch("--untie-embeddings-and-output-weights", True, "an output layer of its own",
               "untied"),)),
    Field("model", "add_bias_linear", bool, True, switches=(
        Switch("--disable-bias-linear", False, "no biases in linear layers", "nobias"),)),
    Field("model", "attention_backend", str, "unfused", "attention core: unfused or local (s x s "
          "tensors kept), flash (FlashAttention-2), fused (cuDNN) or auto (Transformer Engine's "
          "pick: cuDNN on Hopper+, else flash); docs/attention_kernels.md", "attn-", choices=ATTENTION_BACKEND_CHOICES,
          switches=(Switch("--use-flash-attn", "flash",
                           "FlashAttention (same as --attention-backend flash)", "flash"),)),
    # Megatron-LM's kernel fusions (megatron/training/arguments.py; docs/fusions.md): they
    # change only the element-wise kernels' time, never the numbers
    Field("model", "masked_softmax_fusion", bool, True, switches=(
        Switch("--no-masked-softmax-fusion", False, "unfused core: mask and softmax as two "
               "kernels (fused: one)", "nosmf"),)),
    Field("model", "bias_gelu_fusion", bool, True, switches=(
        Switch("--no-bias-gelu-fusion", False, "bias add and GeLU as two kernels", "nobgf"),)),
    Field("model", "bias_swiglu_fusion", bool, True, switches=(
        Switch("--no-bias-swiglu-fusion", False, "SwiGLU as PyTorch's silu and mul kernels",
               "nobsf"),)),
    Field("model", "apply_rope_fusion", bool, True, switches=(
        Switch("--no-rope-fusion", False, "RoPE as PyTorch's element-wise kernels (fused: one)",
               "noropef"),)),
    Field("model", "cross_entropy_loss_fusion", bool, False, switches=(
        Switch("--cross-entropy-loss-fusion", True, "the loss's fused kernels (Megatron-LM "
               "fusions/fused_cross_entropy.py)", "cef"),)),
    # Mixture of experts (megatron/core/transformer/moe/; docs/moe.md)
    Field("model", "num_experts", int, None, "routed experts of each MoE layer (default: dense "
          "MLPs)", "E", bound=Bound(1, 4096, "experts", "16x DeepSeek-V3's 256")),
    Field("model", "moe_router_topk", int, 2, "experts each token is routed to (default 2)", "topk",
          bound=Bound(1, 4096, "experts", "at most the experts' limit")),
    Field("model", "moe_ffn_hidden_size", int, None, "expert MLP width (elements; default: ffn "
          "hidden size)", "mffn", bound=Bound(1, 1048576, "elements", "as ffn_hidden_size")),
    Field("model", "moe_router_score_function", str, "softmax", "router score function", "score-",
          choices=MOE_SCORE_CHOICES),
    Field("model", "moe_router_load_balancing_type", str, "aux_loss", "load balancing", "lb-",
          choices=MOE_BALANCING_CHOICES),
    Field("model", "moe_aux_loss_coeff", float, 0.0, "coefficient of the load-balancing aux loss "
          "(default 0)", "aux", bound=Bound(0.0, 1000.0, "", "Megatron's examples use 1e-2")),
    # a MoE layer at every i with i % freq == 0, or a pattern (scenario/moe_pattern.py)
    Field("model", "moe_layer_freq", INT_OR_STR, 1, "a MoE layer every N layers from layer 0 "
          "(default 1), or Megatron's per-layer pattern such as \"([0]*3+[1]*58)\"", "mfreq",
          bound=Bound(1, 4096, "layers", "at most the layers' limit")),
    Field("model", "moe_expert_capacity_factor", float, None, "expert capacity factor: tokens "
          "over capacity are dropped (default: dropless)", "cap",
          bound=Bound(0.0, 4096.0, "", "at most every token per expert")),
    Field("model", "moe_pad_expert_input_to_capacity", bool, False, switches=(
        Switch("--moe-pad-expert-input-to-capacity", True,
               "pad every expert's input to its capacity", "pad"),)),
    # Shared experts and simsp's routing model of meta mode (docs/moe.md)
    Field("model", "moe_shared_expert_intermediate_size", int, None, "shared experts' total MLP "
          "width (elements; default: no shared experts)", "shx",
          bound=Bound(1, 1048576, "elements", "as ffn_hidden_size")),
    Field("model", "moe_routing_imbalance", float, 0.0, "simsp's meta-mode routing model: expert "
          "loads ∝ (i+1)^-alpha over a seeded order of the experts (0: balanced)", "imb",
          bound=Bound(0.0, 16.0, "", "Zipf exponent: 16 puts all load on one expert")),
    # Multi-head latent attention (Megatron-LM multi_latent_attention.py, arguments.py
    # _add_mla_args; docs/mla.md): latents r_q, r_kv; per-head widths d_n, d_r, d_v
    Field("model", "multi_latent_attention", bool, False, switches=(
        Switch("--multi-latent-attention", True,
               "multi-head latent attention (DeepSeek-V2/V3; docs/mla.md)", "mla"),)),
    Field("model", "q_lora_rank", int, None, "MLA query latent rank r_q (elements; default: none, "
          "a plain query projection)", "qlr",
          bound=Bound(1, 262144, "elements", "at most the hidden size's limit")),
    Field("model", "kv_lora_rank", int, 32, "MLA key/value latent rank r_kv (elements)", "kvlr",
          bound=Bound(1, 262144, "elements", "at most the hidden size's limit")),
    Field("model", "qk_head_dim", int, 128, "MLA per-head query/key width without RoPE d_n "
          "(elements)", "qkd", bound=Bound(1, 65536, "elements", "as kv_channels")),
    Field("model", "qk_pos_emb_head_dim", int, 64, "MLA RoPE width d_r, one key shared by all "
          "heads (elements)", "qkpd", bound=Bound(1, 65536, "elements", "as kv_channels")),
    Field("model", "v_head_dim", int, 128, "MLA per-head value width d_v (elements)", "vd",
          bound=Bound(1, 65536, "elements", "as kv_channels")),
    # Multi-token prediction (Megatron-LM multi_token_prediction.py; docs/mtp.md)
    Field("model", "mtp_num_layers", int, None, "multi-token prediction depths D on the last "
          "pipeline stage (default: none)", "mtp",
          bound=Bound(1, 4096, "layers", "at most the layers' limit")),
    Field("model", "mtp_loss_scaling_factor", float, 0.1, "weight of the MTP losses, split over "
          "the D depths", "mtpw", bound=Bound(0.0, 1000.0, "", "Megatron's default 0.1")),
)
