"""The ring lesson's numbers derived once and shown the same in the nccl-tests table, the
--explain text, the page and the slides (channels, the call's time), sizes read as nccl-tests
reads -b/-e, and the ring attention page's backward wording; against numbers worked by hand."""

import re

import pytest

from simsp.cluster.topology import build_topology
from simsp.report.lessons.ring_flags import ring_placement
from simsp.errors import UserError
from simsp.report.lessons.ring import lesson_data
from simsp.report.lessons.ring_page import lesson_html
from simsp.report.lessons.ring_text import lesson_text
from simsp.units import GiB, parse_size
from tests.test_ring_cli import nccl_columns, output, table_rows

# Two DGX A100 nodes, 16 ranks, 1 GiB all-reduce, NCCL's ring/Simple: a chunk is 1 GiB / 16 =
# 64 MiB, cut over 8 ring orders (one per rail) = 8 MiB per hop; the slowest hop of every step
# is a node crossing (GPU -> NVSwitch -> PXN relay GPU, then NIC -> rail leaf -> NIC) at
# 25 GB/s x ib_efficiency 0.9. 2(n-1) = 30 steps, NCCL's ring latency on the default links
# (src/graph/tuning.cc: 28 NVLink steps at max(3.4, 3 x 2.0 network overhead) us + 2 node
# crossings at 14 us = 196 us), and NCCL's base latency for ring/Simple, 8.4 us (baseLat),
# once per call.
TWO_NODE_STEP_S = 8 * 2**20 / (25e9 * 0.9)
TWO_NODE_CALL_S = 30 * TWO_NODE_STEP_S + 196e-6 + 8.4e-6  # 11,389.21 us
# One node, 8 ranks, 1 GiB: 128 MiB per step over one NVSwitch hop at 300 x 0.78 GB/s plus
# NCCL's ring/Simple NVLink step latency (3.4 us), 14 steps, the same base latency.
ONE_NODE_CALL_S = 14 * (2**27 / (300e9 * 0.78) + 3.4e-6) + 8.4e-6  # 8,086.12 us


def _lesson(ranks: int, nodes: int, size: int) -> dict:
    cluster, gpus = ring_placement(ranks, nodes)
    return lesson_data("all_reduce", build_topology(cluster), gpus, size)


@pytest.mark.parametrize("ranks, nodes, call_s, nch, orders", [
    (16, 2, TWO_NODE_CALL_S, 16, 8),  # a channel per GPU a node holds, doubled (connect.cc)
    (8, 1, ONE_NODE_CALL_S, None, 1)])
def test_table_text_and_page_give_one_time_and_one_channel_count(capsys, ranks, nodes, call_s,
                                                                  nch, orders):
    text = output(capsys, ["--ranks", str(ranks), "--nodes", str(nodes), "--size", "1G"])
    (row,), ((algorithm, protocol, table_nch),) = table_rows(text), nccl_columns(text)
    assert (algorithm, protocol) == ("ring", "Simple")
    assert row[2] == pytest.approx(call_s * 1e6, abs=0.005)  # the table prints 2 decimals
    if nch is not None:
        assert table_nch == nch
    words = f"{table_nch} NCCL channels on {orders} ring order{'s' if orders > 1 else ''}"
    assert f"# {words} ({table_nch // orders} channels per order)" in text
    data = _lesson(ranks, nodes, GiB)
    assert data["nccl_channels"] == table_nch and len(data["channels"]) == orders
    assert data["call_s"] == pytest.approx(call_s, rel=1e-12)
    explain = "\n".join(lesson_text(data))
    assert f"runs as {words}" in explain
    assert f"= {call_s * 1e6:.3f} us (the simsp ring table's time)" in explain
    page = lesson_html(data, "t")
    assert words in page
    shown = f"{call_s * 1e6:,.2f} µs"
    assert f"one call {shown}" in page and f"<b>{shown}</b>" in page
    assert re.search(r"\d+ channel\(s\)", page + text + explain) is None


def test_the_comparison_bars_are_whole_calls():
    """All-reduce (one call) = the table's time; RS + AG as two calls pay the base latency
    twice: exactly 8.4 us more."""
    page = lesson_html(_lesson(16, 2, GiB), "t")
    assert f"{TWO_NODE_CALL_S * 1e6:,.2f} µs<br>" in page
    assert "Modelled difference: 8.40 µs" in page


@pytest.mark.parametrize("text, expected", [
    ("8", 8), ("1K", 1024), ("64k", 65536), ("1M", 2**20), ("1G", 2**30), ("1GB", 2**30),
    ("1GiB", 2**30), ("1g", 2**30), ("1.5M", 1572864), ("0.5K", 512), ("8B", 8)])
def test_sizes_are_read_as_nccl_tests_reads_them(text, expected):
    """src/common.cu parsesize: a number then K, M or G as powers of 1024 (1GB = 2^30 B)."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["1T", "1e3", "-8", "1_024", "", "0", "1MBx", "\u0661"])
def test_sizes_nccl_tests_would_not_read_are_refused(text):
    with pytest.raises(UserError):
        parse_size(text)


def test_the_ring_help_says_how_sizes_are_read(capsys):
    from tests.test_ring_cli import simsp_ring
    assert simsp_ring(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "powers of 1024 as nccl-tests reads -b/-e: 1G = 1GB = 2^30 bytes" in help_text


def test_the_ring_attention_backward_names_its_own_block_plainly():
    """The last backward step: rank r holds its own K/V again, never "rank r+4 = its own's"."""
    from simsp.report.lessons.ring_attention_page import SCRIPT
    assert "= its own'" not in SCRIPT and "its own K/V again" in SCRIPT
