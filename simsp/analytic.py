"""Closed-form formulas of docs/MODEL.md, kept apart from the simulation so tests can compare.

Nothing here is used to *produce* a simulated number; these only cross-check them.
"""

from dataclasses import replace

from simsp.scenario.config import Model, Parallel, Scenario, padded_vocab_size
from simsp.scenario.pipeline_split import model_chunks, virtual_stage_layer_counts


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                           recompute: str = "none", ffn: int | None = None,
                           hidden_dropout: bool = True, attention_dropout: bool = True) -> int:
    """Activation bytes one layer keeps per rank (K22 Table 2; §1 term table).

    K22 assumes dropout on and ffn = 4h; the masks' terms (sbh each, as²b/t) and the 16sbh/t of
    the MLP's 4h tensors are adjusted here when those assumptions do not hold. Full recompute
    keeps the layer input only: 2sbh, or 2sbh/t when SP keeps it sharded.
    """
    f = ffn or 4 * h
    seq_div = t if sp else 1
    if recompute == "full":
        return 2 * s * b * h // seq_div
    masks = 2 * s * b * h if hidden_dropout else 0
    replicated = (8 * s * b * h + masks) // seq_div  # LN inputs, QKV/fc1 inputs, dropout masks
    sharded = (8 * s * b * h + 4 * s * b * f) // t  # q, k, v, proj input, GeLU input and output
    core = 0
    if recompute != "selective":
        # softmax output 2as²b; with dropout also its mask as²b and output 2as²b (K22 5as²b)
        core = (5 if attention_dropout else 2) * a * s * s * b // t
    return replicated + sharded + core


def table2_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str) -> float:
    """K22 Table 2 verbatim (dropout on, ffn 4h), as a float, for the paper's own cases."""
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh
    if recompute == "selective":
        return 34 * sbh / t if sp else sbh * (10 + 24 / t)
    if sp:
        return sbh / t * (34 + 5 * a * s / h)
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def layer_gemm_flops(s: int, b: int, h: int, ffn: int | None = None) -> int:
    """Forward GEMM FLOPs of one layer (K22 App. A): 24bsh² + 4bs²h with ffn = 4h."""
    f = ffn or 4 * h
    return 2 * s * b * h * 3 * h + 2 * b * s * s * h * 2 + 2 * s * b * h * h + 4 * s * b * h * f


def model_flops(m: Model, p: Parallel) -> float:
    """Model FLOPs per iteration: 72BLsh²(1 + s/(6h) + v/(12hL)), B = global batch (K22 §6.3)."""
    B, L, s, h = p.global_batch, m.num_layers, m.seq_length, m.hidden_size
    v = padded_vocab_size(m, p.tp)  # Megatron counts the padded vocabulary's logits
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def iteration_model_flops(m: Model, p: Parallel) -> float:
    """Model FLOPs of the run: K22's formula for the GPT layer, Megatron-LM's
    num_floating_point_operations for the Llama-class variants."""
    return megatron_model_flops(m, p) if m.llama_layer else model_flops(m, p)


def iteration_hardware_flops(m: Model, p: Parallel) -> float:
    """Hardware FLOPs of the run (K22 App. A for GPT, llama_hardware_flops otherwise)."""
    return llama_hardware_flops(m, p) if m.llama_layer else hardware_flops(m, p)


def flops_formula(m: Model) -> str:
    """Which formula iteration_model_flops used, for the reports."""
    return ("Megatron-LM num_floating_point_operations (training.py)" if m.llama_layer
            else "K22 §6.3: 72BLsh²(1 + s/6h + v/12hL)")


def recomputed_layers(m: Model, p: Parallel) -> int:
    """Layers whose forward full recompute re-runs: all of them (uniform), or the first N of
    each of the p·v model chunks (block; Megatron transformer_block.py)."""
    if p.recompute_granularity != "full":
        return 0
    if p.recompute_method != "block":
        return m.num_layers
    return p.pp * model_chunks(m, p) * (p.recompute_num_layers or 1)


def hardware_flops(m: Model, p: Parallel) -> float:
    """Hardware FLOPs: selective adds the attention core again; full adds one forward of each
    recomputed layer, 24Bsh² + 4Bs²h (K22 App. A) — N21's 96BLsh²(1 + s/6h + v/16hL) when
    every layer is recomputed."""
    B, L, s, h = p.global_batch, m.num_layers, m.seq_length, m.hidden_size
    v = padded_vocab_size(m, p.tp)  # Megatron counts the padded vocabulary's logits
    if p.recompute_granularity == "full":
        return model_flops(m, p) + recomputed_layers(m, p) * B * (24 * s * h * h + 4 * s * s * h)
    if p.recompute_granularity == "selective":
        return 72 * B * L * s * h * h * (1 + s / (3 * h) + v / (12 * h * L))
    return model_flops(m, p)


def first_stage_activation_bytes(sc: Scenario) -> float:
    """Stage 0's activation peak: K22 Eq. 5/6 (§4.2.3) with the interleave factor, plus the
    terms outside the layers (K22 §4.3), counted for the micro-batches stage 0 really holds.

    Beyond K22's text: interleaving keeps chunk 0 and its embedding mask for up to 2p
    micro-batches (interleaved_peak_bytes), not p; with p = 1 stage 0 is also the last stage
    and holds one micro-batch's head tensors; full recompute adds the layers whose activations
    are rebuilt during backward (K22 counts stored inputs): one layer, or a group of N
    (--recompute-method uniform), or block's mix.
    Context parallelism: every term at s/cp tokens, plus the K/V block each layer's ring keeps
    for backward (docs/context-parallel.md)."""
    m, p = sc.model, sc.parallel
    full_model = m
    if p.cp > 1:
        m = replace(m, seq_length=m.seq_length // p.cp)
    t, sp = p.tp, p.sequence_parallel
    s, b, h, a = m.seq_length, p.micro_batch_size, m.hidden_size, m.num_attention_heads
    def layer(recompute: str) -> int:
        """One layer's kept bytes under `recompute` in this layout."""
        if m.llama_layer or p.recompute_modules:
            modules = p.recompute_module_set or frozenset(("core_attn",))
            return cp_layer_activation_bytes(full_model, p, recompute, modules)
        return layer_activation_bytes(s, b, h, a, t, sp, recompute, m.ffn,
                                      m.hidden_dropout > 0, m.attention_dropout > 0)
    chunks = chunks_per_stage(m, p)
    counts = [m.num_layers // p.pp // chunks] * chunks  # stage 0's layers per model chunk
    if p.uneven_pipeline:  # Megatron's uneven split: stage 0's own chunks
        counts = list(virtual_stage_layer_counts(m, p)[::p.pp])
    per_layer, whole = layer(p.recompute_granularity), layer("none")
    kept = [chunk_recompute_bytes(p, n, per_layer, whole)[0] for n in counts]
    recomputed = max(chunk_recompute_bytes(p, n, per_layer, whole)[1] for n in counts)
    seq_split = t if sp else 1
    # embedding dropout mask, sbh/t per micro-batch whose chunk 0 is in flight (K22 §4.3)
    mask = s * b * h // seq_split if m.hidden_dropout > 0 else 0
    if p.schedule_name == "interleaved":
        total = float(interleaved_peak_bytes(kept, mask, p.pp, p.num_micro_batches))
    else:
        total = float(kept[0] * _layer_micro_batches(p) + mask * _layer_micro_batches(p))
    head = 0
    if p.pp == 1:  # final LN input, output-projection input, fp32 logits (K22 §4.3)
        head = 4 * s * b * h / seq_split + 4 * s * b * sc.padded_vocab_size / t
    # the head's tensors are freed by its backward before any layer is recomputed
    return total + max(recomputed, head)


def cp_layer_activation_bytes(m: Model, p: Parallel, recompute: str,
                              modules: frozenset) -> int:
    """One Llama-class layer's kept bytes per rank with context parallelism: the layer at s/cp
    tokens plus its ring's saved K/V block (docs/context-parallel.md); at cp 1 the layer's."""
    local = replace(m, seq_length=m.seq_length // p.cp) if p.cp > 1 else m
    return llama_layer_activation_bytes(local, p.micro_batch_size, p.tp, p.sequence_parallel,
                                        recompute, modules) + \
        cp_saved_kv_bytes(local, p, recompute, modules)


def cp_saved_kv_bytes(m: Model, p: Parallel, recompute: str, modules: frozenset) -> int:
    """What a layer's CP attention keeps for backward beyond the layer's own tensors (m at s/cp
    tokens): the ring's K/V block (rank r + 1's), 2·(s/cp)·b·d·2G/t bytes (p2p), or Ulysses'
    head-split output, 2·(s/cp)·b·d·a/t (a2a), both with a2a+p2p (the K/V block only when its
    ring has more than one rank); nothing with allgather, none when recomputed (full, or
    selective core_attn) or at cp 1 (docs/context-parallel.md)."""
    rebuilt = recompute == "full" or (recompute == "selective" and "core_attn" in modules)
    if p.cp == 1 or rebuilt or p.cp_comm_type == "allgather":
        return 0
    ring = p.cp_comm_type == "p2p" or (p.cp_comm_type == "a2a+p2p" and p.hcp_sizes[1] > 1)
    heads = (m.num_attention_heads if p.cp_comm_type in ("a2a", "a2a+p2p") else 0) + \
        (2 * m.query_groups if ring else 0)
    return 2 * m.seq_length * p.micro_batch_size * m.head_dim * heads // p.tp


def interleaved_peak_bytes(chunk_bytes: list, mask: int, p: int, micro_batches: int) -> int:
    """Stage 0's activation peak under Megatron's interleaved 1F1B (schedules.py: warm-up of
    2(p − 1) + (v − 1)p forwards, then one forward and one backward a step, forwards chunk by
    chunk in groups of p micro-batches, backwards from the last chunk): `chunk_bytes` (v,) what
    each chunk keeps per micro-batch, chunk 0 (the embedding's, plus `mask` bytes) possibly
    smaller than the rest. With m = p every forward is warm-up: p of each chunk. Else the peak is
    one of the two steps around chunk 0's first backward: just before it, chunk 0 holds 2p
    micro-batches, the last chunk p − 1 (its first backward is done) and the others p; just
    after, chunk 0 holds 2p − 1 and every other chunk p. With equal chunks the first is K22's
    L·(1 + (p − 1)/(p·v)) layers (§4.2.3) and 2p embedding masks."""
    first, rest = chunk_bytes[0] + mask, chunk_bytes[1:]
    if micro_batches <= p:
        return micro_batches * (first + sum(rest))
    before = 2 * p * first + p * sum(rest[:-1]) + (p - 1) * rest[-1]
    after = (2 * p - 1) * first + p * sum(rest)
    return max(before, after)


def chunks_per_stage(m: Model, p: Parallel) -> int:
    """v: model chunks per pipeline stage (1 unless interleaved)."""
    return model_chunks(m, p)


def chunk_recompute_bytes(p: Parallel, layers: int, per_layer: int, full: int) -> tuple[int, int]:
    """(bytes one model chunk keeps per micro-batch, extra bytes rebuilt at once in backward).

    per_layer: what a layer keeps under the granularity (its input alone under full recompute);
    full: what it keeps without recompute. Megatron's methods (transformer_block.py): uniform
    keeps one input per group of N and rebuilds a whole group, N·full − input (the group's
    input is reused); block keeps N inputs and L_chunk − N whole layers, and rebuilds one layer
    on top of what is still kept only when all are checkpointed (else the freed plain layers
    of the chunk make room first)."""
    if p.recompute_granularity != "full":
        return layers * per_layer, 0
    n = p.recompute_num_layers or 1
    if p.recompute_method == "block":
        return n * per_layer + (layers - n) * full, (full - per_layer) if n == layers else 0
    return layers // n * per_layer, n * full - per_layer


def _layer_micro_batches(p: Parallel) -> int:
    """Micro-batches in flight on stage 0: all m under GPipe, at most p under 1F1B (N21 §2.2)
    and ZB-H1, 2p - 1 under ZB-H2 (arXiv:2401.10241 §2.2; docs/schedules.md)."""
    m = p.num_micro_batches
    if p.schedule_name == "zb-h2":
        return min(2 * p.pp - 1, m)
    return m if p.schedule_name == "gpipe" else min(p.pp, m)


# ---------------------------------------------------------------------------------------------
# Llama-class layers (docs/llama.md derives each term from the tensors the layer keeps)


def llama_layer_activation_bytes(m: Model, b: int, t: int = 1, sp: bool = False,
                                 recompute: str = "none",
                                 modules: frozenset = frozenset(("core_attn",))) -> int:
    """Activation bytes one layer keeps per rank, any variant (docs/llama.md table):
    (8sbh + 2sbh·[hidden dropout]) / t_sp for the LN inputs, QKV/fc1 inputs and masks, plus
    2sb·d·(2a + 2G_kept)/t for q, k, v and proj_input (G_kept = a unfused, whose core expands
    K and V; G with flash), 4sbf/t (GeLU) or 6sbf/t (SwiGLU), and the core: unfused
    (5 or 2)·a·s²·b/t, flash 4·a·s·b/t (fp32 logsumexp). Selective recompute drops the share
    of each of its modules: core_attn the core, layernorm the two norm outputs (4sbh/t_sp),
    mlp the activation's input and output. Full recompute keeps the layer input, 2sbh / t_sp."""
    s, h, a, d, f = m.seq_length, m.hidden_size, m.num_attention_heads, m.head_dim, m.ffn
    seq_div = t if sp else 1
    if recompute == "full":
        return 2 * s * b * h // seq_div
    rebuilt = modules if recompute == "selective" else frozenset()
    masks = 2 * s * b * h if m.hidden_dropout > 0 else 0
    norm_outputs = 0 if "layernorm" in rebuilt else 4 * s * b * h
    replicated = (4 * s * b * h + norm_outputs + masks) // seq_div
    kv_heads = m.query_groups if m.flash else a
    attention = 2 * s * b * d * (2 * a + 2 * kv_heads) // t  # q, proj_input; k, v
    if m.multi_latent_attention:
        attention = mla_attention_bytes(m, b, t, sp)
    mlp = 0 if "mlp" in rebuilt else (6 if m.swiglu else 4) * s * b * f // t
    core = 0
    if "core_attn" not in rebuilt:
        core = (4 * a * s * b if m.flash else
                (5 if m.attention_dropout > 0 else 2) * a * s * s * b) // t
    return replicated + attention + mlp + core


def mla_attention_bytes(m: Model, b: int, t: int = 1, sp: bool = False) -> int:
    """Multi-latent attention's kept tensors per rank besides the LN input and its output and
    the core (docs/mla.md): the four latents 2·s·b·(2r_q + 2r_kv)/t_sp (q down output, q up
    input, kv down output, kv up input; r_q = 0 without a query latent), q and k
    4·s·b·a(d_n + d_r)/t, v and proj_input 4·s·b·a·d_v/t."""
    s, a = m.seq_length, m.num_attention_heads
    latents = 2 * s * b * (2 * (m.q_lora_rank or 0) + 2 * m.kv_lora_rank) // (t if sp else 1)
    heads = 4 * s * b * a * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) // t
    return latents + heads


def llama_parameter_count(m: Model) -> int:
    """Exact parameters of any variant: per layer h(a + 2G)d (QKV) + a·d·h (proj) + (2 or 3)hf
    (GeLU or SwiGLU) + norms (4h LayerNorm, 2h RMSNorm) + biases ((a + 2G)d + 2h + f or 2f);
    v·h embedding, s·h learned positions, final norm, v·h untied output layer."""
    h, a, G, d, f, L = (m.hidden_size, m.num_attention_heads, m.query_groups, m.head_dim,
                        m.ffn, m.num_layers)
    glu = 2 if m.swiglu else 1
    norm = h if m.normalization == "RMSNorm" else 2 * h
    weights = h * (a + 2 * G) * d + a * d * h + (glu + 1) * h * f
    biases = (a + 2 * G) * d + 2 * h + glu * f if m.add_bias_linear else 0
    per_layer = weights + biases + 2 * norm
    position = m.seq_length * h if m.position_embedding_type == "learned_absolute" else 0
    output = 0 if m.tied else m.vocab_size * h
    return L * per_layer + m.vocab_size * h + position + norm + output


def megatron_model_flops(m: Model, p: Parallel) -> float:
    """Model FLOPs per iteration as Megatron-LM counts them (megatron/training/training.py
    num_floating_point_operations, dense): 12·B·s·L·h²·[(1 + G/a + s/h)·(a·d/h) + (f/h)·g
    + v/(2·L·h)], g = 3/2 for SwiGLU else 1, v the padded vocabulary. With G = a, d = h/a,
    g = 1, f = 4h it is K22's 72BLsh²(1 + s/(6h) + v/(12hL))."""
    B, L, s, h = p.global_batch, m.num_layers, m.seq_length, m.hidden_size
    a, G, d, f = m.num_attention_heads, m.query_groups, m.head_dim, m.ffn
    v = padded_vocab_size(m, p.tp)
    gated = 3 / 2 if m.swiglu else 1
    attention = (1 + G / a + s / h) * (a * d / h)
    return 12 * B * s * L * h * h * (attention + (f / h) * gated + v / (2 * L * h))


def llama_layer_forward_flops(m: Model, B: int) -> int:
    """Forward GEMM FLOPs of one layer over B samples: QKV 2Bsh(a+2G)d, core 4Bs²ad, proj
    2Bs·ad·h, MLP 2Bsh·f·(3 SwiGLU, 2 GeLU)."""
    s, h, a, G, d, f = (m.seq_length, m.hidden_size, m.num_attention_heads, m.query_groups,
                        m.head_dim, m.ffn)
    mlp = (3 if m.swiglu else 2) * 2 * B * s * h * f
    return 2 * B * s * h * (a + 2 * G) * d + 4 * B * s * s * a * d + 2 * B * s * a * d * h + mlp


def llama_hardware_flops(m: Model, p: Parallel) -> float:
    """Model FLOPs plus what is computed again: FlashAttention's backward recomputes QKᵀ
    (2Bs²ad per layer); selective recompute re-runs the forward GEMMs of its modules: core_attn
    4Bs²ad (flash: to get its logsumexp), mlp the whole MLP 2Bshf·(3 SwiGLU, 2 GeLU), layernorm
    none; full recompute re-runs each recomputed layer's forward."""
    B, L, s = p.global_batch, m.num_layers, m.seq_length
    core = 4 * B * s * s * m.num_attention_heads * m.head_dim
    extra = L * core // 2 if m.flash else 0
    modules = p.recompute_module_set
    if "core_attn" in modules:
        extra += L * core
    if "mlp" in modules:
        extra += L * (3 if m.swiglu else 2) * 2 * B * s * m.hidden_size * m.ffn
    elif p.recompute_granularity == "full":
        extra += recomputed_layers(m, p) * llama_layer_forward_flops(m, B)
    return megatron_model_flops(m, p) + extra
