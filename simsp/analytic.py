"""Closed-form formulas of docs/MODEL.md, kept apart from the simulation so tests can compare.

Nothing here is used to *produce* a simulated number; these only cross-check them.
"""

from simsp.config import Model, Parallel, Scenario, padded_vocab_size


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


def recomputed_layers(m: Model, p: Parallel) -> int:
    """Layers whose forward full recompute re-runs: all of them (uniform), or the first N of
    each of the p·v model chunks (block; Megatron transformer_block.py)."""
    if p.recompute_granularity != "full":
        return 0
    if p.recompute_method != "block":
        return m.num_layers
    chunks = m.num_layers // (p.num_layers_per_virtual_pipeline_stage or m.num_layers // p.pp)
    return chunks * (p.recompute_num_layers or 1)


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

    Beyond K22's text: interleaving keeps chunk 0's embedding mask for up to 2p − 1 micro-batches
    (its warm-up runs all v chunks of p micro-batches, then chunk 0 of p − 1 more), not p; with
    p = 1 stage 0 is also the last stage and holds one micro-batch's head tensors; full recompute
    adds the layers whose activations are rebuilt during backward (K22 counts stored inputs):
    one layer, or a group of N (--recompute-method uniform), or block's mix."""
    m, p = sc.model, sc.parallel
    t, sp = p.tp, p.sequence_parallel
    s, b, h, a = m.seq_length, p.micro_batch_size, m.hidden_size, m.num_attention_heads
    def layer(recompute: str) -> int:
        """One layer's kept bytes under `recompute` in this layout."""
        return layer_activation_bytes(s, b, h, a, t, sp, recompute, m.ffn,
                                      m.hidden_dropout > 0, m.attention_dropout > 0)
    chunks = chunks_per_stage(m, p)
    kept, recomputed = chunk_recompute_bytes(p, m.num_layers // p.pp // chunks,
                                             layer(p.recompute_granularity), layer("none"))
    total = kept * chunks * _layer_micro_batches(p)
    if p.schedule_name == "interleaved":
        total *= 1 + (p.pp - 1) / (p.pp * chunks)
    seq_split = t if sp else 1
    if m.hidden_dropout > 0:  # embedding dropout mask, sbh/t per micro-batch (K22 §4.3)
        total += s * b * h / seq_split * _embedding_micro_batches(p)
    head = 0
    if p.pp == 1:  # final LN input, output-projection input, fp32 logits (K22 §4.3)
        head = 4 * s * b * h / seq_split + 4 * s * b * sc.padded_vocab_size / t
    # the head's tensors are freed by its backward before any layer is recomputed
    return total + max(recomputed, head)


def chunks_per_stage(m: Model, p: Parallel) -> int:
    """v: model chunks per pipeline stage (1 unless interleaved)."""
    virtual = p.num_layers_per_virtual_pipeline_stage
    return m.num_layers // p.pp // virtual if virtual else 1


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
    """Micro-batches in flight on stage 0: all m under GPipe, at most p under 1F1B (N21 §2.2)."""
    m = p.num_micro_batches
    return m if p.schedule_name == "gpipe" else min(p.pp, m)


def _embedding_micro_batches(p: Parallel) -> int:
    """Micro-batches whose chunk-0 forward is done and backward not, on stage 0 at its peak."""
    m = p.num_micro_batches
    if p.schedule_name == "interleaved":
        return min(2 * p.pp - 1, m)
    return _layer_micro_batches(p)
