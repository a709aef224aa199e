"""`simsp ring`: nccl-tests style table, --json, --explain and one-line errors."""

import importlib.util
import json

import pytest

from simsp.commands import ring
from simsp.scenario.config import Cluster
from simsp.errors import UserError
from simsp.scenario.flags import Parser
from simsp.hardware.constants import LinkCalibration

NVLINK_GBPS = Cluster().nvlink_bandwidth_GBps * LinkCalibration().nvlink_efficiency
IB_GBPS = Cluster().ib_bandwidth_GBps * LinkCalibration().ib_efficiency


def simsp_ring(argv: list[str]) -> int:
    """Run `simsp ring ARGV` through a parser holding only the ring command (as cli.main does)."""
    parser = Parser(prog="simsp")
    ring.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    try:
        args = parser.parse_args(["ring", *argv])
        return args.handler(args)
    except UserError as exc:
        print(f"error: {exc}", file=__import__("sys").stderr)
        return 2
    except SystemExit as exc:
        return exc.code


def output(capsys, argv):
    assert simsp_ring(argv) == 0
    return capsys.readouterr().out


def table_rows(text):
    """(size, count, time_us, algbw, busbw) of every data line."""
    rows = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            size, count, _, _, time_us, algbw, busbw, _, _, _ = line.split()
            rows.append((int(size), int(count), float(time_us), float(algbw), float(busbw)))
    return rows


def nccl_columns(text):
    """(algorithm, protocol, channels) of every data line."""
    return [tuple(line.split()[7:9]) + (int(line.split()[9]),) for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def test_sweep_table_has_one_row_per_size_with_nccl_busbw(capsys):
    rows = table_rows(output(capsys, ["--ranks", "8", "--min-size", "8", "--max-size", "1M",
                                      "--step-factor", "4"]))
    assert [r[0] for r in rows] == [8 * 4 ** k for k in range(9)]
    assert all(count == size // 4 for size, count, *_ in rows)  # float32 elements
    for size, _, time_us, algbw, busbw in rows:
        assert algbw == pytest.approx(size / (time_us * 1e-6) / 1e9, abs=0.006)
        assert busbw == pytest.approx(algbw * 2 * 7 / 8, abs=0.011)  # NCCL: 2(n-1)/n


def test_large_message_busbw_reaches_achieved_nvlink_on_one_node(capsys):
    (row,) = table_rows(output(capsys, ["--ranks", "8", "--size", "512M"]))
    assert 0.98 * NVLINK_GBPS < row[4] <= NVLINK_GBPS


def test_two_nodes_are_bound_by_all_eight_nics(capsys):
    text = output(capsys, ["--ranks", "16", "--nodes", "2", "--size", "512M"])
    (row,) = table_rows(text)
    assert 0.95 * 8 * IB_GBPS < row[4] <= 8 * IB_GBPS  # one channel per rail, 8 NICs per node
    assert "NICs sending per node: 8 (rails 0,1,2,3,4,5,6,7)" in text


def test_json_has_exactly_the_documented_keys(capsys):
    result = json.loads(output(capsys, ["--ranks", "8", "--size", "1M", "--json"]))
    assert list(result) == ["collective", "ranks", "size_bytes", "time_s", "algbw_GBps",
                            "busbw_GBps", "bytes_sent_per_rank", "steps", "algorithm",
                            "protocol", "nchannels"]
    assert (result["algorithm"], result["protocol"], result["nchannels"]) == ("ring", "LL", 24)
    assert (result["collective"], result["ranks"], result["size_bytes"]) == (
        "all_reduce", 8, 1 << 20)
    assert result["bytes_sent_per_rank"] == [2 * 7 * (1 << 20) // 8] * 8
    assert result["steps"] == 14
    assert result["algbw_GBps"] == pytest.approx((1 << 20) / result["time_s"] / 1e9)
    assert result["busbw_GBps"] == pytest.approx(result["algbw_GBps"] * 14 / 8)


@pytest.mark.parametrize("collective,steps,factor", [("reduce_scatter", 3, 3 / 4),
                                                     ("all_gather", 3, 3 / 4)])
def test_json_for_reduce_scatter_and_all_gather(capsys, collective, steps, factor):
    result = json.loads(output(capsys, ["--ranks", "4", "--size", "4K", "--collective",
                                        collective, "--json"]))
    assert result["steps"] == steps
    assert result["bytes_sent_per_rank"] == [3 * 4096 // 4] * 4
    assert result["busbw_GBps"] == pytest.approx(result["algbw_GBps"] * factor)


def explain_moves(text):
    """The send/receive part of every per-rank step line of --explain."""
    return [line.split("|")[0].replace("reduce", "apply").replace("copy", "apply")
            for line in text.splitlines() if line.startswith("  rank") and "send" in line]


def test_explain_all_reduce_is_reduce_scatter_then_all_gather(capsys):
    base = ["--ranks", "4", "--size", "64", "--explain", "--collective"]
    all_reduce = output(capsys, base + ["all_reduce"])
    reduce_scatter = output(capsys, base + ["reduce_scatter"])
    all_gather = output(capsys, base + ["all_gather"])
    assert explain_moves(all_reduce) == explain_moves(reduce_scatter) + explain_moves(all_gather)
    assert len(explain_moves(all_reduce)) == 2 * 3 * 4
    assert "  rank 0: send c3 to 1, recv c2 from 3, reduce c2 | holds c0=0 c1=0 c2=0+3 c3=0" in (
        all_reduce)
    final = [line for line in all_reduce.splitlines() if line.startswith("  rank")][-4:]
    assert all(line.endswith("holds c0=all c1=all c2=all c3=all") for line in final)
    assert "bytes sent per rank [96, 96, 96, 96] = reduce_scatter [48, 48, 48, 48] + " \
           "all_gather [48, 48, 48, 48]" in all_reduce


def test_explain_handles_sizes_not_divisible_by_the_ranks(capsys):
    text = output(capsys, ["--ranks", "3", "--size", "16", "--explain"])
    assert "chunks (elements): c0 = [0, 2), c1 = [2, 3), c2 = [3, 4)" in text
    # chunks of 8, 4, 4 B; rank i sends 2S minus the chunks it keeps (i in RS, i+1 in AG).
    assert "bytes sent per rank [20, 24, 20]" in text


def test_output_is_deterministic(capsys):
    argv = ["--ranks", "16", "--nodes", "2", "--min-size", "8", "--max-size", "64M",
            "--step-factor", "8"]
    assert output(capsys, argv) == output(capsys, argv)


@pytest.mark.parametrize("argv,field", [
    (["--ranks", "9", "--size", "8"], "--ranks"),
    (["--ranks", "16", "--nodes", "1", "--size", "8"], "--ranks"),
    (["--ranks", "16", "--nodes", "2", "--size", "64", "--explain"], "--explain"),
    (["--ranks", "4", "--size", "12Q"], "--size"),
    (["--ranks", "4", "--size", "6"], "--size"),
    (["--ranks", "4"], "--size"),
    (["--ranks", "4", "--min-size", "8", "--max-size", "64", "--json"], "--json"),
    (["--ranks", "4", "--min-size", "1M", "--max-size", "8"], "--min-size"),
    (["--ranks", "1", "--size", "8"], "--ranks"),
    (["--ranks", "four", "--size", "8"], "argument --ranks"),
    (["--ranks", "4", "--size", "8", "--collective", "broadcast"], "argument --collective"),
    (["--ranks", "100000", "--size", "1M"], "--ranks"),
])
def test_bad_input_is_one_error_line_and_exit_2(capsys, argv, field):
    assert simsp_ring(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"error: {field}")


def _all_commands_exist() -> bool:
    """simsp.cli loads every command module: the real CLI works once all of them exist."""
    from simsp.cli import COMMANDS
    return all(importlib.util.find_spec(f"simsp.commands.{name}") for name in COMMANDS)


@pytest.mark.skipif(not _all_commands_exist(), reason="other simsp commands do not exist yet")
def test_through_the_real_cli(capsys):
    from simsp.cli import main
    assert main(["ring", "--ranks", "2", "--size", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == 2


def channel_rows(text):
    """(channel, rail, bytes, sent per GPU, time_us, ring order) of the per-channel breakdown."""
    rows = []
    for line in text.splitlines():
        parts = line[1:].split(maxsplit=5)
        if line.startswith("#") and len(parts) == 6 and parts[0].isdigit() and parts[2].isdigit():
            rows.append((int(parts[0]), parts[1], int(parts[2]), int(parts[3]), float(parts[4]),
                         parts[5]))
    return rows


def test_two_nodes_print_one_channel_per_rail(capsys):
    text = output(capsys, ["--ranks", "16", "--nodes", "2", "--size", "1G"])
    (row,) = table_rows(text)
    rows = channel_rows(text)
    assert [(r[0], r[1]) for r in rows] == [(c, str(c)) for c in range(8)]
    assert all(r[2] == (1 << 30) // 8 for r in rows)  # each channel carries S/8
    assert all(r[3] == 2 * 15 * (1 << 30) // (8 * 16) for r in rows)  # 2(n-1)/n of it per GPU
    assert max(r[4] for r in rows) == pytest.approx(row[2], abs=0.011)
    assert rows[1][5] == "1 2 3 4 5 6 7 0 ^1| 9 10 11 12 13 14 15 8 ^9|"


def test_one_node_is_one_ring_and_unchanged(capsys):
    text = output(capsys, ["--ranks", "8", "--size", "512M"])
    assert [r[:2] for r in channel_rows(text)] == [(0, "-")]
    assert "NICs sending per node: 0 (one node: NVLink only)" in text
    (row,) = table_rows(text)
    # the figure before channels existed (4043.06 us, 14 steps at a 2 us hop), plus NCCL's
    # ring/Simple base latency, with NCCL's own ring/Simple NVLink step of 3.4 us (tuning.cc)
    assert row[2] == pytest.approx(4043.06 + 8.4 + 14 * (3.4 - 2.0), abs=0.006)


def test_big_rings_are_timed_alone(capsys):
    """Above 32 ranks a ring is timed as meta mode times it alone (engine/collectives/ring_alone.py)."""
    text = output(capsys, ["--ranks", "64", "--nodes", "8", "--size", "64M"])
    assert "(timed alone: closed form, or one node's piece step by step)" in text
    assert len(channel_rows(text)) == 8


def test_explain_gives_each_step_its_time_and_compares_ar_with_rs_plus_ag(capsys):
    text = output(capsys, ["--ranks", "4", "--size", "64", "--explain"])
    # NCCL runs 64 B with LL on 1 of its 24 channels (tuning.cc, enqueue.cc): per step NCCL's
    # ring/LL NVLink step latency, 0.6 us, and a 16-byte chunk at 0.78 x 300 GB/s
    # x LL's bus bandwidth on one channel of 24 (0.5 x 20 GB/s x 12/24 = 5 GB/s) over Simple's on
    # all (20 GB/s x 12 = 240 GB/s); every call pays LL's base latency 6.6 us
    step_us = 0.6 + 16 / (0.78 * 300e9 * 5 / 240) * 1e6
    titles = [line for line in text.splitlines() if "step" in line and "time" in line
              and not line.startswith(("time", "one call"))]
    assert len(titles) == 6
    assert all(f"time {step_us:.3f} us" in line for line in titles)
    (line,) = [line for line in text.splitlines() if line.startswith("time: all_reduce")]
    ar, rs, ag = (6.6 + 6 * step_us, 6.6 + 3 * step_us, 6.6 + 3 * step_us)
    assert f"all_reduce {ar:.3f} us = reduce_scatter {rs:.3f} us + all_gather {ag:.3f} us" in line


def test_tree_table_and_its_errors(capsys):
    text = output(capsys, ["--ranks", "16", "--nodes", "2", "--size", "256M", "--nccl-algo",
                           "tree", "--nccl-proto", "Simple"])
    (row,) = table_rows(text)
    assert nccl_columns(text) == [("tree", "Simple", 16)]
    # tuning.cc's tree over the links: base 8.4 us; 2 x (7 NVLink steps of tree/Simple's 4.0 us
    # + 1 network step of its 14 us, NCCL's own on the default links); S at half the ring's
    # 8 NICs x 22.5 GB/s x the tree's busBw over the ring's, min(8 x 30 x 0.92, 8 x 23.6) /
    # (8 x 24) = 188.8 / 192 (the tree graph's bwIntra 30: tests/test_nccl_graph_search.py;
    # tree all-reduce x0.92 capped at perChMaxTreeBw) x 0.9 (treeCorrectionFactor at 256 MB)
    latency_us = 8.4 + 2 * (7 * 4.0 + 14.0)
    data_us = 256 * 2 ** 20 / (0.5 * 8 * IB_GBPS * 1e9 * 188.8 / 192 * 0.9) * 1e6
    assert row[2] == pytest.approx(latency_us + data_us, abs=0.006)
    for argv in (["--ranks", "8", "--size", "8M", "--nccl-algo", "tree", "--explain"],
                 ["--ranks", "16", "--nodes", "2", "--size", "8M", "--nccl-algo", "tree",
                  "--collective", "all_gather"]):
        assert simsp_ring(argv) == 2
        assert capsys.readouterr().err.startswith("error: --nccl-algo")
