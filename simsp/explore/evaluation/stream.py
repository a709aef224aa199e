"""Rows printed to stdout as they finish, in configuration order: a row is printed once it and
every row before it are done, so the lines are the same whatever order the workers finish in
(the progress bar on stderr counts the rest)."""

import sys

from tqdm import tqdm

from simsp.explore.results.headroom import add_headroom
from simsp.explore.results.table import table_row
from simsp.units import GiB


def row_line(row: dict) -> str:
    """One row: status, GPUs, time, tokens/s, MFU, peak, headroom and name; or its error."""
    if row["status"] == "error":
        return f"{row['index']:4d}  {row['variant']}: {row['error']}"
    verdict = "fits" if row.get("fits", not row["oom"]) else ("OOM " if row["oom"] else "tight")
    return (f"{row['index']:4d}  {verdict} {row['gpus']:5d} GPUs {row['iteration_time_s']:9.3f} s "
            f"{row['tokens_per_s']:11,.0f} tokens/s  MFU {row['mfu']:6.1%}  peak "
            f"{row['peak_bytes_max'] / GiB:6.1f} GiB  headroom {row['headroom_bytes'] / GiB:6.1f} "
            f"GiB  {row['variant']}")


class RowStream:
    """Prints each finished row's line (row_line) in order; `indexed` pairs each configuration
    with its row index, `first` is the configuration changes are spelled against."""

    def __init__(self, indexed: list, first, reserve_bytes: float):
        self.indexed, self.first, self.reserve = indexed, first, reserve_bytes
        self.printed = 0

    def __call__(self, found: dict) -> None:
        """Print every row now ready in order ({digest: result row or None})."""
        while self.printed < len(self.indexed):
            index, config = self.indexed[self.printed]
            result = found.get(config.digest())
            if result is None:
                return
            row = add_headroom(table_row(index, config, self.first, dict(result)), self.reserve)
            tqdm.write(row_line(row), file=sys.stdout)
            self.printed += 1
