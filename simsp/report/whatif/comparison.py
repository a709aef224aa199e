"""Each what-if variant against the baseline, as pure functions of their result rows (explore's
table, one dict per variant): the objectives that rank them, the busiest stage's time by kind,
the relative change, and the one-sentence conclusion `simsp whatif` prints and its page shows."""

from simsp.units import format_bytes


OBJECTIVES = {  # name: (column, larger is better)
    "time": ("iteration_time_s", False), "tokens-per-s": ("tokens_per_s", True),
    "tokens-per-s-per-gpu": ("tokens_per_s_per_gpu", True), "mfu": ("mfu", True),
    "cost": ("gpu_hours_per_million_tokens", False)}
KINDS = ("compute", "bubble", "tp_comm", "pp_transfer", "dp_comm", "optimizer")
OFFLOAD_KIND = "offload"  # waits on activation copies (--cpu-offloading; docs/fsdp.md)
CP_KIND = "cp_comm"  # context parallelism's exchanges: rows with cp > 1 only
EP_KIND = "ep_comm"  # MoE dispatch and combine: rows with expert layers only (docs/moe.md)
AMAX_KIND = "fp8_amax"  # FP8 delayed scaling's amax all-reduces (docs/hardware.md#fp8-amax-reduction)
OPTIONAL_KINDS = (CP_KIND, EP_KIND, OFFLOAD_KIND, AMAX_KIND)


STAGE_COLUMN = "exposed_s_stage{stage}.{key}"  # metrics/timing.py exposure, flattened per stage
BUBBLE_KEY = "pp_wait"  # blocked on a peer stage (fill, drain) and the idle tail: metrics/timing.py


def busiest_stage(row: dict) -> int:
    """The pipeline stage that waited least on its peers (the first of equals): its program
    was busy the longest, so it sets the iteration's pace."""
    stages = []  # (stages,) seconds waited; a table's wider rows give this one NaN columns
    while _stage_value(row, len(stages), "bubble") is not None:
        stages.append(_stage_value(row, len(stages), "bubble"))
    if not stages:
        raise KeyError("the row has no per-stage exposure (exposed_s_stage0.*)")
    return min(range(len(stages)), key=lambda stage: (stages[stage], stage))


def kinds_of(rows: list[dict]) -> tuple:
    """KINDS, and cp_comm / ep_comm / offload / fp8_amax when some row's busiest stage has
    context-parallel / MoE / activation-offload / amax-reduction time (docs/context-parallel.md,
    docs/moe.md, docs/fsdp.md, docs/hardware.md#fp8-amax-reduction)."""
    stages = [(row, busiest_stage(row)) for row in rows]
    return KINDS + tuple(kind for kind in OPTIONAL_KINDS if any(
        _stage_value(row, stage, kind) is not None for row, stage in stages))


def exposure(row: dict) -> dict:
    """Seconds of the busiest stage's iteration by what its program was doing (metrics/timing.py
    `exposure`): the parts partition the iteration, each second counted once — compute
    (kernels), bubble (blocked on a peer stage in fill and drain, and the idle tail), each
    communication while the program was blocked on it, the optimizer step
    (docs/exploration.md#where-the-time-goes); a kind the stage does not have is 0 s."""
    stage = busiest_stage(row)
    return {kind: _stage_value(row, stage, kind) or 0.0 for kind in KINDS + OPTIONAL_KINDS}


def _stage_value(row: dict, stage: int, kind: str) -> float | None:
    """The stage's seconds of one kind, None when its row has no such column (or NaN: a
    column only another row of the table has)."""
    return _given(row, STAGE_COLUMN.format(stage=stage, key=BUBBLE_KEY if kind == "bubble" else kind))


def baseline_description(row: dict) -> str:
    """What the baseline is: the model (its scenario name, architecture and parameters), the
    layout (t, p, d, cp, ep and how weights are sharded), the GPUs, the GPU and system
    profiles, and the precision."""
    architecture = _given(row, "architecture")
    parts = [f"model {_given(row, 'name') or row['variant']}"
             + (f" ({architecture})" if architecture else "")]
    if _given(row, "parameters.total"):
        parts.append(_parameters(row))
    parts.append(f"layout t={row['tensor_model_parallel_size']} "
                 f"p={row['pipeline_model_parallel_size']} d={row['data_parallel_size']} "
                 f"cp={row['context_parallel_size']} ep={row['expert_model_parallel_size']}, "
                 f"{_sharding(row)}")
    system = _given(row, "system")
    parts.append(f"{row['gpus']} GPUs ({row['nodes']} node{'s' if row['nodes'] != 1 else ''} of "
                 f"{row['gpus_per_node']}) {row['gpu']}"
                 + (f" in a {system} system" if system else
                    ", links from [cluster] (no system profile)"))
    fp8, main = _given(row, "fp8_format"), _given(row, "main_params_dtype") or "fp32"
    parts.append((f"FP8 {fp8} GEMMs ({row['fp8_recipe']} recipe)" if fp8 else "BF16")
                 + f", {main.upper()} main weights")
    return "; ".join(parts)


def _given(row: dict, key: str):
    """The row's value, None when absent or NaN (a column only other rows of the table have)."""
    value = row.get(key)
    return None if value is None or value != value else value


def baseline_line(row: dict) -> str:
    """`Baseline: NAME: its description; its memory verdict.`"""
    name = "" if row["variant"] == "baseline" else f" ({row['variant']})"
    return f"Baseline{name}: {baseline_description(row)}; {memory_clause(row)}."


def _parameters(row: dict) -> str:
    """`8.03B parameters` or, where some are not active per token, `671.03B parameters,
    37.55B active per token`."""
    total, active = row["parameters.total"], row["parameters.active"]
    return f"{total / 1e9:.2f}B parameters" + (
        f", {active / 1e9:.2f}B active per token" if active != total else "")


def _sharding(row: dict) -> str:
    """How weights and optimizer state are held across data-parallel ranks (docs/fsdp.md)."""
    if _given(row, "use_megatron_fsdp"):
        return f"Megatron-FSDP {row.get('data_parallel_sharding_strategy')}"
    if _given(row, "use_torch_fsdp2"):
        return "PyTorch FSDP2"
    return "distributed optimizer" if row.get("distributed_optimizer") else \
        "replicated optimizer state"


def memory_clause(row: dict) -> str:
    """The memory verdict of simsp/memory_verdict.py in words: a variant that does not fit is
    a memory risk; one that fits says how much it has beyond the reserve. The peak names the
    bytes held there for deferred W steps (split backwards), when there are any."""
    peak, headroom = format_bytes(row["peak_bytes_max"]), format_bytes(row["headroom_bytes"])
    held = row.get("held_for_wgrad_at_peak_bytes") or 0
    if held:
        peak += f" ({format_bytes(held)} of it held_for_wgrad, kept for deferred W steps)"
    reserve = format_bytes(row.get("memory_reserve_bytes") or 0.0)
    if not row.get("fits", row["status"] == "ok"):
        cause = "out of memory" if row["status"] == "oom" else "short of the reserve"
        return (f"MEMORY RISK: does not fit ({cause}: peak {peak}, headroom {headroom} after "
                f"the {reserve} reserve)")
    return f"memory: fits, peak {peak}, {headroom} beyond the {reserve} reserve"


def change(new: float, old: float) -> float:
    """Relative change new/old − 1."""
    return new / old - 1 if old else float("nan")


def conclusion(row: dict, base: dict) -> str:
    """One sentence: the variant's effect on time, throughput and cost, what moved, and its
    memory verdict (a memory risk when it does not fit)."""
    name = row["variant"]
    if row["status"] == "error":
        return f"{name}: cannot run ({row['error']})."
    parts = [f"{change(row['iteration_time_s'], base['iteration_time_s']):+.1%} iteration time "
             f"({row['iteration_time_s']:.3f} s vs {base['iteration_time_s']:.3f} s)",
             f"{change(row['tokens_per_s'], base['tokens_per_s']):+.1%} tokens/s",
             f"{change(row['tokens_per_s_per_gpu'], base['tokens_per_s_per_gpu']):+.1%} tokens/s "
             "per GPU",
             f"{change(row['gpu_hours_per_million_tokens'], base['gpu_hours_per_million_tokens']):+.1%}"
             " GPU-hours per token"]
    sentence = f"{name}: {', '.join(parts)}; {_what_moved(row, base)}; {memory_clause(row)}"
    if row.get("note"):
        sentence += f" ({row['note']})"
    return sentence + "."


def _what_moved(row: dict, base: dict) -> str:
    """The kinds of time that changed by at least 1% of the baseline's iteration, largest first."""
    mine, theirs = exposure(row), exposure(base)
    floor = 0.01 * base["iteration_time_s"]
    kinds = kinds_of([row, base])
    moved = sorted(((mine[k] - theirs[k], k) for k in kinds if abs(mine[k] - theirs[k]) >= floor),
                   key=lambda item: -abs(item[0]))
    if not moved:
        delta, kind = max(((mine[k] - theirs[k], k) for k in kinds), key=lambda item: abs(item[0]))
        return (f"every kind of time within 1% of the iteration; the largest move: {kind} "
                f"{delta:+.3f} s")
    shown = ", ".join(f"{kind} {delta:+.3f} s" for delta, kind in moved[:3])
    return f"what moved (busiest stage): {shown}"

