"""`simsp calibrate nccl-tests`: logs written in nccl-tests' format from known link parameters
(times from the engine at those parameters) must give the parameters back; hand-made noisy logs
within a stated tolerance; malformed logs give one `error:` line naming FILE:LINE."""

import contextlib
from dataclasses import replace
import io
import json
from pathlib import Path
import tomllib

from hypothesis import assume, given, settings, strategies as st
import numpy as np
import pytest

from simsp.calibrate.nccl_log import Row, row_collective
from simsp.cli import main
from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.scenario.loading import load_scenario
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.ring_alone import alone_time
from simsp.engine.collectives.ring_timing import busbw_GBps
from simsp.hardware.constants import LinkCalibration

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SIZES = [8 * 4 ** k for k in range(14)]  # 8 B .. 512 MiB, a factor 4 apart
DENSE_SIZES = [8 * 2 ** k for k in range(28)]  # 8 B .. 1 GiB, a factor 2 apart (nccl-tests -f 2)
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "all_gather": "none"}


# ------------------------------------------------------------------------------------------
# nccl-tests' output format (src/common.cu), written from known times
# ------------------------------------------------------------------------------------------

def engine_time_s(cluster: Cluster, collective: str, nodes: int, per_node: int, size: int) -> float:
    """The engine's time of `collective` on `per_node` GPUs of each of `nodes` nodes."""
    cluster = replace(cluster, nodes=nodes)
    gpus = [n * cluster.gpus_per_node + g for n in range(nodes) for g in range(per_node)]
    return alone_time(collective, build_topology(cluster), gpus, size,
                      calibration=LinkCalibration.from_cluster(cluster), elem_bytes=4)


def count_of(collective: str, size: int, ranks: int) -> int:
    """nccl-tests' printed count: per-rank elements for RS/AG, all elements for all-reduce."""
    return size // 4 if collective == "all_reduce" else size // 4 // ranks


def nccl_tests_log(collective: str, nodes: int, per_node: int, times_us: dict,
                   binary: bool = True, digits: int = 2, group: bool = True) -> str:
    """A complete nccl-tests log with rows {size: (out-of-place us, in-place us)}, times to
    `digits` decimals (nccl-tests prints 2), Rank lines with a Group column or the older
    format without it."""
    ranks = nodes * per_node
    lines = [f"# nThread 1 nGpus 1 minBytes {min(times_us)} maxBytes {max(times_us)} step: "
             "4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0", "#"]
    if binary:
        lines.insert(0, f"# Collective test starting: {collective}_perf")
    lines.append("# Using devices")
    for r in range(ranks):
        lines.append(f"#  Rank {r:2d}{' Group  0' if group else ''} Pid {4000 + r:6d} on  "
                     f"dgx-{r // per_node:02d} "
                     f"device {r % per_node:2d} [0x{7 + 8 * (r % per_node):02x}] "
                     "NVIDIA A100-SXM4-80GB")
    lines += ["#", "#" + " " * 62 + "out-of-place                       in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)   "
              "         (us)  (GB/s)  (GB/s)       "]
    for size, pair in sorted(times_us.items()):
        lines.append(_row(collective, ranks, size, pair, digits))
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.345 ", "#", ""]
    return "\n".join(lines)


def _row(collective: str, ranks: int, size: int, pair: tuple, digits: int = 2) -> str:
    """One table row, printed as common.cu prints it (times to `digits` decimals)."""
    text = f"{size:12d}  {count_of(collective, size, ranks):12d}  {'float':>8s}  " \
           f"{REDOP[collective]:>6s}  {-1:6d}"
    for t in pair:
        algbw = size / t / 1e3
        busbw = busbw_GBps(collective, ranks, size, t * 1e-6)
        text += f"  {t:7.{digits}f}  {algbw:6.2f}  {busbw:6.2f}  {0:5d}"
    return text


def generated_log(tmp_path, name, cluster, collective="all_reduce", nodes=1, per_node=8,
                  noise=0.0, seed=0, binary=True, sizes=SIZES, digits=2, group=True) -> Path:
    """Write a log whose times are the engine's at `cluster`'s parameters (times noise)."""
    rng = np.random.default_rng(seed)
    times = {}
    for size in sizes:
        exact = engine_time_s(cluster, collective, nodes, per_node, size) * 1e6
        times[size] = tuple(exact * (1 + noise * rng.standard_normal()) for _ in range(2))
    path = tmp_path / name
    path.write_text(nccl_tests_log(collective, nodes, per_node, times, binary, digits, group))
    return path


def calibrate(capsys, tmp_path, *argv) -> tuple[dict, str]:
    """Run `simsp calibrate nccl-tests ARGV --out F`; return ([cluster] of F, stdout)."""
    out = tmp_path / "fragment.toml"
    assert main(["calibrate", "nccl-tests", *map(str, argv), "--out", str(out)]) == 0
    return tomllib.loads(out.read_text())["cluster"], capsys.readouterr().out


def error_of(capsys, *argv) -> str:
    """The single stderr line of a failing `simsp calibrate nccl-tests ARGV` (exit 2)."""
    assert main(["calibrate", "nccl-tests", *map(str, argv)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


# ------------------------------------------------------------------------------------------
# Recovery from generated logs: exact times (6 decimals) give the parameters back to 1e-4
# (achieved: 2e-7 or better); nccl-tests' own 2 decimals cost up to 6e-4 (format tests, below)
# ------------------------------------------------------------------------------------------

INTRA = replace(Cluster(), nvlink_efficiency=0.71, nvlink_latency_us=3.3)
INTER = replace(Cluster(), ib_efficiency=0.83, ib_latency_us=2.5)
BOTH = replace(Cluster(), nvlink_efficiency=0.86, nvlink_latency_us=1.2, ib_efficiency=0.77,
               ib_latency_us=0.6)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_intra_node_parameters_are_recovered(capsys, tmp_path, collective):
    log = generated_log(tmp_path, "one-node.txt", INTRA, collective, digits=6)
    fitted, _ = calibrate(capsys, tmp_path, log)
    assert fitted["nvlink_efficiency"] == pytest.approx(0.71, rel=1e-4)
    assert fitted["nvlink_latency_us"] == pytest.approx(3.3, rel=1e-4)
    assert fitted["ib_efficiency"] == Cluster().ib_efficiency  # no multi-node run: held
    assert fitted["transfer_overhead_us"] == 0.0


def test_inter_node_parameters_are_recovered_from_two_nodes(capsys, tmp_path):
    log = generated_log(tmp_path, "two-nodes.txt", INTER, nodes=2, digits=6)
    fitted, _ = calibrate(capsys, tmp_path, log)
    assert fitted["ib_efficiency"] == pytest.approx(0.83, rel=1e-4)
    assert fitted["ib_latency_us"] == pytest.approx(2.5, rel=1e-4)
    assert fitted["nvlink_efficiency"] == Cluster().nvlink_efficiency


def test_both_tiers_from_one_node_and_four_node_runs(capsys, tmp_path):
    """Intra tier first from the one-node file, then the inter tier with those NVLink values."""
    one = generated_log(tmp_path, "one.txt", BOTH, "all_gather", digits=6)
    four = generated_log(tmp_path, "four.txt", BOTH, "reduce_scatter", nodes=4, per_node=2,
                         digits=6)
    fitted, _ = calibrate(capsys, tmp_path, four, one)
    for name in ("nvlink_efficiency", "nvlink_latency_us", "ib_efficiency", "ib_latency_us"):
        assert fitted[name] == pytest.approx(getattr(BOTH, name), rel=1e-4), name


# the fit evaluates the exact model a few times (simsp/calibrate/fit.py: closed-form start, then
# one Gauss-Newton step and a check), so random layouts cost seconds, not minutes; 3 ranks per
# node give unequal, asymmetric rings (run whole, step by step), 5-7 would only cost more
@settings(max_examples=6, deadline=None)
@given(st.floats(0.2, 1.0), st.floats(0.5, 20.0), st.floats(0.2, 1.0), st.floats(0.5, 10.0),
       st.integers(2, 8), st.integers(2, 4), st.sampled_from([1, 2, 3, 4, 8]),
       st.sampled_from(sorted(REDOP)))
def test_any_link_parameters_are_recovered(tmp_path_factory, nv_eff, nv_lat, ib_eff, ib_lat,
                                           one_node_ranks, nodes, per_node, collective):
    """Random parameters and layouts, started from simsp's defaults, exact times: within 1e-4."""
    # With NCCL channels a node's per_node rings share each GPU's NVLink: the inter-node log
    # measures the NICs only while NVLink outruns per_node NICs (else the InfiniBand fields
    # do not move the times and cannot be recovered), so keep NVLink faster than per_node
    # full-speed NICs.
    assume(nv_eff * Cluster().nvlink_bandwidth_GBps
           > 1.1 * per_node * Cluster().ib_bandwidth_GBps)
    tmp_path = tmp_path_factory.mktemp("any")
    truth = replace(Cluster(), nvlink_efficiency=nv_eff, nvlink_latency_us=nv_lat,
                    ib_efficiency=ib_eff, ib_latency_us=ib_lat)
    one = generated_log(tmp_path, "one.txt", truth, "all_reduce", 1, one_node_ranks, digits=6,
                        sizes=SIZES[::3])
    many = generated_log(tmp_path, "many.txt", truth, collective, nodes, per_node, digits=6,
                         sizes=SIZES[::3])
    out = tmp_path / "f.toml"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["calibrate", "nccl-tests", str(one), str(many), "--out", str(out)]) == 0
    fitted = tomllib.loads(out.read_text())["cluster"]
    for name in ("nvlink_efficiency", "nvlink_latency_us", "ib_efficiency", "ib_latency_us"):
        assert fitted[name] == pytest.approx(getattr(truth, name), rel=1e-4), name


def test_simulating_with_the_fragment_reproduces_the_measurements(capsys, tmp_path):
    """A scenario + the fragment loads, and the engine on its cluster gives the logged times."""
    log = generated_log(tmp_path, "two.txt", INTER, nodes=2, per_node=4)
    calibrate(capsys, tmp_path, log)
    body = (SCENARIOS / "tiny.toml").read_text().replace("[cluster]\nnodes = 1\n", "")
    scenario_file = tmp_path / "mine.toml"
    scenario_file.write_text(body + (tmp_path / "fragment.toml").read_text())
    cluster = load_scenario(scenario_file).cluster
    for size in SIZES[::3]:
        measured = engine_time_s(INTER, "all_reduce", 2, 4, size)
        assert engine_time_s(cluster, "all_reduce", 2, 4, size) == pytest.approx(measured, rel=2e-3)


# ------------------------------------------------------------------------------------------
# Noise, hand-made logs, identifiability
# ------------------------------------------------------------------------------------------

def test_noisy_generated_log_recovers_within_tolerance(capsys, tmp_path):
    """3% Gaussian multiplicative noise on every time, sizes 8 B..1 GiB by factors of 2
    (56 observations): the fit's spread over seeds is ~0.8% in efficiency and ~0.6% in latency,
    so within 2.5% and 3% (about 3 sigma)."""
    log = generated_log(tmp_path, "noisy.txt", INTRA, noise=0.03, seed=7, sizes=DENSE_SIZES)
    fitted, out = calibrate(capsys, tmp_path, log)
    assert fitted["nvlink_efficiency"] == pytest.approx(0.71, rel=0.025)
    assert fitted["nvlink_latency_us"] == pytest.approx(3.3, rel=0.03)
    assert "+-" in out  # standard errors are reported


def test_engine_time_on_one_node_is_the_textbook_ring_after_nccls_base_latency(tmp_path):
    """The forward model on one node, forced to ring/Simple (NCCL_ALGO=ring NCCL_PROTO=Simple)
    at sizes where NCCL uses every channel: NCCL's base latency 8.4 us (tuning.cc), then
    2(n-1) steps of (latency + S/n / (B e)) (docs/MODEL.md#collectives), the
    latency NCCL's ring/Simple NVLink step (3.4 us, tuning.cc hwLatencies) scaled by the
    calibrated NVSwitch hop and overhead over the default hop ((3 + 0.5) / 2 us): 5.95 us."""
    cluster = replace(Cluster(), nvlink_latency_us=3.0, transfer_overhead_us=0.5,
                      nvlink_efficiency=0.8, nccl_algo="ring", nccl_proto="Simple")
    for size in (1 << 20, 8 * 2 ** 20):
        closed = 8.4e-6 + 14 * (3.4e-6 * (3 + 0.5) / 2 + size / 8 / (300e9 * 0.8))
        assert engine_time_s(cluster, "all_reduce", 1, 8, size) == pytest.approx(closed, rel=1e-12)


def test_latency_and_overhead_are_collinear_so_the_overhead_is_held(capsys, tmp_path):
    """Holding transfer_overhead_us at 1 us moves exactly 1 us out of the fitted link latency:
    only their sum (the per-step latency) is determined by the data."""
    log = generated_log(tmp_path, "one.txt", INTRA)
    free, _ = calibrate(capsys, tmp_path, log)
    held, out = calibrate(capsys, tmp_path, log, "--transfer-overhead-us", "1.0")
    assert held["transfer_overhead_us"] == 1.0
    assert held["nvlink_latency_us"] == pytest.approx(free["nvlink_latency_us"] - 1.0, abs=1e-3)
    assert held["nvlink_efficiency"] == pytest.approx(free["nvlink_efficiency"], rel=1e-4)
    assert "collinear" in out


def test_same_logs_give_byte_identical_output(capsys, tmp_path):
    log = generated_log(tmp_path, "one.txt", INTRA, noise=0.01)
    first = calibrate(capsys, tmp_path, log)
    assert calibrate(capsys, tmp_path, log) == first


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(REDOP)), st.integers(2, 64), st.integers(1, 10 ** 6))
def test_row_reveals_its_collective(collective, ranks, per_rank):
    """Any row nccl-tests prints (size, count as in setupArgs) names its collective."""
    size = 4 * per_rank * ranks
    row = Row(1, size, count_of(collective, size, ranks), "float", REDOP[collective], 1.0, 1.0)
    assert row_collective(row, ranks) == collective


def test_exact_log_is_reproduced_row_by_row(capsys, tmp_path):
    """Every size's simsp time within the 2-decimal rounding of the printed times."""
    _, out = calibrate(capsys, tmp_path, generated_log(tmp_path, "x.txt", INTRA))
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert len(rows) == len(SIZES)
    for fields in rows:
        assert abs(float(fields[7])) < 0.05 and abs(float(fields[8])) < 0.05


def test_collective_comes_from_the_table_without_a_binary_name(capsys, tmp_path):
    log = generated_log(tmp_path, "rs.txt", INTRA, "reduce_scatter", binary=False)
    _, out = calibrate(capsys, tmp_path, log)
    assert "reduce_scatter, 8 ranks on 1 node" in out


# ------------------------------------------------------------------------------------------
# Errors: one line naming the file and line
# ------------------------------------------------------------------------------------------

def broken(tmp_path, edit) -> Path:
    """A generated log passed through `edit(lines) -> lines`."""
    path = generated_log(tmp_path, "log.txt", INTRA)
    path.write_text("\n".join(edit(path.read_text().splitlines())))
    return path


def row_line(lines: list[str], k: int = 0) -> int:
    """Index of the k-th table row."""
    return [i for i, text in enumerate(lines) if text.strip()[:1].isdigit()][k]


def test_wrong_column_count_names_file_and_line(capsys, tmp_path):
    def drop_field(lines):
        i = row_line(lines, 3)
        lines[i] = lines[i].rsplit(maxsplit=1)[0]
        return lines
    path = broken(tmp_path, drop_field)
    line = row_line(path.read_text().splitlines(), 3) + 1
    message = error_of(capsys, path)
    assert message.startswith(f"error: {path}:{line}: expected 13 columns")


def test_no_table_is_an_error(capsys, tmp_path):
    path = broken(tmp_path, lambda lines: [t for t in lines if "size" not in t])
    assert "no nccl-tests table" in error_of(capsys, path)


def test_mixed_collectives_in_one_table(capsys, tmp_path):
    """A reduce_scatter row (count = size / 4 / ranks) inside an all_reduce table."""
    def swap(lines):
        i = row_line(lines, 5)
        fields = lines[i].split()
        fields[1] = str(int(fields[0]) // 4 // 8)
        lines[i] = "  ".join(fields)
        return lines
    path = broken(tmp_path, swap)
    line = row_line(path.read_text().splitlines(), 5) + 1
    assert error_of(capsys, path).startswith(f"error: {path}:{line}: mixed collectives")


def test_flag_disagreeing_with_the_log(capsys, tmp_path):
    path = generated_log(tmp_path, "ar.txt", INTRA)
    assert "mixed collectives" in error_of(capsys, path, "--collective", "all_gather")
    assert "disagrees" in error_of(capsys, path, "--nodes", "2")


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("all_reduce_perf", "sendrecv_perf"), "sendrecv_perf is not supported"),
    (lambda t: t.replace("  -1  ", "   0  ", 1), "rooted collective"),
    (lambda t: t.replace("float", "float16", 1), "unknown type"),
    (lambda t: t.replace("#  Rank  1", "#  Rank  9"), "not numbered"),
])
def test_malformed_content(capsys, tmp_path, edit, words):
    path = generated_log(tmp_path, "log.txt", INTRA)
    path.write_text(edit(path.read_text()))
    assert words in error_of(capsys, path)


def test_failed_validation_rows_are_rejected(capsys, tmp_path):
    def wrong(lines):
        i = row_line(lines, 2)
        lines[i] = lines[i][:-1] + "7"
        return lines
    assert "wrong elements" in error_of(capsys, broken(tmp_path, wrong))


def test_missing_file_and_bad_flags(capsys, tmp_path):
    assert "file not found" in error_of(capsys, tmp_path / "nope.txt")
    log = generated_log(tmp_path, "ar.txt", INTRA)
    assert "--out" in error_of(capsys, log, "--out", tmp_path / "no" / "f.toml")
    assert "--transfer-overhead-us" in error_of(capsys, log, "--transfer-overhead-us", "-1")


# ------------------------------------------------------------------------------------------
# Format variants
# ------------------------------------------------------------------------------------------

PRINTED = 1e-3  # nccl-tests prints times to 0.01 us: fits of its logs miss by up to 6e-4 here

def test_older_format_without_root_and_with_an_error_column(capsys, tmp_path):
    """nccl-tests before the root column: `size count type redop time algbw busbw error ...`."""
    def old(lines):
        out = []
        for text in lines:
            if text.startswith("#       size"):
                text = text.replace("    root", "").replace("#wrong", " error")
            elif text.strip()[:1].isdigit():
                fields = text.split()
                del fields[4]
                fields[7] = fields[11] = "2e-07"
                text = "  ".join(fields)
            out.append(text)
        return out
    fitted, _ = calibrate(capsys, tmp_path, broken(tmp_path, old))
    assert fitted["nvlink_efficiency"] == pytest.approx(0.71, rel=PRINTED)


def test_layout_from_flags_when_the_log_has_no_rank_lines(capsys, tmp_path):
    path = broken(tmp_path, lambda lines: [t for t in lines if "Rank" not in t
                                           and "nThread" not in t])
    assert "pass --gpus-per-node" in error_of(capsys, path)
    fitted, out = calibrate(capsys, tmp_path, path, "--gpus-per-node", "8")
    assert "8 ranks on 1 node" in out
    assert fitted["nvlink_latency_us"] == pytest.approx(3.3, rel=PRINTED)


def test_rows_with_size_zero_are_skipped(capsys, tmp_path):
    """all_gather on 8 ranks prints size 0 for 8 and 16 B (count/nranks = 0): no data moved."""
    def zero_rows(lines):
        i = row_line(lines, 0)
        return lines[:i] + [f"{0:12d}  {0:12d}  {'float':>8s}  {'none':>6s}  {-1:6d}"
                            + "     5.10    0.00    0.00      0     5.00    0.00    0.00      0"
                            ] + lines[i:]
    path = generated_log(tmp_path, "ag.txt", INTRA, "all_gather")
    path.write_text("\n".join(zero_rows(path.read_text().splitlines())))
    fitted, out = calibrate(capsys, tmp_path, path)
    assert "1 size-0 row(s) skipped" in out
    assert fitted["nvlink_efficiency"] == pytest.approx(0.71, rel=PRINTED)


def test_json_document_matches_the_fragment_and_the_rows(capsys, tmp_path):
    log = generated_log(tmp_path, "one.txt", INTRA)
    assert main(["calibrate", "nccl-tests", str(log), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    fragment = tomllib.loads(document["fragment"])["cluster"]
    assert fragment["nvlink_efficiency"] == pytest.approx(
        document["parameters"]["nvlink_efficiency"]["value"], rel=1e-6)
    run = document["runs"][0]
    assert (run["collective"], run["ranks"], run["nodes"], run["tier"]) == \
        ("all_reduce", 8, 1, "intra")
    assert [r["size_bytes"] for r in run["rows"]] == SIZES
    assert all(abs(r["error_out_of_place_pct"]) < 0.05 for r in run["rows"])
    assert document["parameters"]["transfer_overhead_us"]["std_error"] is None


# ------------------------------------------------------------------------------------------
# Across NCCL's knee: protocols and algorithms change with the size (engine/collectives/nccl_tuning.py)
# ------------------------------------------------------------------------------------------

def choices_over(cluster: Cluster, collective: str, nodes: int, per_node: int) -> set:
    """The (algorithm, protocol) pairs NCCL runs over DENSE_SIZES on this layout."""
    cluster = replace(cluster, nodes=nodes)
    gpus = [n * cluster.gpus_per_node + g for n in range(nodes) for g in range(per_node)]
    graph = build_topology(cluster)
    return {(c.algorithm, c.protocol) for c in (
        nccl_choice(collective, graph, gpus, size, LinkCalibration.from_cluster(cluster))
        for size in DENSE_SIZES)}


@pytest.mark.parametrize("collective, nodes, per_node, truth", [
    ("all_reduce", 1, 8, INTRA), ("reduce_scatter", 1, 4, INTRA),
    ("all_reduce", 2, 8, INTER), ("all_gather", 4, 2, INTER)])
def test_parameters_are_recovered_to_1e4_across_the_knee(capsys, tmp_path, collective, nodes,
                                                         per_node, truth):
    """Logs from 8 B to 1 GiB span LL (LL128) and Simple, tree then ring across nodes:
    exact times (6 decimals) give the link parameters back to 1e-4."""
    assert len(choices_over(truth, collective, nodes, per_node)) >= 2
    log = generated_log(tmp_path, "knee.txt", truth, collective, nodes, per_node,
                        sizes=DENSE_SIZES, digits=6)
    fitted, out = calibrate(capsys, tmp_path, log)
    names = ("nvlink_efficiency", "nvlink_latency_us") if nodes == 1 else ("ib_efficiency",
                                                                            "ib_latency_us")
    for name in names:
        assert fitted[name] == pytest.approx(getattr(truth, name), rel=1e-4), name
    # the residual per size is reported, and it is ~0 everywhere
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert len(rows) == len(DENSE_SIZES)
    assert max(abs(float(r[7])) for r in rows) < 0.01  # err oop (%)


def test_noisy_log_across_the_knee_recovers_reasonably(capsys, tmp_path):
    """3% multiplicative noise on every time of a two-node log across tree/LL .. ring/Simple:
    the link parameters within 3%."""
    log = generated_log(tmp_path, "noisy-knee.txt", INTER, nodes=2, noise=0.03, seed=3,
                        sizes=DENSE_SIZES)
    fitted, _ = calibrate(capsys, tmp_path, log)
    assert fitted["ib_efficiency"] == pytest.approx(INTER.ib_efficiency, rel=0.03)
    assert fitted["ib_latency_us"] == pytest.approx(INTER.ib_latency_us, rel=0.03)


def test_older_rank_lines_without_group_give_the_layout(capsys, tmp_path):
    """nccl-tests before the Group column (`#  Rank  0 Pid ... on HOST device 0`): two hosts of
    four ranks are read as 2 nodes x 4 and fitted like the newer format."""
    old = generated_log(tmp_path, "old.txt", INTER, nodes=2, per_node=4, group=False)
    assert " Group " not in old.read_text()
    fitted, out = calibrate(capsys, tmp_path, old)
    assert "all_reduce, 8 ranks on 2 nodes" in out
    assert fitted["ib_efficiency"] == pytest.approx(INTER.ib_efficiency, rel=PRINTED)


def test_a_log_that_does_not_say_its_layout_asks_for_the_flags(capsys, tmp_path):
    """One GPU per process and no Rank lines (an MPI run's log cut short): one error line
    naming --gpus-per-node and --nodes; with them the fit runs."""
    full = generated_log(tmp_path, "mpi.txt", INTER, nodes=2, per_node=4).read_text()
    bare = tmp_path / "bare.txt"
    bare.write_text("\n".join(line for line in full.splitlines() if "Rank" not in line))
    message = error_of(capsys, bare)
    assert "--gpus-per-node" in message and "--nodes" in message
    fitted, out = calibrate(capsys, tmp_path, bare, "--gpus-per-node", "4", "--nodes", "2")
    assert "8 ranks on 2 nodes" in out
    assert fitted["ib_latency_us"] == pytest.approx(INTER.ib_latency_us, rel=PRINTED)


def test_logs_run_with_nccl_proto_are_fitted_with_it(capsys, tmp_path):
    """A log taken with NCCL_PROTO=Simple: `--nccl-proto Simple` models it exactly (1e-4)."""
    truth = replace(INTRA, nccl_proto="Simple")
    log = generated_log(tmp_path, "simple.txt", truth, sizes=DENSE_SIZES, digits=6)
    fitted, _ = calibrate(capsys, tmp_path, log, "--nccl-proto", "Simple")
    assert fitted["nvlink_efficiency"] == pytest.approx(0.71, rel=1e-4)
    assert fitted["nvlink_latency_us"] == pytest.approx(3.3, rel=1e-4)
