"""Progress on stderr for long commands: a tqdm bar shown only when stderr is a terminal.

`--quiet` (added to every subcommand by `add_quiet_flag`) silences it; stdout never changes.
When no bar is wanted, callers get plain iterables and no callbacks, so progress costs nothing.
"""

import sys


def add_quiet_flag(parser) -> None:
    """Give a subcommand's parser the `--quiet` switch, unless it already defines its own."""
    if "--quiet" in parser._option_string_actions:  # argparse's table of option strings
        return
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar on stderr (default: shown when stderr is a terminal)")


def wanted(quiet: bool) -> bool:
    """A bar is drawn only when stderr is a terminal and the user did not ask for quiet."""
    return not quiet and sys.stderr.isatty()


def bar(total: int | None, desc: str, unit: str):
    """A tqdm bar on stderr that vanishes when done (leave=False), redrawn at most 10 times/s.
    (tqdm is imported only when a bar is drawn.)"""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                mininterval=0.1, dynamic_ncols=True)


def track(items, desc: str, unit: str, quiet: bool, total: int | None = None):
    """`items` unchanged, or wrapped in a bar counting them (sizes done, parameters checked)."""
    if not wanted(quiet):
        return items
    from tqdm import tqdm
    return tqdm(items, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                mininterval=0.1, dynamic_ncols=True)


class StepProgress:
    """Callback for RunResults.record_step (training/driver/run.py): schedule steps done / total
    and the simulated time reached."""

    def __init__(self, desc: str = "simulating"):
        self.desc, self.bar = desc, None

    def __call__(self, total_steps: int, now_s: float) -> None:
        """One of the run's total_steps schedule steps finished at simulated time now_s
        (seconds)."""
        if self.bar is None:
            self.bar = bar(total_steps, self.desc, "step")
        self.bar.set_postfix_str(f"simulated {now_s * 1e3:.1f} ms", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        """Draw the final count and simulated time once, then clear the bar."""
        if self.bar is not None:
            self.bar.refresh()
            self.bar.close()


def step_callback(quiet: bool) -> StepProgress | None:
    """A StepProgress when a bar is wanted, else None (the simulation then calls nothing)."""
    return StepProgress() if wanted(quiet) else None
