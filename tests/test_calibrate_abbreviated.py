"""`simsp calibrate nccl-tests` on logs whose Rank lines are abbreviated (published logs list
ranks 0-4, then `#  ...`): the rank count comes from the table's own numbers, checked against
the flags, never a silent fit of the ranks listed."""

import pytest

from simsp.calibrate.nccl_log import Row
from simsp.calibrate.rank_count import rank_candidates
from tests.test_calibrate import INTER, PRINTED, calibrate, error_of, generated_log

LISTED = 5  # Rank lines kept: 0..4


def abbreviated(path, keep=LISTED, marker="#  ..."):
    """The log with Rank lines from `keep` on replaced by one `marker` line (none: dropped)."""
    out, marked = [], False
    for line in path.read_text().splitlines():
        if "Rank" in line and int(line.split()[2]) >= keep:
            if marker and not marked:
                out.append(marker)
                marked = True
            continue
        out.append(line)
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.fixture(scope="module")
def log_128(tmp_path_factory):
    """An all-reduce over 16 nodes x 8 GPUs at INTER's links, Rank lines 0-4 then `...`."""
    tmp = tmp_path_factory.mktemp("abbrev")
    return abbreviated(generated_log(tmp, "ar128.txt", INTER, nodes=16, per_node=8))


def test_the_ranks_come_from_the_table_not_from_the_five_rank_lines(capsys, tmp_path, log_128):
    """busbw = algbw x 2(n-1)/n over the rows leaves n in a narrow range including 128; with
    --gpus-per-node 8 only 128 is left: 16 nodes, fitted to the generated links."""
    message = error_of(capsys, log_128)
    assert "5 Rank lines" in message and "128" in message
    assert "--gpus-per-node" in message
    fitted, out = calibrate(capsys, tmp_path, log_128, "--gpus-per-node", "8")
    assert "all_reduce, 128 ranks on 16 nodes" in out
    assert fitted["ib_efficiency"] == pytest.approx(INTER.ib_efficiency, rel=PRINTED)
    fitted, out = calibrate(capsys, tmp_path, log_128, "--nodes", "16", "--gpus-per-node", "8")
    assert "128 ranks on 16 nodes" in out


def test_flags_that_contradict_the_table_are_refused(capsys, log_128):
    message = error_of(capsys, log_128, "--nodes", "4", "--gpus-per-node", "8")
    assert message.startswith("error: --nodes: 4 does not fit") and "128" in message


def test_rank_lines_cut_short_without_a_marker_are_caught(capsys, tmp_path):
    """Five Rank lines and no `...`: the table's 2(n-1)/n says more ranks ran, so the listed
    five are not fitted as a one-node tier."""
    path = abbreviated(generated_log(tmp_path, "cut.txt", INTER, nodes=2, per_node=8),
                       marker=None)
    assert "5 Rank lines of" in error_of(capsys, path)
    _, out = calibrate(capsys, tmp_path, path, "--gpus-per-node", "8")
    assert "16 ranks on 2 nodes" in out


def test_listed_ranks_reaching_a_second_host_give_the_ranks_per_node(capsys, tmp_path):
    """Ranks 0-5 listed on 4 GPUs per node: the host changes at rank 4, so 16 ranks = 4 x 4."""
    path = abbreviated(generated_log(tmp_path, "two-hosts.txt", INTER, nodes=4, per_node=4),
                       keep=6)
    _, out = calibrate(capsys, tmp_path, path)
    assert "16 ranks on 4 nodes" in out


def test_reduce_scatter_ranks_come_from_its_counts(capsys, tmp_path):
    """reduce_scatter prints the per-rank count: size / (count x 4 B) = 32 ranks exactly."""
    path = abbreviated(generated_log(tmp_path, "rs.txt", INTER, collective="reduce_scatter",
                                     nodes=4, per_node=8))
    _, out = calibrate(capsys, tmp_path, path, "--gpus-per-node", "8")
    assert "reduce_scatter, 32 ranks on 4 nodes" in out


def row(algbw, busbw, half=0.005):
    """An all-reduce row with the given out-of-place and in-place bandwidths."""
    return Row(1, 1 << 30, 1 << 28, "float", "sum", 1.0, 1.0, (algbw, algbw), (busbw, busbw),
               half)


class _Log:
    """The part of NcclTestsLog rank_candidates reads."""

    def __init__(self, *rows):
        self.rows = rows


@pytest.mark.parametrize("n", [2, 3, 8, 16, 64, 128, 1024])
def test_a_row_printed_to_two_decimals_bounds_n_around_the_truth(n):
    """algbw 100.00 with busbw rounded from 100 x 2(n-1)/n: the interval holds n, and (worked
    by hand for n = 128: busbw 198.44 allows ratios 198.435/100.005 .. 198.445/99.995, i.e.
    n in 126.99 .. 129.44) is narrow for small n."""
    busbw = round(100 * 2 * (n - 1) / n, 2)
    candidates = rank_candidates(_Log(row(100.0, busbw)))
    assert n in candidates
    if n == 128:
        assert list(candidates) == [127, 128, 129]
    if n <= 16:
        assert list(candidates) == [n]


def test_rows_together_narrow_the_interval():
    """Two rows at different algbw, each allowing a range, intersect to the one n both allow."""
    n = 128
    rows = [row(a, round(a * 2 * (n - 1) / n, 2)) for a in (100.0, 187.37)]
    alone = [set(rank_candidates(_Log(r))) for r in rows]
    both = set(rank_candidates(_Log(*rows)))
    assert both == alone[0] & alone[1] and n in both


def test_a_table_too_small_to_say_allows_nothing():
    assert not rank_candidates(_Log(row(0.0, 0.0)))
    assert not rank_candidates(_Log(row(0.004, 0.0)))
