"""Checks of pipeline parallelism: how the layers split over the stages (even, Megatron's uneven
first/last stages, accounted embedding and loss), the schedule and its virtual stages, and p2p
overlap (Megatron-LM transformer_block.py get_num_layers_to_build, arguments.py, schedules.py)."""

from simsp.scenario.checks.rule import check, positive
from simsp.scenario.config import Model, Parallel
from simsp.scenario.pipeline_layout import layout_chunks, validate_layout
from simsp.scenario.pipeline_split import pipeline_layer_counts, virtual_stage_layer_counts


def stage_split(m: Model, p: Parallel) -> None:
    """The layers split over the stages: L / p each, Megatron's uneven split, or a layout."""
    if p.pipeline_model_parallel_layout is not None:
        layout_split(m, p)
    elif p.uneven_pipeline:
        uneven_pipeline(m, p)
    else:
        check(m.num_layers % p.pp == 0, "parallel.pipeline_model_parallel_size",
              f"num_layers={m.num_layers} is not divisible by {p.pp} stages")


def layout_split(m: Model, p: Parallel) -> None:
    """--pipeline-model-parallel-layout: Megatron's refusals of the other split flags
    (transformer_config.py, arguments.py), then the layout's own checks (pipeline_layout.py).
    Virtual stages without transformer layers run (Megatron: "Empty stages are allowed")."""
    for name in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank"):
        check(getattr(p, name) in (None, False), f"parallel.{name}", "cannot be set with "
              "pipeline_model_parallel_layout (Megatron: no more than one pipeline layout "
              "argument)")
    validate_layout(p.pipeline_model_parallel_layout, p.pp, m.num_layers, m.mtp_num_layers)
    chunks = layout_chunks(p.pipeline_model_parallel_layout, p.pp)
    check(p.pp > 1 or chunks == 1, "parallel.pipeline_model_parallel_layout",
          f"{chunks} virtual stages at pipeline_model_parallel_size=1: Megatron runs them "
          "without pipelining, which simsp does not build (give one stage, e.g. 'EttL')")
    check(p.schedule is None or p.schedule == ("interleaved" if chunks > 1 else "1f1b"),
          "parallel.schedule", f"a layout of {chunks} virtual stage(s) per rank runs "
          f"{'interleaved' if chunks > 1 else '1f1b'} (Megatron), not {p.schedule}")


def _accounted(p: Parallel) -> int:
    """Layers the accounted embedding and loss add to the split (0, 1 or 2)."""
    return p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split


def uneven_pipeline(m: Model, p: Parallel) -> None:
    """Megatron's checks on uneven stages (transformer_block.py, arguments.py); simsp also needs
    one layer or more per stage and a non-interleaved schedule."""
    first, last = p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers
    positive("parallel", p, ("decoder_first_pipeline_num_layers",
                             "decoder_last_pipeline_num_layers"))
    given = (first is not None) + (last is not None)
    name = "parallel.decoder_first_pipeline_num_layers" if first is not None else \
        "parallel.decoder_last_pipeline_num_layers" if last is not None else \
        "parallel.account_for_embedding_in_pipeline_split"
    check(not (given and _accounted(p)), name, "cannot be combined with account_for_embedding/"
          "loss_in_pipeline_split (Megatron: not supported with uneven pp)")
    check(p.pp > 1, name, "needs pipeline_model_parallel_size > 1")
    check(p.schedule_name != "interleaved" or not given
          or p.num_virtual_stages_per_pipeline_rank is not None, name,
          "interleaving uneven first/last stages needs --num-virtual-stages-per-pipeline-rank "
          "(Megatron arguments.py), not --num-layers-per-virtual-pipeline-stage")
    _uneven_layers_add_up(m, p, name, given)
    _uneven_chunks(m, p)
    counts = virtual_stage_layer_counts(m, p)
    check(min(counts) >= 1, name, f"gives a stage without layers ({counts})")


def _uneven_layers_add_up(m: Model, p: Parallel, name: str, given: int) -> None:
    """The given first/last stages leave a whole number of layers per middle stage; accounted
    embedding/loss make L + e + l divisible by p."""
    first, last = p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers
    middle_stages = p.pp - given
    middle_layers = m.num_layers - (first or 0) - (last or 0)
    if given:
        check(middle_layers >= 0 and (middle_stages > 0 or middle_layers == 0), name,
              f"the first/last stage layers do not add up to num_layers={m.num_layers}")
        check(middle_stages == 0 or middle_layers % middle_stages == 0, name,
              f"the {middle_layers} remaining layers do not divide over {middle_stages} "
              "middle stages")
    else:
        total = m.num_layers + _accounted(p)
        check(total % p.pp == 0, name, f"num_layers + accounted embedding/loss = {total} is "
              f"not divisible by {p.pp} stages")


def _uneven_chunks(m: Model, p: Parallel) -> None:
    """Interleaved uneven stages: the chunks divide every stage's layers (embedding/loss
    counted)."""
    chunks = p.num_virtual_stages_per_pipeline_rank
    if p.schedule_name == "interleaved" and chunks:
        stages = list(pipeline_layer_counts(m, p))
        stages[0] += p.account_for_embedding_in_pipeline_split
        stages[-1] += p.account_for_loss_in_pipeline_split
        check(all(n % chunks == 0 for n in stages),
              "parallel.num_virtual_stages_per_pipeline_rank",
              f"{chunks} chunks do not divide every stage's layers {tuple(stages)}")
    elif p.schedule_name == "interleaved" and p.num_layers_per_virtual_pipeline_stage:
        per_stage = (m.num_layers + _accounted(p)) // p.pp
        check(per_stage % p.num_layers_per_virtual_pipeline_stage == 0,
              "parallel.num_layers_per_virtual_pipeline_stage",
              f"{p.num_layers_per_virtual_pipeline_stage} does not divide the {per_stage} "
              "layers (embedding/loss counted) of each pipeline stage")


def schedule(m: Model, p: Parallel) -> None:
    """Interleaving needs virtual stages that tile the layers and m a multiple of p."""
    virtual = p.num_layers_per_virtual_pipeline_stage
    if p.schedule_name != "interleaved":
        check(virtual is None, "parallel.num_layers_per_virtual_pipeline_stage",
              f"only applies to the interleaved schedule, not {p.schedule_name}")
        check(p.num_virtual_stages_per_pipeline_rank is None,
              "parallel.num_virtual_stages_per_pipeline_rank",
              f"only applies to the interleaved schedule, not {p.schedule_name}")
        split_backward(m, p)
        return
    if p.pipeline_model_parallel_layout is not None:  # layout_split checked its chunks
        _micro_batches_tile(p)
        return
    chunks = p.num_virtual_stages_per_pipeline_rank
    check(virtual is None or chunks is None, "parallel.num_virtual_stages_per_pipeline_rank",
          "give it or num_layers_per_virtual_pipeline_stage, not both (Megatron)")
    check(virtual is not None or chunks is not None, "parallel.schedule",
          "interleaved needs num_layers_per_virtual_pipeline_stage")
    check(p.pp > 1, "parallel.schedule", "interleaved needs pipeline_model_parallel_size > 1")
    if chunks is not None:
        check(chunks > 1, "parallel.num_virtual_stages_per_pipeline_rank",
              "interleaving needs 2 or more chunks per stage")
        if not p.uneven_pipeline:
            check(m.num_layers // p.pp % chunks == 0,
                  "parallel.num_virtual_stages_per_pipeline_rank",
                  f"{chunks} chunks do not divide the {m.num_layers // p.pp} layers of each "
                  "pipeline stage")
    else:
        per_stage = (m.num_layers + _accounted(p)) // p.pp
        check(per_stage % virtual == 0, "parallel.num_layers_per_virtual_pipeline_stage",
              f"{virtual} does not divide the {per_stage} layers of each pipeline stage")
        check(per_stage // virtual > 1, "parallel.num_layers_per_virtual_pipeline_stage",
              f"{virtual} layers per virtual stage give one chunk per pipeline stage of "
              f"{per_stage} layers: Megatron then runs plain 1F1B (it sets "
              f"virtual_pipeline_model_parallel_size to None); drop the flag or use fewer layers")
    _micro_batches_tile(p)


def _micro_batches_tile(p: Parallel) -> None:
    """Interleaving runs the micro-batches in groups of p (Megatron schedules.py)."""
    check(p.num_micro_batches % p.pp == 0, "parallel.global_batch_size",
          f"interleaving needs the {p.num_micro_batches} micro-batches to be a multiple of "
          f"pipeline_model_parallel_size={p.pp}")


def split_backward(m: Model, p: Parallel) -> None:
    """What the zero-bubble schedules (docs/schedules.md) do not run with yet: sharded data
    parallelism and activation offload, whose per-layer hooks follow the whole backward."""
    if p.schedule_name not in ("zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe"):
        return
    if p.schedule_name in ("zbv", "dualpipev"):
        v_shape(m, p)
    if p.schedule_name == "dualpipe":
        dual(m, p)
    check(p.fsdp is None, "parallel.use_megatron_fsdp",
          f"is not supported with the {p.schedule_name} schedule (its W steps)")
    check(not p.cpu_offloading, "parallel.cpu_offloading",
          f"is not supported with the {p.schedule_name} schedule (its W steps)")


def overlap_p2p(p: Parallel) -> None:
    """Megatron-LM's own check (schedules.py) on --overlap-p2p-communication."""
    check(not p.overlap_p2p_communication or p.schedule_name == "interleaved",
          "parallel.overlap_p2p_communication", "needs the interleaved schedule (Megatron: "
          "non-interleaved pipelining does not support overlapping p2p communication)")


def v_shape(m: Model, p: Parallel) -> None:
    """ZB-V's and DualPipeV's two chunks per stage tile the layers evenly (DualPipeV: m >= 2p,
    deepseek-ai/DualPipe dualpipev.py asserts it); what they do not run with yet (uneven
    stages) is refused."""
    name = p.schedule_name
    check(p.pp > 1, "parallel.schedule", f"{name} needs pipeline_model_parallel_size > 1")
    check(m.num_layers % (2 * p.pp) == 0, "parallel.schedule",
          f"{name} needs num_layers={m.num_layers} divisible by 2 x {p.pp} stages (two chunks)")
    check(name != "dualpipev" or p.num_micro_batches >= 2 * p.pp, "parallel.global_batch_size",
          f"dualpipev needs at least 2 x {p.pp} micro-batches, got {p.num_micro_batches}")
    not_yet(m, p)


def dual(m: Model, p: Parallel) -> None:
    """DualPipe's refusals (deepseek-ai/DualPipe dualpipe.py asserts an even number of ranks
    and an even number of micro-batches, at least twice the ranks); each of its two pipelines
    splits the layers evenly over the p stages."""
    check(p.pp > 1 and p.pp % 2 == 0, "parallel.pipeline_model_parallel_size",
          f"dualpipe needs an even number of pipeline ranks, got {p.pp}")
    check(p.uneven_pipeline or m.num_layers % p.pp == 0, "parallel.schedule",
          f"dualpipe needs num_layers={m.num_layers} divisible by {p.pp} stages")
    mb = p.num_micro_batches
    check(mb % 2 == 0 and mb >= 2 * p.pp, "parallel.global_batch_size",
          f"dualpipe needs an even number of micro-batches, at least 2 x {p.pp}, got {mb}")
    not_yet(m, p)


def not_yet(m: Model, p: Parallel) -> None:
    """What the two-chunk schedules (zbv, dualpipev, dualpipe) do not run with yet: the V's
    uneven stages (DualPipe's run: each pipeline splits as Megatron's p stages). Experts,
    multi-token prediction and context parallelism run (tests/test_two_chunk_moe.py checks
    their gradients against the reference)."""
    name = p.schedule_name
    check(not p.uneven_pipeline or name == "dualpipe", "parallel.schedule",
          f"{name} is not supported with uneven pipeline stages yet")
