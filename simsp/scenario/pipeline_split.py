"""Layers per pipeline stage and per model chunk, as Megatron-LM splits them (even, uneven first
and last stages, accounted embedding and loss, interleaved chunks, a given layout)."""

from simsp.scenario.config import Model, Parallel
from simsp.scenario.pipeline_layout import layout_chunks, layout_layer_counts


def pipeline_layer_counts(m: Model, p: Parallel) -> tuple[int, ...]:
    """Transformer layers of each pipeline stage, as Megatron-LM builds them
    (megatron/core/transformer/transformer_block.py get_num_layers_to_build, non-interleaved):
    the given first/last stage counts and the rest spread evenly over the middle stages; or
    (L + 1 per accounted embedding/loss) / p per stage, one fewer on the first (embedding) and
    last (loss) stage; else L / p each."""
    if p.pipeline_model_parallel_layout is not None:  # its virtual stages, summed per rank
        counts = layout_layer_counts(p.pipeline_model_parallel_layout)
        return tuple(sum(counts[k::p.pp]) for k in range(p.pp))
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
    if p.pipeline_model_parallel_layout is not None:  # pipeline_layout.py, Megatron's order
        return layout_layer_counts(p.pipeline_model_parallel_layout)
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
    if p.schedule_name in ("zbv", "dualpipev", "dualpipe"):  # two chunks per stage (the V,
        # docs/schedules.md; DualPipe's stage r and p-1-r, docs/dualpipe.md)
        return 2
    if p.num_virtual_stages_per_pipeline_rank:
        return p.num_virtual_stages_per_pipeline_rank
    if p.pipeline_model_parallel_layout is not None:  # its virtual stages / p
        return layout_chunks(p.pipeline_model_parallel_layout, p.pp)
    virtual = p.num_layers_per_virtual_pipeline_stage
    if not virtual:
        return 1
    total = m.num_layers + p.account_for_embedding_in_pipeline_split + \
        p.account_for_loss_in_pipeline_split
    return total // p.pp // virtual
