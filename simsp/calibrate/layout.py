"""What an nccl-tests run measured: the collective, how many ranks on how many nodes, the sizes.

Ranks and nodes come from the log's Rank lines (distinct hosts = nodes), else from the
`--gpus-per-node` / `--nodes` flags, else from the header's nThread x nGpus on one node. Where
the Rank lines are abbreviated (a `#  ...` line) or fewer than the table's own numbers say
(calibrate/rank_count.py), the table gives the ranks and the flags or the listed hosts the
ranks per node.
The collective comes from the binary named in the log, the table (nccl_log.row_collective),
or the `--collective` flag; all that are present must agree.
"""

from dataclasses import dataclass

from simsp.calibrate.nccl_log import ALL_TO_ALL, TYPE_BYTES, NcclTestsLog, row_collective
from simsp.calibrate.rank_count import describe, rank_candidates
from simsp.errors import UserError


@dataclass(frozen=True)
class Measurement:
    """One nccl-tests run, ready to fit: layout, collective and (bytes, seconds) observations."""

    path: str
    collective: str
    nodes: int
    ranks_per_node: int
    elem_bytes: int
    sizes_bytes: tuple[int, ...]  # one per observation (each table row twice: oop, in-place)
    times_s: tuple[float, ...]  # same length
    rows: tuple  # nccl_log.Row of the table, zero-size rows dropped
    skipped_rows: int  # rows of size 0 (NCCL returns at once; nothing to fit)

    @property
    def ranks(self) -> int:
        """Ranks in the run: nodes x ranks per node."""
        return self.nodes * self.ranks_per_node

    @property
    def tier(self) -> str:
        """'intra' for a one-node run (NVLink only), 'inter' when it crosses nodes."""
        return "intra" if self.nodes == 1 else "inter"


def measurement(log: NcclTestsLog, collective: str | None = None, nodes: int | None = None,
                ranks_per_node: int | None = None) -> Measurement:
    """Combine a parsed log with the user's flags into one Measurement."""
    node_count, per_node = _layout(log, nodes, ranks_per_node)
    ranks = node_count * per_node
    if ranks < 2:
        raise UserError(log.path, "a ring collective needs at least 2 ranks")
    name = _collective(log, ranks, collective)
    rows = tuple(row for row in log.rows if row.size_bytes > 0)
    if not rows:
        raise UserError(log.path, "every row has size 0: nothing to fit")
    sizes = tuple(size for row in rows for size in (row.size_bytes, row.size_bytes))
    times = tuple(t * 1e-6 for row in rows for t in (row.out_of_place_us, row.in_place_us))
    return Measurement(log.path, name, node_count, per_node, _elem_bytes(log), sizes, times,
                       rows, len(log.rows) - len(rows))


def _layout(log: NcclTestsLog, nodes: int | None, per_node: int | None) -> tuple[int, int]:
    """(nodes, ranks per node) from the Rank lines, checked against the flags if given."""
    if not log.hosts:
        return _layout_without_ranks(log, nodes, per_node)
    table = rank_candidates(log)
    if log.abbreviated or (table and len(log.hosts) not in table):
        return _layout_from_table(log, nodes, per_node)
    distinct = list(dict.fromkeys(log.hosts))
    counts = {host: log.hosts.count(host) for host in distinct}
    if len(set(counts.values())) != 1:
        raise UserError(log.path, f"ranks are spread unevenly over hosts: {counts}")
    found = (len(distinct), len(log.hosts) // len(distinct))
    for flag, given, value in (("--nodes", nodes, found[0]), ("--gpus-per-node", per_node,
                                                             found[1])):
        if given is not None and given != value:
            raise UserError(flag, f"{given} disagrees with {log.path}'s Rank lines ({value})")
    return found


def _layout_from_table(log: NcclTestsLog, nodes, per_node) -> tuple[int, int]:
    """Rank lines that list only some ranks: the count from the table's numbers, narrowed by
    the flags (which must agree with them); the ranks per node from the flags, else from where
    the listed hosts change."""
    table = rank_candidates(log, at_least=max(log.listed_ranks, 2))
    listed = f"{log.listed_ranks} Rank lines"
    if not table:
        raise UserError(log.path, f"{listed} and a table that does not say how many ranks ran: "
                                  "pass --gpus-per-node and --nodes")
    fits = [n for n in table if (not per_node or n % per_node == 0) and
            (not nodes or n % nodes == 0) and (not (nodes and per_node) or n == nodes * per_node)]
    if not fits and (nodes or per_node):
        flag, value = ("--nodes", nodes) if nodes else ("--gpus-per-node", per_node)
        raise UserError(flag, f"{value} does not fit the {describe(table)} ranks that "
                              f"{log.path}'s busbw/algbw and counts say ran")
    if len(fits) != 1:
        raise UserError(log.path, f"{listed}; its busbw/algbw allow {describe(table)} ranks: "
                                  "pass --gpus-per-node and --nodes")
    ranks = fits[0]
    per_node = per_node or (ranks // nodes if nodes else _per_node_of_hosts(log.hosts))
    if per_node is None or ranks % per_node:
        raise UserError(log.path, f"{listed} of {ranks} (its busbw/algbw and counts say "
                                  f"{ranks} ranks ran): pass --gpus-per-node")
    return ranks // per_node, per_node


def _per_node_of_hosts(hosts: tuple[str, ...]) -> int | None:
    """Ranks on the first host when the listed ranks reach a second one, else None."""
    return next((r for r, host in enumerate(hosts) if host != hosts[0]), None)


def _layout_without_ranks(log: NcclTestsLog, nodes, per_node) -> tuple[int, int]:
    """No Rank lines: the flags, else one node of nThread x nGpus ranks when that is a single
    process driving several GPUs; a log of one GPU per process (MPI) does not say."""
    if per_node is None:
        threads, gpus = log.threads_gpus or (1, 1)
        if threads * gpus < 2:
            raise UserError(log.path, "the log does not say how many ranks ran on how many "
                                      "nodes (no Rank lines; its header names "
                                      f"{threads * gpus} GPU per process): pass "
                                      "--gpus-per-node and --nodes")
        per_node = threads * gpus
    return (1 if nodes is None else nodes), per_node


def _collective(log: NcclTestsLog, ranks: int, flag: str | None) -> str:
    """The one collective named by the binary, the rows and the flag (those that say)."""
    found = {}
    if log.binary:
        found[f"{log.path}:{log.binary_line}"] = log.binary
    rows = () if ALL_TO_ALL in (log.binary, flag) else log.rows  # its rows read as all-gather's
    for row in rows:
        name = row_collective(row, ranks)
        if name is not None:
            found.setdefault(f"{log.path}:{row.line}", name)
    if flag:
        found["--collective"] = flag
    names = list(dict.fromkeys(found.values()))
    if len(names) > 1:
        where = next(w for w, n in found.items() if n != names[0])
        raise UserError(where, f"mixed collectives: {found[where]} here, {names[0]} before")
    if not names:
        raise UserError(log.path, "cannot tell the collective: pass --collective")
    return names[0]


def _elem_bytes(log: NcclTestsLog) -> int:
    """Bytes per element: every row must use the same datatype."""
    types = sorted({row.dtype for row in log.rows})
    if len(types) > 1:
        raise UserError(log.path, f"rows mix datatypes ({', '.join(types)})")
    return TYPE_BYTES[types[0]]
