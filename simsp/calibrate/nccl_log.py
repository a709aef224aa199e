"""Read the text output of nccl-tests' all_reduce_perf, reduce_scatter_perf, all_gather_perf and
alltoall_perf (an all-to-all's rows print redop `none` as all-gather's do: only its binary name
or `--collective all_to_all` tells it).

The format (NVIDIA/nccl-tests src/common.cu): a `# nThread .. nGpus ..` header,
one `#  Rank  N Group  G Pid  P on HOST device  D [0x..] NAME` line per rank (older versions:
no `Group G`; a published log may list a few and abbreviate the rest with a `#  ...` line), a
column header
`#  size count type redop root  time algbw busbw #wrong  time algbw busbw #wrong` (out-of-place
then in-place; older versions have no root column and `error` for `#wrong`), one row per size
(size in bytes, time in us, bandwidths in GB/s printed `%6.2f`), then `# Avg bus bandwidth : X`.
Every problem is one UserError naming FILE:LINE.
"""

from dataclasses import dataclass
from pathlib import Path
import re

from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER
from simsp import io_in
from simsp.errors import UserError

# nccl-tests src/common.cu test_types / test_typenames: bytes per element of each type name
TYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
# `#  Rank  0 Group  0 Pid ...`; nccl-tests before the Group column: `#   Rank  0 Pid ...`
RANK_LINE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+")
HEADER_LINE = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
ABBREVIATION_LINE = re.compile(r"^#\s*(?:\.{3,}|\u2026)\s*$")  # `#  ...`: Rank lines left out
BINARY_NAME = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")  # all_reduce_perf, all_reduce_perf_mpi
TIME_COLUMNS = ("time", "algbw", "busbw")
MAX_ROWS = 1000  # sizes in one table (nccl-tests' default -b 8 -e 128M -f 2 prints 25)
MAX_RANKS = 8192  # ranks of one run: simsp ring's limit
ALL_TO_ALL = "all_to_all"  # engine/collectives/all_to_all.py; nccl-tests' binary is alltoall_perf
SUPPORTED = COLLECTIVES + (ALL_TO_ALL,)
BINARY_COLLECTIVE = {"alltoall": ALL_TO_ALL}  # binary name -> simsp's collective name


@dataclass(frozen=True)
class Row:
    """One size of the table: bytes, elements, and the out-of-place / in-place times (us)."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str
    out_of_place_us: float
    in_place_us: float
    algbw_GBps: tuple[float, float] = (0.0, 0.0)  # (out-of-place, in-place), as printed
    busbw_GBps: tuple[float, float] = (0.0, 0.0)
    bandwidth_half_unit: float = 0.005  # half the last printed digit of the bandwidths


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed run: where each rank ran (rank -> host) and the table rows, in file order."""

    path: str
    hosts: tuple[str, ...]  # hosts[r] = host of rank r; empty when the log has no Rank lines
    # (abbreviated: the hosts of ranks 0.. up to the first rank left out)
    threads_gpus: tuple[int, int] | None  # (nThread, nGpus) of the header, if present
    binary: str | None  # collective named by a `*_perf` binary in the log, if any
    binary_line: int | None
    rows: tuple[Row, ...]
    abbreviated: bool = False  # a `#  ...` line stands for Rank lines left out
    listed_ranks: int = 0  # Rank lines present (the highest listed rank + 1 when abbreviated)


def read_log(path: str | Path) -> NcclTestsLog:
    """Parse one nccl-tests output file."""
    lines = _read_lines(path)
    hosts, header, binary, binary_line = {}, None, None, None
    columns, rows, abbreviated = None, [], False
    for number, text in enumerate(lines, start=1):
        where = f"{path}:{number}"
        stripped = text.strip()
        if stripped.startswith("#"):
            if _is_column_header(stripped):
                if columns is not None:
                    raise UserError(where, "a second table: give one nccl-tests run per file")
                columns = _columns(stripped, where)
            elif match := RANK_LINE.match(stripped):
                _add_rank(hosts, int(match.group(1)), match.group(2), where)
            elif match := HEADER_LINE.match(stripped):
                header = (int(match.group(1)), int(match.group(2)))
            elif hosts and columns is None and ABBREVIATION_LINE.match(stripped):
                abbreviated = True
        elif columns is not None and stripped[:1].isdigit():
            rows.append(_row(stripped, columns, where, number))
            if len(rows) > MAX_ROWS:
                raise UserError(where, f"more than {MAX_ROWS} sizes in one table")
        if binary is None and (name := _binary_name(stripped, where)):
            binary, binary_line = name, number
    return _finish(path, hosts, header, (binary, binary_line), columns, rows, abbreviated)


def _add_rank(hosts: dict, rank: int, host: str, where: str) -> None:
    """Record one Rank line; a rank listed twice or beyond MAX_RANKS is an error."""
    if rank in hosts:
        raise UserError(where, f"Rank {rank} is listed twice")
    if rank >= MAX_RANKS:
        raise UserError(where, f"Rank {rank}: more than {MAX_RANKS} ranks (simsp ring's limit)")
    hosts[rank] = host


def _read_lines(path: str | Path) -> list[str]:
    """The file's lines, with I/O problems as UserErrors."""
    return io_in.read_text(path, "nccl-tests").splitlines()


def _binary_name(text: str, where: str) -> str | None:
    """The collective of an `xxx_perf` binary mentioned on the line, if any."""
    match = BINARY_NAME.search(text)
    if not match:
        return None
    name = BINARY_COLLECTIVE.get(match.group(1), match.group(1))
    if name not in SUPPORTED:
        raise UserError(where, f"{match.group(1)}_perf is not supported (supported: "
                               f"{', '.join(c + '_perf' for c in COLLECTIVES)}, alltoall_perf)")
    return name


def _is_column_header(text: str) -> bool:
    """`#  size  count  type ...  time  algbw  busbw ...`: the table's column names."""
    words = text.lstrip("#").split()
    return words[:2] == ["size", "count"] and "time" in words


def _columns(text: str, where: str) -> list[str]:
    """Column names; they must end with two (time, algbw, busbw, #wrong|error) groups."""
    words = text.lstrip("#").split()
    first = words.index("time")
    if words[first:first + 3] != list(TIME_COLUMNS) or words[first + 4:first + 7] != \
            list(TIME_COLUMNS) or len(words) != first + 8:
        raise UserError(where, "column header is not nccl-tests' (expected size count type redop "
                               "[root] time algbw busbw #wrong time algbw busbw #wrong)")
    return words


def _row(text: str, columns: list[str], where: str, number: int) -> Row:
    """One data row: exactly as many fields as the column header names."""
    fields = text.split()
    if len(fields) != len(columns):
        raise UserError(where, f"expected {len(columns)} columns ({' '.join(columns)}), "
                               f"found {len(fields)}")
    value = dict(zip(columns, fields))
    times = [i for i, name in enumerate(columns) if name == "time"]
    _check_root(value, where)
    _check_wrong(fields, times, where)
    bandwidths = [fields[i + k] for i in times for k in (1, 2)]  # algbw, busbw per group
    return Row(number, _integer(value["size"], "size", where), _integer(value["count"], "count",
               where), _dtype(value["type"], where), value.get("redop", "none"),
               _time_us(fields[times[0]], where), _time_us(fields[times[1]], where),
               (_bandwidth(bandwidths[0], where), _bandwidth(bandwidths[2], where)),
               (_bandwidth(bandwidths[1], where), _bandwidth(bandwidths[3], where)),
               max(_half_unit(text) for text in bandwidths))


def _bandwidth(text: str, where: str) -> float:
    """A bandwidth column (GB/s), non-negative."""
    try:
        value = float(text)
    except ValueError:
        raise UserError(where, f"bandwidth {text!r} is not a number") from None
    if not value >= 0:
        raise UserError(where, f"bandwidth {text!r} must not be negative")
    return value


def _half_unit(text: str) -> float:
    """Half the last printed digit of a number: how far rounding may have moved it."""
    decimals = len(text.partition(".")[2])
    return 0.5 * 10.0 ** -decimals


def _integer(text: str, name: str, where: str) -> int:
    """A non-negative integer column."""
    if not text.isdigit():
        raise UserError(where, f"{name} {text!r} is not a non-negative integer")
    return int(text)


def _time_us(text: str, where: str) -> float:
    """A positive time in microseconds."""
    try:
        value = float(text)
    except ValueError:
        raise UserError(where, f"time {text!r} is not a number") from None
    if not value > 0:
        raise UserError(where, f"time {text!r} must be positive")
    return value


def _dtype(text: str, where: str) -> str:
    """A datatype nccl-tests knows."""
    if text not in TYPE_BYTES:
        raise UserError(where, f"unknown type {text!r} (known: {', '.join(TYPE_BYTES)})")
    return text


def _check_root(value: dict, where: str) -> None:
    """Rooted collectives (broadcast, reduce) print a root >= 0; ours print -1."""
    if value.get("root", "-1") != "-1":
        raise UserError(where, f"root {value['root']}: a rooted collective (broadcast/reduce) is "
                               "not supported")


def _check_wrong(fields: list[str], times: list[int], where: str) -> None:
    """The #wrong (or error) column after each time group: a failed validation is no data."""
    for index in times:
        wrong = fields[index + 3]
        if wrong.isdigit() and int(wrong) > 0:
            raise UserError(where, f"{wrong} wrong elements: this run failed nccl-tests' check")


def _finish(path, hosts: dict, header, binary: tuple, columns, rows,
            abbreviated: bool) -> NcclTestsLog:
    """Check completeness: a table with rows, and rank lines numbered 0..n-1 (abbreviated: the
    hosts of the ranks listed from 0 on)."""
    if columns is None:
        raise UserError(str(path), "no nccl-tests table (no '#  size  count  type ...' header)")
    if not rows:
        raise UserError(str(path), "the nccl-tests table has no rows")
    if not abbreviated and sorted(hosts) != list(range(len(hosts))):
        raise UserError(str(path), f"Rank lines are not numbered 0..{len(hosts) - 1}")
    prefix = next((r for r in range(len(hosts) + 1) if r not in hosts), len(hosts))
    listed = max(hosts) + 1 if abbreviated else len(hosts)
    return NcclTestsLog(str(path), tuple(hosts[r] for r in range(prefix)), header, *binary,
                        tuple(rows), abbreviated, listed)


def row_collective(row: Row, ranks: int) -> str | None:
    """The collective a row's size, count and redop reveal (src/common.cu setupArgs prints
    size = max(send, recv) bytes and count = the per-call element count): all_gather prints
    redop `none`; all_reduce has size = count x type bytes; reduce_scatter size = ranks x that.
    None when the row cannot tell (count 0, or one rank)."""
    if row.redop == "none":
        return ALL_GATHER
    elements = row.count * TYPE_BYTES[row.dtype]
    if row.count == 0 or ranks == 1:
        return None
    if elements == row.size_bytes:
        return ALL_REDUCE
    return REDUCE_SCATTER if elements * ranks == row.size_bytes else None
