"""Words for search results: what limits a layout, and why a rejected one lost to the best."""

import math

from simsp.units import GiB, format_seconds


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def bubble_seconds(row: dict) -> float:
    """Pipeline bubble in seconds: time × bubble fraction (the idle share, metrics.timing.bubble)."""
    return row["iteration_time_s"] * row["bubble_fraction"]


def exposed(row: dict) -> dict:
    """{kind: exposed seconds} on the busiest stage, for every kind the metrics report except
    compute itself (what the others are exposed against)."""
    return {key[len("exposed_"):-2]: row[key] for key in row
            if key.startswith("exposed_") and key.endswith("_s")
            and key not in ("exposed_comm_s", "exposed_compute_s") and _present(row[key])}


def losses(row: dict) -> dict:
    """Seconds lost to the bubble and to each kind of exposed communication; pipeline waits
    (`*_wait`) are left out: they are part of the bubble (metrics.timing.bubble counts them there)."""
    kinds = {kind: seconds for kind, seconds in exposed(row).items() if not kind.endswith("_wait")}
    return {"bubble": bubble_seconds(row), **kinds}


def limits(row: dict) -> str:
    """`bubble 0.64 s (5.2%), tp_comm 0.96 s, ...; headroom 20.0 GiB; largest loss: tp_comm`."""
    lost = losses(row)
    parts = [f"bubble {format_seconds(lost['bubble'])} ({row['bubble_fraction']:.1%})"]
    parts += [f"{kind} {format_seconds(seconds)}" for kind, seconds in lost.items()
              if kind != "bubble"]
    parts += [f"{kind} {format_seconds(seconds)} (in the bubble)"
              for kind, seconds in exposed(row).items() if kind.endswith("_wait")]
    largest = max(lost, key=lambda kind: (lost[kind], kind))
    return (f"{', '.join(parts)}; headroom {row['headroom_bytes'] / GiB:.1f} GiB; "
            f"largest loss: {largest}")


def why_lost(row: dict, best: dict) -> str:
    """OOM on stage k by X GiB; else how much slower than the best and where the time went."""
    if row["status"] == "error":
        return row["error"]
    if row["status"] == "oom":
        return (f"OOM on stage {int(row['oom_stage'])} by {row['oom_bytes_over'] / GiB:.2f} GiB "
                f"(would take {format_seconds(row['iteration_time_s'])})")
    if row.get("fits") is False:
        return (f"peak {row['peak_bytes_max'] / GiB:.1f} GiB leaves {row['headroom_bytes'] / GiB:.2f}"
                f" GiB beyond the {row['memory_reserve_bytes'] / GiB:.2f} GiB reserve "
                f"(would take {format_seconds(row['iteration_time_s'])})")
    slower = row["iteration_time_s"] / best["iteration_time_s"] - 1
    mine, theirs = losses(row), losses(best)
    deltas = {k: mine.get(k, 0.0) - theirs.get(k, 0.0) for k in dict.fromkeys([*mine, *theirs])}
    other = row["iteration_time_s"] - best["iteration_time_s"] - sum(deltas.values())
    deltas["compute and rest"] = other
    shown = [f"{kind} {'+' if delta >= 0 else '-'}{format_seconds(abs(delta))}" for kind, delta in
             sorted(deltas.items(), key=lambda item: -abs(item[1]))[:3]]
    return f"{slower:+.1%} time vs the best: {', '.join(shown)}"
