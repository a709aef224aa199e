"""The run summary's memory sections: the verdict against the GPU with PyTorch's caching
allocator (docs/allocator.md), and an out-of-memory stage taken apart with the switches that
would fit (simsp/memory_verdict.py)."""

from simsp.report.run.markdown import memory_unit, pct, seconds, table
from simsp.units import GiB, format_bytes, format_seconds


def allocator_section(m: dict) -> list[str]:
    """The memory verdict (simsp/memory_verdict.py, the same as search's, sweep's and whatif's)
    and each stage's rank through PyTorch's caching allocator (docs/allocator.md)."""
    memory = m.get("memory")
    if memory is None:
        return []
    header = ["stage", "rank", "capacity", "ledger peak", "allocated peak", "reserved peak",
              "fragmentation at peak", "headroom", "allocator"]
    rows = [[str(s["stage"]), str(s["rank"])]
            + [format_bytes(s[key]) for key in ("capacity_bytes", "peak_bytes",
                                                  "allocated_peak_bytes", "reserved_peak_bytes",
                                                  "fragmentation_at_peak_bytes", "headroom_bytes")]
            + [_allocator_verdict(s["allocator_oom"])] for s in memory["stages"]]
    allocator = [
        "Each stage's rank replayed through PyTorch's caching allocator (default settings): "
        "allocated is what the tensors hold in 512 B blocks, reserved what the allocator "
        "holds in segments; fragmentation is reserved − allocated at the allocated peak; "
        "where the allocator runs out of memory, its peaks are those before the request it "
        "could not serve. Headroom is capacity − reserve − ledger peak.", "",
        *table(header, rows, left=(len(header) - 1,)), ""] if rows else [
        "`--caching-allocator` replays each stage's rank through PyTorch's caching allocator "
        "(reserved and allocated peaks, fragmentation).", ""]
    reserve, headroom = memory["memory_reserve_bytes"] / GiB, memory["headroom_bytes"] / GiB
    verdict = ("**fits**" if memory["fits"] else "**does not fit**") + (
        f": the busiest rank's peak {memory['peak_bytes_max'] / GiB:.2f} GiB of "
        f"{memory['capacity_bytes'] / GiB:.2f} GiB leaves {headroom:.2f} GiB after the "
        f"{reserve:.2f} GiB reserve" if headroom >= 0 else
        f": the busiest rank's peak {memory['peak_bytes_max'] / GiB:.2f} GiB of "
        f"{memory['capacity_bytes'] / GiB:.2f} GiB is {-headroom:.2f} GiB over its "
        f"{reserve:.2f} GiB reserve")
    return ["## Memory against the GPU: verdict and PyTorch's caching allocator", "",
            f"Verdict (the one `simsp search`, `sweep` and `whatif` give; `--memory-reserve`"
            f"{'; out of memory' if m['oom'] else ''}): {verdict}.", "",
            *_non_tensor_lines(memory), *allocator]


def _non_tensor_lines(memory: dict) -> list[str]:
    """The non-tensor memory, item by item with its source (docs/non_tensor_memory.md), and
    whether `--memory-reserve` replaced it in the verdict."""
    items = memory.get("non_tensor", {})
    if not items:
        return []
    total = sum(item["bytes"] for item in items.values())
    rows = [[name, format_bytes(item["bytes"]), item["source"]] for name, item in items.items()]
    rows.append(["total", format_bytes(total), ""])
    used = ("the reserve" if abs(total - memory["memory_reserve_bytes"]) < 1 else
            "replaced by `--memory-reserve` in the verdict")
    return [f"Non-tensor memory per GPU (docs/non_tensor_memory.md), {used}:", "",
            *table(["item", "bytes", "source"], rows, left=(0, 2)), ""]


def _allocator_verdict(oom: dict | None) -> str:
    """The allocator's own verdict: fits, or the request it could not serve."""
    return "fits" if oom is None else f"**OOM** ({format_bytes(oom['bytes_asked'])} asked)"


def oom_categories(failing: list[dict], explained: dict, shown: tuple[str, ...]) -> list[str]:
    """Bytes by category (those of `shown`: shown_categories.py) at each failing stage's first
    failed allocation, largest first, and the cause in words (the largest category)."""
    known = [explained[r["pp"]] for r in failing if r["pp"] in explained]
    if not known:
        return []
    order = [c for c in known[0]["in_use_by_category_bytes"]  # largest first on the first stage
             if c in shown]
    unit, scale = memory_unit(failing)
    header = ["stage", "failed op (tensor)", "asked"] + [f"{c} ({unit})" for c in order]
    rows = []
    for r, e in zip(failing, known):
        o, in_use = r["oom_detail"], e["in_use_by_category_bytes"]
        rows.append([str(r["pp"]), f"`{o['op']}` (`{o['tensor']}`)", format_bytes(o["bytes_asked"])]
                    + [f"{in_use[c] / scale:.2f}" for c in order])
    causes = {next(iter(e["in_use_by_category_bytes"])) for e in known}
    first = known[0]["in_use_by_category_bytes"]
    cause = order[0]
    where = "every failing stage" if causes == {cause} else f"stage {known[0]['stage']}"
    return [f"Memory in use when the first allocation failed, by category (largest first), on "
            f"each of the {len(failing)} failing stages:", "",
            *table(header, rows, right_from=2), "",
            f"Cause: **{cause}** are the largest part on {where} ({format_bytes(first[cause])} "
            f"of {format_bytes(sum(first.values()))} in use on stage {known[0]['stage']}, "
            f"{pct(first[cause] / sum(first.values()))}).", ""]


def _switch_row(s: dict) -> list[str]:
    """One candidate switch of the out-of-memory advice as a table row."""
    if not s["valid"]:
        return [s["switch"], f"`{s['flags']}`", "not a valid layout", "", s["reason"]]
    verdict = "**fits**" if s["fits"] else "out of memory"
    return [s["switch"], f"`{s['flags']}`", format_bytes(s["peak_bytes"]),
            f"stage {s['worst_stage']}", verdict, seconds(s["iteration_time_s"])]


def switch_section(explanation: dict | None) -> list[str]:
    """Each candidate switch with the peak of its own simulated iteration (meta mode)."""
    if not explanation:
        return []
    fits = [s["switch"] for s in explanation["switches"] if s.get("fits")]
    rows = [_switch_row(s) for s in explanation["switches"]]
    rows = [r + [""] * (6 - len(r)) for r in rows]
    return ["### Switches that would bring it under capacity", "",
            "Each row is its own simulated iteration of the modified scenario (meta mode): its "
            "worst-stage peak against the capacity, and its iteration time.", "",
            *table(["switch", "flags", "peak", "worst stage", "verdict", "iteration time"],
                    rows, right_from=2, left=(4,)), "",
            ("Fits: " + ", ".join(fits) + ".") if fits else "None of these fits alone.", ""]


def oom_section(r: dict) -> list[str]:
    """A rank out of memory: the allocation that failed and the largest tensors live then."""
    o = r["oom_detail"]
    lines = [f"### Out of memory on stage {r['pp']} (rank {r['rank']})", "",
             f"The first allocation that did not fit: op `{o['op']}` (tensor `{o['tensor']}`) "
             f"at t = {format_seconds(o['time_s'])} asked for {format_bytes(o['bytes_asked'])} "
             f"with {format_bytes(o['bytes_in_use'])} in use of "
             f"{format_bytes(o['capacity_bytes'])} capacity.", ""]
    if o["largest_live"]:
        rows = [[f"`{t['name']}`", t["category"], format_bytes(t["bytes"])]
                for t in o["largest_live"]]
        lines += ["Largest single live tensors at that moment (each is small; the categories "
                  "below add up to the cause):", "",
                  *table(["tensor", "category", "size"], rows, right_from=2), ""]
    return lines
