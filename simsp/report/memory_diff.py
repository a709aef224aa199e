"""`simsp memory diff`'s report: the comparison as Markdown (printed) and as memory_diff.html,
one self-contained page with the allocated and reserved curves of both sides drawn inline
(docs/allocator.md#comparing-a-real-snapshot-simsp-memory-diff)."""

import html
from pathlib import Path

from simsp.io_out import markdown_code, markdown_text, write_file
from simsp.report.html import page, to_html
from simsp.units import format_bytes

PAGE_NAME = "memory_diff.html"
CHART_W, CHART_H, MARGIN = 1000, 300, 90  # the SVG chart's size and left margin, in pixels
# (side, column of the points: 1 allocated, 2 reserved, colour, dash)
CURVES = (("snapshot", 1, "#e8838f", ""), ("snapshot", 2, "#e8838f", "6 4"),
          ("simsp", 1, "#1f5fbf", ""), ("simsp", 2, "#1f5fbf", "6 4"))
CHART_STYLE = "svg.timeline{border:1px solid #e5e7eb;background:#fff}"


def signed_bytes(n: int) -> str:
    """A difference: '+256.00 MiB', '-1.50 KiB', '0 B'."""
    return format_bytes(n) if n <= 0 else "+" + format_bytes(n)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines, then a blank line."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(row) + " |" for row in rows], ""]


def _three(row: dict) -> list[str]:
    """A compared row's cells: snapshot, simsp, difference."""
    return [format_bytes(row["snapshot_bytes"]), format_bytes(row["simsp_bytes"]),
            signed_bytes(row["difference_bytes"])]


def _category_table(diff: dict) -> list[str]:
    """Per category: at each side's peak and each category's own peak."""
    rows = [[row["name"], *_three(row), *_three(row["own_peak"])] for row in diff["categories"]]
    return _table(["category", "snapshot at its peak", "simsp at its peak", "difference",
                   "snapshot's own peak", "simsp's own peak", "difference"], rows)


def _count(n: int) -> str:
    """'1 allocation', '2 allocations'."""
    return f"{n} allocation" + ("" if n == 1 else "s")


def _unexplained(diff: dict) -> list[str]:
    """The snapshot's allocations at its peak that simsp's peak does not hold, largest first."""
    lines = ["Alive at the snapshot's peak with no allocation of the same category, layer (where "
             f"both name one) and size at simsp's: {_count(diff['unexplained_count'])} "
             f"({format_bytes(diff['unexplained_bytes'])}). simsp's with none in the snapshot: "
             f"{_count(diff['missing_count'])} ({format_bytes(diff['missing_bytes'])}).", ""]
    if diff["unexplained"]:
        rows = [[format_bytes(a["bytes"]), a["category"],
                 "—" if a["layer"] is None else str(a["layer"]), markdown_code(a["site"])]
                for a in diff["unexplained"]]
        lines += _table(["bytes", "category", "layer", "site (innermost frames)"], rows)
    return lines


def diff_markdown(diff: dict) -> str:
    """The comparison as Markdown: peaks, categories, layers, unexplained allocations."""
    lines = ["Differences are the snapshot's bytes less simsp's; allocated bytes are the "
             "requests' sizes, reserved the segments' (docs/allocator.md).", "",
             "## Peaks", "",
             *_table(["", "snapshot", "simsp", "difference"],
                     [[row["name"], *_three(row)] for row in diff["peaks"]]),
             "## By category", "",
             "At each side's allocated peak, and each category's own peak over the iteration.",
             "", *_category_table(diff),
             "## By layer, at each side's allocated peak", "",
             *_table(["layer", "snapshot", "simsp", "difference"],
                     [[row["name"], *_three(row)] for row in diff["layers"]]),
             "## Unexplained allocations", "", *_unexplained(diff)]
    return "\n".join(lines)


def _polyline(points: list, column: int, top: int, colour: str, dash: str,
              width: float) -> str:
    """One curve of (fraction, allocated, reserved) points scaled to the chart."""
    xy = " ".join(f"{MARGIN + p[0] * (CHART_W - MARGIN - 10):.1f},"
                  f"{CHART_H - 30 - p[column] / top * (CHART_H - 50):.1f}" for p in points)
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{colour}" stroke-width="{width}"{extra} points="{xy}"/>'


def timeline_svg(timeline: dict) -> str:
    """Allocated (solid) and reserved (dashed) bytes of both sides over their traces."""
    top = max([1] + [p[c] for side in timeline.values() for p in side for c in (1, 2)])
    parts = [_polyline(timeline[side], column, top, colour, dash,
                       4 if side == "snapshot" else 1.5)  # wide, so simsp's shows on it
             for side, column, colour, dash in CURVES]
    axis_y = CHART_H - 30
    labels = [f'<text x="{MARGIN - 6}" y="{axis_y - f * (CHART_H - 50) + 4:.1f}" '
              f'text-anchor="end" font-size="11">{html.escape(format_bytes(top * f))}</text>'
              for f in (0, 0.5, 1)]
    legend = (f'<text x="{MARGIN}" y="{CHART_H - 8}" font-size="12">fraction of each trace → '
              f'<tspan fill="#e8838f">snapshot (wide)</tspan> / '
              f'<tspan fill="#1f5fbf">simsp</tspan>: allocated solid, reserved dashed</text>')
    axes = (f'<line x1="{MARGIN}" y1="{axis_y}" x2="{CHART_W - 10}" y2="{axis_y}" '
            f'stroke="#888"/><line x1="{MARGIN}" y1="20" x2="{MARGIN}" y2="{axis_y}" '
            f'stroke="#888"/>')
    return (f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" '
            f'height="{CHART_H}" viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
            f'aria-label="allocated and reserved bytes over the iteration">'
            f'{axes}{"".join(labels)}{"".join(parts)}{legend}</svg>')


def write_diff_page(diff: dict, title: str, out_dir: Path) -> Path:
    """memory_diff.html in `out_dir`: the Markdown above, the chart after the peaks."""
    body = to_html(f"# {markdown_text(title)}\n\n" + diff_markdown(diff))
    chart = ("<h2>Over the iteration</h2>" + timeline_svg(diff["timeline"]))
    body = body.replace('<h2 id="by-category"', chart + '<h2 id="by-category"', 1)
    return write_file(out_dir / PAGE_NAME, page(title, body, style=CHART_STYLE))
