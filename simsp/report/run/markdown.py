"""Markdown pieces every section of the run summary uses: percentages, seconds, plurals, tables."""

from simsp.units import GiB, MiB, format_seconds


def pct(fraction: float) -> str:
    """0.5143 -> '51.4%'."""
    return f"{fraction * 100:.1f}%"


def seconds(t: float) -> str:
    """Three decimals in s, ms or us; an exact zero is just 0."""
    return format_seconds(t) if t else "0"


def plural(n: int, word: str) -> str:
    """"3 stages", "1 batch", "2 batches"."""
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("h") else "s")


def table(header: list[str], rows: list[list[str]], right_from: int = 1,
           left: tuple[int, ...] = ()) -> list[str]:
    """A Markdown table; columns from `right_from` on (except `left`) are right-aligned."""
    align = ["---" if i < right_from or i in left else "---:" for i in range(len(header))]
    return ["| " + " | ".join(row) + " |" for row in [header, align, *rows]]


def memory_unit(stages: list[dict]) -> tuple[str, int]:
    """GiB, or MiB when no stage reaches 1 GiB (two decimals of GiB would all read 0.00)."""
    return ("GiB", GiB) if max(r["peak_bytes"] for r in stages) >= GiB else ("MiB", MiB)
