"""held_for_wgrad: what a split backward's B keeps for its deferred W step (model/base/
wgrad_store.py), its own memory category from B's hand-over to W's free (docs/schedules.md).

Hand counts on the default dense test model (h 64, s 32, FFN 4h, bf16), one layer a stage,
micro-batch 1, meta mode: s·b·h = 2048 elements = 4096 B. One pending W holds each linear's
input and output gradient: inputs of QKV, proj, fc1 (4096 each) and fc2 (4h: 16384) = 28672 B,
output gradients of QKV (3h: 12288), proj (4096), fc1 (4h: 16384) and fc2 (4096) = 36864 B;
65536 B a micro-batch. The totals are checked against the same run labelled as before the
category existed (each held tensor kept in its own category)."""

import numpy as np
import pytest
from test_delay_wgrad import _scenario as delay_wgrad_scenario

from simsp.engine.allocator.snapshot_diff import paired_across_held
from simsp.engine.allocator.snapshot_profile import Allocation
from simsp.engine.memory import HELD_FOR_WGRAD, Ledger
from simsp.explore.evaluation.evaluate import collect_metrics, summary_columns
from simsp.report.run.memory_timeline import memory_timeline
from simsp.report.whatif.comparison import memory_clause
from simsp.training.driver.iteration import simulate_iteration
from tests.test_pipeline import scenario

PER_MICRO_BATCH = 28672 + 36864  # bytes one pending W holds on a one-layer middle stage
FC2_W_INPUTS = 16384 + 4096  # fc2's input (4h) and output gradient (h): the first B hands over


def one_layer_stages(pp: int, schedule: str, micro_batches: int):
    """The default dense model, one layer per model chunk (ZB-V's two chunks a rank: 2·PP
    layers), micro-batch 1, meta mode."""
    parallel = {"pipeline_model_parallel_size": pp, "micro_batch_size": 1,
                "global_batch_size": micro_batches, "schedule": schedule}
    layers = 2 * pp if schedule == "zbv" else pp
    return scenario(model={"num_layers": layers}, parallel=parallel, run={"mode": "meta"})


def labelled_as_before(monkeypatch):
    """Every hand-over to W keeps the tensor's own category (simsp before held_for_wgrad)."""
    retag = Ledger.retag

    def keep_category(self, key, category, new_key=None):
        if category == HELD_FOR_WGRAD:
            category = self.live_set.get(key).category
        return retag(self, key, category, new_key)
    monkeypatch.setattr(Ledger, "retag", keep_category)


def summaries(run, pp: int) -> list:
    """Each pipeline stage's (rank = stage here) memory summary."""
    return [run.inputs.world.ranks[rank].ledger.summary() for rank in range(pp)]


@pytest.mark.parametrize("rank", [1, 2])
def test_zb_h1_holds_rank_plus_one_micro_batches(rank):
    """ZB-H1 (PP 4, m 8): stage r runs W of micro-batch i after B of i + r
    (arXiv:2401.10241 Fig. 3), so r + 1 Ws are pending at most: held_for_wgrad peaks at
    (r + 1) × 65536 B. The stage's total peak falls in the backward of fc1 of the (r + 1)-th
    pending B, which has handed over only fc2's W inputs: r × 65536 + 20480 B."""
    run = simulate_iteration(one_layer_stages(4, "zb-h1", 8))
    summary = summaries(run, 4)[rank]
    assert summary.peak_by_category[HELD_FOR_WGRAD] == (rank + 1) * PER_MICRO_BATCH
    assert summary.at_peak[HELD_FOR_WGRAD] == rank * PER_MICRO_BATCH + FC2_W_INPUTS
    assert run.inputs.world.ranks[rank].ledger.final_bytes()[HELD_FOR_WGRAD] == 0


def test_dualpipe_middle_ranks_hold_half_rank_plus_one_micro_batches():
    """DualPipe (PP 4, m 8): a middle rank (half-rank h = 1) holds h + 1 = 2 pending Ws at
    most (deepseek-ai/DualPipe 3da1bbea dualpipe.py steps 6-8, docs/dualpipe.md)."""
    run = simulate_iteration(one_layer_stages(4, "dualpipe", 8))
    for summary in summaries(run, 4)[1:3]:
        assert summary.peak_by_category[HELD_FOR_WGRAD] == 2 * PER_MICRO_BATCH


def test_1f1b_holds_nothing_for_wgrad():
    """1F1B's backward is whole: no byte is ever held for a W step."""
    run = simulate_iteration(one_layer_stages(4, "1f1b", 8))
    for summary in summaries(run, 4):
        assert summary.peak_by_category[HELD_FOR_WGRAD] == 0


def assert_relabelled(new, old):
    """Every rank: the same totals at every moment and the same peaks; at each peak the held
    bytes came out of activations, temporaries and communication and nothing else."""
    assert new.inputs.world.ranks.keys() == old.inputs.world.ranks.keys()
    for rank in new.inputs.world.ranks:
        new_ledger = new.inputs.world.ranks[rank].ledger
        old_ledger = old.inputs.world.ranks[rank].ledger
        new_times, new_state = memory_timeline(new_ledger)  # (n,), (n, 7)
        old_times, old_state = memory_timeline(old_ledger)  # (n,), (n, 7)
        assert np.array_equal(new_times, old_times)
        assert np.array_equal(new_state.sum(axis=1), old_state.sum(axis=1))
        assert not old_state[:, list(new_ledger.current).index(HELD_FOR_WGRAD)].any()
        n, o = new_ledger.summary(), old_ledger.summary()
        assert (n.peak_total, n.peak_time_s) == (o.peak_total, o.peak_time_s)
        for category in ("weights", "gradients", "optimizer"):
            assert n.at_peak[category] == o.at_peak[category]
        moved = ("activations", "temporaries", "communication")
        assert sum(o.at_peak[c] - n.at_peak[c] for c in moved) == n.at_peak[HELD_FOR_WGRAD]
        assert all(n.at_peak[c] <= o.at_peak[c] for c in moved)


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv", "dualpipe"])
def test_totals_equal_those_before_the_category(monkeypatch, schedule):
    """The held bytes are relabelled, not added: every moment's total and every peak as
    before; zero-bubble and DualPipe, PP 4, m 8."""
    sc = one_layer_stages(4, schedule, 8)
    new = simulate_iteration(sc)
    assert max(s.peak_by_category[HELD_FOR_WGRAD] for s in summaries(new, 4)) > 0
    labelled_as_before(monkeypatch)
    assert_relabelled(new, simulate_iteration(sc))


def test_delay_wgrad_compute_holds_for_its_deferred_gemms(monkeypatch):
    """--delay-wgrad-compute with the EP overlap (training/pipeline/delay_wgrad.py, PP 2 × 2
    chunks of the tiny MoE model, meta): the deferred GEMMs' inputs are held_for_wgrad until
    they run, and the totals are as before."""
    sc = delay_wgrad_scenario(2, "meta")
    new = simulate_iteration(sc)
    for r in new.inputs.world.ranks.values():
        ledger = r.ledger
        assert ledger.summary().peak_by_category[HELD_FOR_WGRAD] > 0
        assert ledger.final_bytes()[HELD_FOR_WGRAD] == 0
    labelled_as_before(monkeypatch)
    assert_relabelled(new, simulate_iteration(sc))


def test_a_result_row_and_the_whatif_clause_name_the_held_bytes_at_the_peak():
    """ZB-H1 PP 4, m 8: the busiest stage is stage 0 (the embedding's weights and state), whose
    W runs right after its B (delay 0): at its peak, in fc1's backward, it holds fc2's W inputs
    alone, 20480 B; the what-if sentence names them, and a row without any names none."""
    row = summary_columns(collect_metrics(one_layer_stages(4, "zb-h1", 8)), 80 * 2**30)
    assert (row["peak_stage"], row["held_for_wgrad_at_peak_bytes"]) == (0, FC2_W_INPUTS)
    row.update(status="ok", fits=True, memory_reserve_bytes=0.0)
    assert "(20.00 KiB of it held_for_wgrad, kept for deferred W steps)" in memory_clause(row)
    row["held_for_wgrad_at_peak_bytes"] = 0
    assert "held_for_wgrad" not in memory_clause(row)


def test_memory_diff_pairs_a_real_activation_with_simsps_held_tensor():
    """A real snapshot names a W input where it was made (activations, temporaries,
    communication); simsp's export calls it held_for_wgrad. Left over after the exact match,
    the two pair one to one by size and layer (or no layer); nothing else pairs."""
    extra = [Allocation(4096, "activations", None, "real fc1 input"),
             Allocation(4096, "temporaries", 2, "real grad, layer 2"),
             Allocation(512, "weights", None, "real weight"),
             Allocation(4096, "activations", None, "real, one too many")]
    missing = [Allocation(4096, HELD_FOR_WGRAD, 3, "simsp held, layer 3"),
               Allocation(4096, HELD_FOR_WGRAD, 1, "simsp held, layer 1"),
               Allocation(512, HELD_FOR_WGRAD, None, "simsp held, weight-sized")]
    still_extra, still_missing = paired_across_held(extra, missing)
    assert [a.site for a in still_extra] == ["real grad, layer 2", "real weight"]
    assert [a.site for a in still_missing] == ["simsp held, weight-sized"]
