"""`simsp schedule`: pipeline schedules side by side in unit time, the lesson of why W fills the
bubble.

    simsp schedule [--ranks N] [--micro-batches M] [--schedules 1f1b,zb-h1,dualpipe,dualpipev]
                   [--forward F] [--backward B] [--weight W] [--overlapped FB]
                   [--explain] [--json] [--html FILE]

Each schedule's ops (report/lessons/schedule.py) are run by the unit-time list scheduler
(training/pipeline/op_timing.py) with no communication; the table sets every rank's bubble
beside its published closed form. This module only reads the flags and dispatches.
"""
import math

from simsp.errors import UserError
from simsp.io_out import check_out_file
from simsp.jsonout import dumps
from simsp.report.lessons.schedule import SCHEDULES, lesson
from simsp.report.lessons.schedule_page import write_page
from simsp.report.lessons.schedule_text import explain_lines, summary_lines
from simsp.training.pipeline.op_timing import Durations

MAX_RANKS = 16  # the page draws every rank
MAX_MICRO_BATCHES = 64
TIMES = {"--forward": ("forward", "F: one stage's forward of one micro-batch (default 1)"),
         "--backward": ("backward", "B: its input-gradient backward (default 1)"),
         "--weight": ("weight", "W: its weight-gradient backward (default 1)"),
         "--overlapped": ("overlapped", "F&B: a forward and a backward overlapped on one rank "
                                        "(default F + B + W)")}


def add_parser(subparsers) -> None:
    """Register `simsp schedule` and its flags."""
    parser = subparsers.add_parser("schedule", help="pipeline schedules in unit time (lesson)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="pipeline ranks (default 4)")
    parser.add_argument("--micro-batches", type=int, default=8,
                        help="micro-batches per iteration (default 8)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help=f"comma list of {', '.join(SCHEDULES)} (default: all)")
    for flag, (dest, meaning) in TIMES.items():
        parser.add_argument(flag, dest=dest, type=float, default=None, help=meaning)
    parser.add_argument("--explain", action="store_true", help="every op's start, derived")
    parser.add_argument("--json", action="store_true", help="the lesson as one JSON object")
    parser.add_argument("--html", metavar="FILE", default=None, help="write the teaching page")
    parser.set_defaults(handler=run)


def run(args) -> int:
    """Check the flags, time every schedule, print the table (and steps) or JSON."""
    names = _names(args.schedules)
    _check_sizes(args.ranks, args.micro_batches)
    if args.json and args.explain:
        raise UserError("--json", "cannot be combined with --explain")
    if args.html:
        check_out_file(args.html, "--html")
    data = lesson(names, args.ranks, args.micro_batches, _durations(args))
    if args.html:
        write_page(data, args.html)
    if args.json:
        print(dumps(data))
        return 0
    print("\n".join(summary_lines(data) + (explain_lines(data) if args.explain else [])))
    return 0


def _names(text: str) -> list[str]:
    """The comma list of schedules, each known, none twice."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCHEDULES]
    if not names or unknown:
        raise UserError("--schedules", f"unknown {unknown or text!r}; choose from "
                                       f"{', '.join(SCHEDULES)}")
    if len(set(names)) != len(names):
        raise UserError("--schedules", f"a schedule is named twice in {text!r}")
    return names


def _check_sizes(ranks: int, m: int) -> None:
    """Ranks and micro-batches within what the lesson draws."""
    if not 2 <= ranks <= MAX_RANKS:
        raise UserError("--ranks", f"must be 2 to {MAX_RANKS}, got {ranks}")
    if not 1 <= m <= MAX_MICRO_BATCHES:
        raise UserError("--micro-batches", f"must be 1 to {MAX_MICRO_BATCHES}, got {m}")


def _durations(args) -> Durations:
    """F, B, W and F&B from the flags: positive, finite; W and F&B default as documented."""
    given = {}
    for flag, (dest, _meaning) in TIMES.items():
        value = getattr(args, dest)
        if value is not None and not (math.isfinite(value) and 0 < value <= 1e6):
            raise UserError(flag, f"must be a positive time up to 1e6 units, got {value}")
        given[dest] = value
    return Durations(given["forward"] or 1.0, given["backward"] or 1.0, given["weight"] or 1.0,
                     given["overlapped"])
