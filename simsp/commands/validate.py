"""`simsp validate`: reproduce published or user measurements; per row reference, simsp, error.

    simsp validate [MEASUREMENTS...] [--only GROUP,...] [--json] [--print-example]

Without MEASUREMENTS: the bundled published set (simsp/validation/data/published.toml): K22
Table 4 (table4), K22 Table 5 (table5), K22 Table 2 / Fig. 7 ratios (memory) and the nccl-tests
single-node all-reduce (nccl). MEASUREMENTS: CSV or TOML files in the format of
simsp/validation/measurements.py (`--print-example` prints a CSV to start from).
Prints one table per group (Calculon llm-validation style) with mean and worst |error|, and on
stderr a line per group as it starts and a bar of its rows done / total (not with --quiet; the
bar only when stderr is a terminal).
"""

import sys

from simsp.scenario.config import Cluster
from simsp.hardware.costmodel import active_calibration, calibration_table
from simsp.errors import UserError
from simsp.hardware.constants import LinkCalibration
from simsp.jsonout import dumps
from simsp.progress import track
from simsp.validation.runner import (EXAMPLE, check_all, compare, data_path, load_sets,
                                     select_groups, summary)


def add_parser(subparsers) -> None:
    """Register `simsp validate` and its flags."""
    parser = subparsers.add_parser("validate", help="compare simsp with measurements",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("measurements", nargs="*", metavar="MEASUREMENTS",
                        help="CSV or TOML measurement files (default: the bundled published set)")
    parser.add_argument("--only", default=None, metavar="GROUP,...",
                        help="only these groups (bundled: table4,table5,memory,nccl)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--print-example", action="store_true",
                        help="print an example measurements CSV and exit")
    parser.add_argument("--force", action="store_true",
                        help="run rows above run's estimated-time limit (never above its memory "
                             "limit; see README 'Limits')")
    parser.set_defaults(handler=run)


def run(args) -> int:
    """Load, check every row, simulate group by group, print the tables or JSON."""
    if args.print_example:
        print(data_path(EXAMPLE).read_text(encoding="utf-8"), end="")
        return 0
    only = _groups(args.only)
    selected = select_groups(load_sets(args.measurements), only)
    check_all(selected, args.force)
    results = []
    quiet = getattr(args, "quiet", False)
    for group, title, note, rows in selected:
        if not quiet:
            sys.stderr.write(f"validate: {group}: {len(rows)} row(s)\n")
        shown = track(rows, f"validate {group}", "row", quiet, total=len(rows))  # simsp/progress.py
        results.append((group, title, note, [compare(mset, row) for mset, row in shown]))
    document = report(results)
    print(dumps(document, indent=2) if args.json else "\n".join(text_lines(document)))
    return 0


def _groups(text: str | None) -> list[str] | None:
    """--only's comma list; an empty item is an error, not "every group"."""
    if text is None:
        return None
    groups = [g.strip() for g in text.split(",")]
    if not all(groups):
        raise UserError("--only", f"{text!r} has an empty item")
    twice = sorted({g for g in groups if groups.count(g) > 1})
    if twice:
        raise UserError("--only", f"{twice[0]!r} is named twice")
    return groups


def report(results: list[tuple]) -> dict:
    """The --json document: groups with their rows and summaries, and the overall summary."""
    groups, everything = [], []
    for group, title, note, comparisons in results:
        everything += comparisons
        groups.append({"group": group, "title": title, "note": note,
                       "rows": [_row_json(c) for c in comparisons], **summary(comparisons)})
    return {"groups": groups, **summary(everything),
            "calibration": {"compute": calibration_table(),
                            "links": LinkCalibration.from_cluster(Cluster()).describe()}}


def _row_json(c) -> dict:
    """One row: what, in which unit, reference, simsp and signed error."""
    return {"name": c.row.name, "metric": c.row.metric, "unit": c.row.unit,
            "reference": c.row.measured, "simsp": c.simsp, "error_pct": c.error_pct}


def text_lines(document: dict) -> list[str]:
    """Per group: title, note, the table and its summary; then the overall summary."""
    lines = []
    for g in document["groups"]:
        lines += [f"# {g['group']}: {g['title']}"] + ([f"# ({g['note']})"] if g["note"] else [])
        lines.append(f"  {'name':<44} {'metric':<20} {'reference':>14} {'simsp':>14} "
                     f"{'error':>8}")
        lines += [_row_text(r) for r in g["rows"]]
        lines += [_summary_text(g["group"], g), ""]
    lines.append(_summary_text("all", document))
    lines.append(f"# compute: {active_calibration().describe()}")
    lines.append(f"# links (unless a scenario sets them): {document['calibration']['links']}")
    return lines


def _row_text(r: dict) -> str:
    """name, metric, reference and simsp with the unit, signed error."""
    unit = r["unit"]
    return (f"  {r['name'][:44]:<44} {r['metric']:<20} {_value(r['reference'], unit):>14} "
            f"{_value(r['simsp'], unit):>14} {r['error_pct']:>+7.2f}%")


def _value(value: float, unit: str) -> str:
    """'7.700 ms', '66.80 %'."""
    return f"{value:.4g} {unit}" if value >= 1000 else f"{value:.3f} {unit}"


def _summary_text(name: str, s: dict) -> str:
    """'# table4: 10 rows, mean |error| 1.10%, worst 2.21% (TP + SP: backward)'."""
    return (f"# {name}: {s['row_count']} rows, mean |error| {s['mean_abs_error_pct']:.2f}%, "
            f"worst {s['worst_abs_error_pct']:.2f}% ({s['worst_row']})")

