"""The per-rank memory ledger: accounting by category, peaks, events, OOM results, misuse."""

import pytest

from simsp.scenario.loading import load_scenario
from simsp.engine.memory import CATEGORIES, Ledger, LiveTensor, MemEvent
from simsp.training.driver.layer_sim import simulate_layer

GiB = 1 << 30


class Clock:
    """A settable clock standing in for simpy's env.now."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_alloc_and_free_move_the_category_totals_and_the_total():
    ledger = Ledger(rank=3, capacity_bytes=GiB)
    ledger.alloc("w", 100, "weights", "init")
    ledger.alloc("a", 40, "activations", "ln1")
    ledger.alloc("t", 7, "temporaries", "gelu")
    assert ledger.current == {"weights": 100, "gradients": 0, "optimizer": 0,
                              "activations": 40, "temporaries": 7, "held_for_wgrad": 0,
                              "communication": 0}
    assert ledger.total == 147
    assert ledger.live_bytes("activations") == 40
    ledger.free("a")
    assert ledger.live_bytes("activations") == 0
    assert ledger.total == 107
    assert set(ledger.live) == {"w", "t"}


def test_every_category_is_accepted_and_an_unknown_one_raises():
    ledger = Ledger(rank=0, capacity_bytes=GiB)
    for i, category in enumerate(CATEGORIES):
        ledger.alloc(f"x{i}", i + 1, category, "op")
    assert ledger.total == sum(range(1, len(CATEGORIES) + 1))
    with pytest.raises(KeyError):
        ledger.alloc("y", 1, "scratch", "op")
    assert "y" not in ledger.live


def test_peaks_per_category_and_total_keep_the_maximum_seen():
    ledger = Ledger(rank=0, capacity_bytes=GiB)
    ledger.alloc("a1", 10, "activations", "op")
    ledger.alloc("a2", 20, "activations", "op")  # activations 30, total 30
    ledger.free("a1")  # activations 20
    ledger.alloc("t1", 50, "temporaries", "op")  # total 70
    ledger.free("t1")
    ledger.alloc("a3", 5, "activations", "op")  # activations 25 < 30
    assert ledger.peak_by_category["activations"] == 30
    assert ledger.peak_by_category["temporaries"] == 50
    assert ledger.peak_by_category["weights"] == 0
    assert ledger.peak_total == 70
    assert ledger.total == 25


def test_events_record_time_key_category_signed_delta_and_op():
    clock = Clock()
    ledger = Ledger(rank=0, capacity_bytes=GiB, clock=clock)
    ledger.alloc("x", 8, "temporaries", "matmul")
    clock.now = 1.5
    ledger.free("x", op="free x")
    assert ledger.events == [MemEvent(0.0, "x", "temporaries", 8, "matmul"),
                             MemEvent(1.5, "x", "temporaries", -8, "free x")]


def test_events_replay_to_the_current_totals_and_peaks():
    ledger = Ledger(rank=0, capacity_bytes=GiB)
    ledger.alloc("a", 3, "activations", "op")
    ledger.alloc("b", 4, "temporaries", "op")
    ledger.retag("b", "activations", "b_saved")
    ledger.free("a")
    replay = dict.fromkeys(CATEGORIES, 0)
    peak = dict.fromkeys(CATEGORIES, 0)
    for event in ledger.events:
        replay[event.category] += event.delta_bytes
        peak[event.category] = max(peak[event.category], replay[event.category])
    assert replay == ledger.current
    assert peak == ledger.peak_by_category


def test_retag_moves_bytes_between_categories_and_can_rename():
    clock = Clock()
    ledger = Ledger(rank=0, capacity_bytes=GiB, clock=clock)
    ledger.alloc("y", 64, "temporaries", "layernorm")
    clock.now = 2.0
    new_key = ledger.retag("y", "activations", "qkv_input")
    assert new_key == "qkv_input"
    assert ledger.live_bytes("temporaries") == 0
    assert ledger.live_bytes("activations") == 64
    assert ledger.live["qkv_input"] == LiveTensor("qkv_input", "activations", 64, "layernorm")
    assert "y" not in ledger.live
    assert ledger.events[-2:] == [MemEvent(2.0, "y", "temporaries", -64, "retag"),
                                  MemEvent(2.0, "qkv_input", "activations", 64, "layernorm")]
    # without a new name the key stays
    assert ledger.retag("qkv_input", "temporaries") == "qkv_input"
    assert ledger.live_bytes("temporaries") == 64 and ledger.live_bytes("activations") == 0


def test_retag_does_not_change_the_total_peak():
    ledger = Ledger(rank=0, capacity_bytes=GiB)
    ledger.alloc("y", 64, "temporaries", "op")
    ledger.retag("y", "activations")
    assert ledger.peak_total == 64
    assert ledger.total == 64


def test_double_alloc_raises_and_leaves_the_ledger_unchanged():
    ledger = Ledger(rank=5, capacity_bytes=GiB)
    ledger.alloc("x", 8, "temporaries", "op")
    with pytest.raises(KeyError, match="allocated twice"):
        ledger.alloc("x", 16, "activations", "op")
    assert ledger.total == 8 and len(ledger.events) == 1


def test_free_of_an_unknown_or_already_freed_key_raises():
    ledger = Ledger(rank=0, capacity_bytes=GiB)
    with pytest.raises(KeyError):
        ledger.free("never")
    ledger.alloc("x", 8, "temporaries", "op")
    ledger.free("x")
    with pytest.raises(KeyError):
        ledger.free("x")
    with pytest.raises(KeyError):
        ledger.retag("x", "activations")


def test_out_of_memory_names_rank_op_bytes_and_largest_live_tensors():
    clock = Clock()
    ledger = Ledger(rank=7, capacity_bytes=1000, clock=clock)
    ledger.alloc("weights", 500, "weights", "init")
    ledger.alloc("small", 10, "temporaries", "op")
    ledger.alloc("act_b", 200, "activations", "fc1")
    ledger.alloc("act_a", 200, "activations", "fc2")  # tie with act_b: ordered by key
    assert ledger.oom is None  # 910 of 1000
    clock.now = 3.25
    ledger.alloc("logits", 100, "temporaries", "logits_fp32")  # 1010 > 1000
    oom = ledger.oom
    assert oom is not None
    assert (oom.rank, oom.op, oom.key, oom.time_s) == (7, "logits_fp32", "logits", 3.25)
    assert (oom.bytes_asked, oom.bytes_in_use, oom.capacity_bytes) == (100, 910, 1000)
    assert [t.key for t in oom.largest_live] == ["weights", "act_a", "act_b", "small"]
    assert oom.largest_live[0] == LiveTensor("weights", "weights", 500, "init")


def test_exactly_full_is_not_out_of_memory():
    ledger = Ledger(rank=0, capacity_bytes=100)
    ledger.alloc("x", 100, "weights", "op")
    assert ledger.oom is None


def test_accounting_continues_after_oom_and_keeps_the_first_oom():
    ledger = Ledger(rank=1, capacity_bytes=100)
    ledger.alloc("a", 80, "activations", "first")
    ledger.alloc("b", 50, "activations", "second")  # first OOM
    ledger.alloc("c", 70, "temporaries", "third")  # still over: not recorded again
    assert ledger.oom.key == "b" and ledger.oom.op == "second"
    assert ledger.total == 200 and ledger.peak_total == 200
    ledger.free("c")
    ledger.free("b")
    assert ledger.total == 80
    assert ledger.oom.key == "b"  # the result stays once memory is back under capacity


def test_largest_live_is_capped_and_sorted_largest_first():
    ledger = Ledger(rank=0, capacity_bytes=GiB)
    for i in range(8):
        ledger.alloc(f"t{i}", i * 10, "temporaries", "op")
    assert [t.nbytes for t in ledger.largest_live()] == [70, 60, 50, 40, 30]
    assert [t.key for t in ledger.largest_live(2)] == ["t7", "t6"]


def test_a_simulated_layer_that_does_not_fit_reports_oom_and_still_finishes():
    """530B-sized layer, t = 1, b = 16, no recompute, meta mode: far beyond 80 GiB."""
    sc = load_scenario(None, {
        ("model", "hidden_size"): 20480, ("model", "num_attention_heads"): 128,
        ("model", "seq_length"): 2048, ("model", "vocab_size"): 51200,
        ("parallel", "micro_batch_size"): 16, ("run", "mode"): "meta"})
    result = simulate_layer(sc)
    ledger = result.ranks[0].ledger
    oom = ledger.oom
    assert oom is not None
    assert oom.rank == 0
    assert oom.op and oom.key
    assert oom.bytes_asked > 0
    assert oom.bytes_in_use + oom.bytes_asked > oom.capacity_bytes == 80 * GiB
    assert oom.bytes_in_use <= oom.capacity_bytes
    assert oom.largest_live and all(isinstance(t, LiveTensor) for t in oom.largest_live)
    sizes = [t.nbytes for t in oom.largest_live]
    assert sizes == sorted(sizes, reverse=True)
    # the simulation went on through forward and backward and freed every activation
    record = result.records[0]
    assert record.backward_end_s > record.forward_end_s > 0
    assert ledger.peak_total > 80 * GiB
    assert ledger.live_bytes("activations") == 0
