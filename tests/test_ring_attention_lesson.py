"""The ring attention lesson (`simsp ring --collective ring_attention`): the blocks each rank
computes against the causal triangle counted from token positions, a CP = 2 timeline worked by
hand (send exposed across nodes), each send's formula against the simulated transfer, the command
line, and the page in headless Chromium (buttons and keys fill the grid), screenshotted."""

import json

import pytest
from browser import chromium, page_verdict, screenshot
from inprocess import cli

from simsp.cluster.topology import build_topology
from simsp.report.lessons.ring_flags import ring_placement
from simsp.hardware.costmodel import calibration, kernel_time
from simsp.hardware.constants import compute_for
from simsp.model.context_split import visible_pairs
from simsp.report.lessons.ring_attention import (PHASES, AttentionShape, block_pairs,
                                                 chunk_blocks, held_rank, lesson_data,
                                                 plain_split_pairs)

IB_RATE_BPS = 25e9 * 0.9  # one HDR NIC at ib_efficiency
IB_RAIL_LATENCY_S = 2e-6  # GPU 0 to GPU 8: NIC to rail 0's leaf to NIC, 1 µs per link


def data_for(cp: int, shape: AttentionShape, nodes: int | None = None) -> dict:
    cluster, gpus = ring_placement(cp, nodes)
    return lesson_data(build_topology(cluster), gpus, shape)


# ---------------------------------------------------------------- the causal triangle

@pytest.mark.parametrize("cp", [2, 3, 4, 8])
@pytest.mark.parametrize("phase", PHASES)
def test_every_causal_block_is_computed_once_per_phase(cp, phase):
    chunks = 2 * cp
    computed = [(q, k) for r in range(cp) for step in range(cp)
                for q, k, _kind in chunk_blocks(cp, r, held_rank(phase, r, step, cp))]
    assert sorted(computed) == [(q, k) for q in range(chunks) for k in range(q + 1)]


@pytest.mark.parametrize("cp", [2, 4])
def test_pairs_per_step_are_the_positions_count(cp):
    """Each rank's blocks at each forward step hold the causal pairs its token positions see
    (model/context_split.visible_pairs), and the plain split's totals are its positions' too."""
    s = 16 * cp
    for rank in range(cp):
        for step in range(cp):
            blocks = chunk_blocks(cp, rank, held_rank("forward", rank, step, cp))
            assert block_pairs(blocks, s // (2 * cp)) == visible_pairs(s, cp, rank, step)
    assert plain_split_pairs(s, cp) == [sum(visible_pairs(s, cp, r, i, load_balanced=False)
                                            for i in range(cp)) for r in range(cp)]


def test_the_backward_ends_on_each_ranks_own_block():
    """TE's backward walks the forward's blocks in reverse: rank r+1's first, its own last."""
    assert [held_rank("backward", 0, i, 4) for i in range(4)] == [1, 2, 3, 0]
    assert [held_rank("forward", 0, i, 4) for i in range(4)] == [0, 3, 2, 1]


# ---------------------------------------------------------------- the timeline

def _block_s(n: int, d: int, heads: int, diagonal: bool, gemms: int) -> float:
    """A block's GEMMs priced one by one: the whole (n, n) block at the diagonal, half off it."""
    cols = n if diagonal else n // 2
    return gemms * kernel_time("gemm", 2 * heads * n * d * cols, 0, gemm=(n, d, cols))


def test_cp2_across_two_nodes_by_hand():
    """cp = 2 on two nodes, a short sequence: every send (one K/V block over InfiniBand) is
    longer than its block, so each step lasts the send: forward end = max(f0, T) + f1, then
    max(b0, T) + max(b1, T), b0 off the diagonal and b1 on it."""
    shape = AttentionShape(seq_length=512, heads=4, kv_heads=4, head_dim=128, micro_batch=1)
    data = data_for(2, shape, nodes=2)
    n = 256
    kv = 2 * 4 * n * 128 * 2  # K and V, 4 heads, BF16
    t = IB_RAIL_LATENCY_S + kv / IB_RATE_BPS
    f0, f1 = _block_s(n, 128, 4, True, 2), _block_s(n, 128, 4, False, 2)
    b0, b1 = _block_s(n, 128, 4, False, 5), _block_s(n, 128, 4, True, 5)
    assert t > max(f0, b0, b1)  # exposed: the lesson must say so
    forward_end = max(f0, t) + f1
    assert data["end_s"] == pytest.approx(forward_end + max(b0, t) + max(b1, t), abs=1e-12)
    first, *_ = data["steps"]
    assert data["kv_bytes"] == kv and first["bytes_per_rank"] == kv
    assert first["transfer"]["time_s"] == pytest.approx(t, abs=1e-12)
    assert first["transfer_s"] == pytest.approx(t, abs=1e-12)
    assert first["exposed_s"] == pytest.approx(t - f0, abs=1e-12)
    assert first["verdict"].startswith("exposed")
    assert [s["compute"]["time_s"] for s in data["steps"]] == pytest.approx([f0, f1, b0, b1],
                                                                            abs=1e-15)


@pytest.mark.parametrize("cp, nodes", [(4, 1), (8, 2)])
def test_each_send_formula_is_the_simulated_transfer(cp, nodes):
    data = data_for(cp, AttentionShape(8192, 8, 1, 128, 1), nodes)
    sends = [s for s in data["steps"] if s["transfer"]]
    assert len(sends) == 2 * cp - 1  # none after the forward's last block
    for step in sends:
        assert step["transfer"]["time_s"] == pytest.approx(step["transfer_s"], rel=1e-12)
        assert step["bytes_per_rank"] == data["kv_bytes"] * (
            2 if step["moves"] == "K/V + dK/dV" else 1)
    balance = data["balance"]
    assert sum(balance["balanced_pairs"]) == sum(balance["plain_pairs"]) == \
        balance["causal_pairs"]
    assert len(set(balance["balanced_pairs"])) == 1


# ---------------------------------------------------------------- the command line

def test_the_text_table_and_json(tmp_path):
    code, out, _ = cli(["ring", "--collective", "ring_attention", "--ranks", "4", "--explain"])
    assert code == 0
    assert "forward step 4/4" in out and "backward step 4/4" in out
    assert "rank 1: holds the K/V of rank 0, computes q1.k0, q6.k0; sends K/V of r0 to rank 2" \
        in out
    # backward: the K/V held goes on to rank r - 1, with the dK/dV of the block held before;
    # the last step's dK/dV goes home (rank 1 held rank 0's block at backward step 3)
    assert "sends K/V of r3 + dK/dV of r2 to rank 0" in out  # rank 1, backward step 2
    assert "rank 1: holds the K/V of rank 1, computes q1.k1 (triangle), q6.k1, q6.k6 " \
        "(triangle); sends dK/dV of r0 to rank 0" in out
    assert "hidden: the send takes" in out and "# forward + backward:" in out
    code, out, _ = cli(["ring", "--collective", "ring_attention", "--ranks", "2", "--json"])
    assert code == 0 and json.loads(out)["cp"] == 2


def test_a_systems_gpu_prices_the_blocks():
    """--system dgx-h100: the H100 profile's compute model times the blocks, not the A100 fit."""
    code, out, _ = cli(["ring", "--collective", "ring_attention", "--ranks", "2", "--json",
                        "--system", "dgx-h100"])
    first = json.loads(out)["steps"][0]
    n, heads, d = 4096, 8, 128  # s 8192 on cp 2; Llama 3 70B's heads on t = 8
    with calibration(compute_for("h100-sxm-80gb")):
        h100 = _block_s(n, d, heads, True, 2)
    assert code == 0 and first["compute"]["time_s"] == pytest.approx(h100, rel=1e-12)
    assert h100 < _block_s(n, d, heads, True, 2) / 2  # the A100 fit's, outside the block


@pytest.mark.parametrize("args, field", [
    (["--collective", "ring_attention", "--ranks", "4", "--size", "1M"], "--size"),
    (["--collective", "ring_attention", "--ranks", "4", "--seq-length", "100"], "--seq-length"),
    (["--collective", "ring_attention", "--ranks", "4", "--png", "slides"], "--png"),
    (["--collective", "ring_attention", "--ranks", "32", "--nodes", "4"], "--ranks"),
    (["--collective", "ring_attention", "--ranks", "4", "--num-query-groups", "3"],
     "--num-query-groups"),
    (["--ranks", "4", "--size", "1M", "--seq-length", "4096"], "--seq-length"),
])
def test_ring_attention_flag_errors(args, field):
    code, out, err = cli(["ring", *args])
    assert code == 2 and err.startswith(f"error: {field}:") and len(err.splitlines()) == 1


# ---------------------------------------------------------------- in a real browser

@pytest.mark.parametrize("cp, nodes", [(4, 1), (8, 2)])
def test_ring_attention_page_steps_in_chromium(cp, nodes, tmp_path):
    chromium()
    page = tmp_path / f"ring-attention-{cp}.html"
    code, _, err = cli(["ring", "--collective", "ring_attention", "--ranks", str(cp),
                        "--nodes", str(nodes), "--html", str(page)])
    assert code == 0, err
    verdict, console = page_verdict(page, tmp_path)
    assert console == [] and verdict["errors"] == []
    stepping, chunks = verdict["stepping"], 2 * cp
    assert stepping["advanced"] and stepping["back"] and stepping["steps"] == 2 * cp
    assert stepping["arrows_at_first"] == cp  # every rank sends its K/V on
    assert stepping["cells_after_forward"] == chunks * (chunks + 1) // 2  # the whole triangle
    assert stepping["masked_cells"] == chunks * (chunks - 1) // 2
    assert stepping["grad_cells_at_end"] == chunks * (chunks + 1) // 2
    assert stepping["keys_advanced"] and stepping["page_up"] and stepping["space_plays"]
    assert " µs = " in stepping["formula_at_end"]
    shot = screenshot(page, tmp_path / f"{page.stem}.png", tmp_path, "1400,1600")
    assert len(shot) > 10_000
