"""Each what-if variant against the baseline, as pure functions of their result rows (explore's
table, one dict per variant): the objectives that rank them, the busiest stage's time by kind,
the relative change, and the one-sentence conclusion `simsp whatif` prints and its page shows."""


OBJECTIVES = {  # name: (column, larger is better)
    "time": ("iteration_time_s", False), "tokens-per-s": ("tokens_per_s", True),
    "tokens-per-s-per-gpu": ("tokens_per_s_per_gpu", True), "mfu": ("mfu", True),
    "cost": ("gpu_hours_per_million_tokens", False)}
KINDS = ("compute", "bubble", "tp_comm", "pp_transfer", "dp_comm", "optimizer")
OFFLOAD_KIND = "offload"  # waits on activation copies (--cpu-offloading; docs/fsdp.md)
CP_KIND = "cp_comm"  # context parallelism's exchanges: rows with cp > 1 only
EP_KIND = "ep_comm"  # MoE dispatch and combine: rows with expert layers only (docs/moe.md)
OPTIONAL_KINDS = (CP_KIND, EP_KIND, OFFLOAD_KIND)


def kinds_of(rows: list[dict]) -> tuple:
    """KINDS, and cp_comm / ep_comm / offload when some row has context-parallel / MoE /
    activation-offload exposure (docs/context-parallel.md, docs/moe.md, docs/fsdp.md)."""
    return KINDS + tuple(kind for kind in OPTIONAL_KINDS
                         if any(row.get(f"exposed_{kind}_s") is not None for row in rows))


def exposure(row: dict) -> dict:
    """Seconds of the busiest stage by kind: compute, the bubble (T − T/(1 + f), N21 §2.2.1)
    and each exposed communication."""
    time = row["iteration_time_s"]
    found = {"compute": row.get("exposed_compute_s") or 0.0,
             "bubble": time - time / (1 + row["bubble_fraction"])}
    for kind in KINDS[2:] + OPTIONAL_KINDS:
        value = row.get(f"exposed_{kind}_s")
        found[kind] = value if value == value and value is not None else 0.0
    return found


def change(new: float, old: float) -> float:
    """Relative change new/old − 1."""
    return new / old - 1 if old else float("nan")


def conclusion(row: dict, base: dict) -> str:
    """One sentence: the variant's effect on time, throughput and cost, and what moved."""
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
    sentence = f"{name}: {', '.join(parts)}; {_what_moved(row, base)}"
    if not row.get("fits", True):
        sentence += (f"; does not fit: peak {row['peak_bytes_max'] / 2**30:.1f} GiB leaves "
                     f"{row['headroom_bytes'] / 2**30:.1f} GiB of headroom")
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
