"""The out-of-memory advice's switches beyond SP, recompute, the distributed optimizer, the
micro-batch and the stages: Megatron-FSDP and FSDP2, activation offload, and the caching
allocator's expandable_segments (explore/whatif/oom_advice.py; docs/allocator.md, docs/fsdp.md).
Which switches fit is worked out here from bytes per parameter, with margins far wider than any
activation or buffer the simulation adds."""

from pathlib import Path

from simsp.engine.memory import Ledger
from simsp.explore.whatif.oom_advice import (allocator_timelines, candidate_switches,
                                             expandable_switch, explain_oom)
from simsp.scenario.loading import load_scenario, with_overrides
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

MiB, GiB = 1 << 20, 1 << 30
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

# A dense GPT of 6 layers, h = 8192, 64 heads, s = 512, V = 32000 on 8 A100s (80 GiB) in pure
# data parallelism, nothing sharded, no recompute.
H, LAYERS, SEQ, VOCAB = 8192, 6, 512, 32000
PER_LAYER = 12 * H * H + 13 * H  # K22's 12h^2 + 13h (QKV, projection, MLP, two norms)
N = LAYERS * PER_LAYER + VOCAB * H + SEQ * H + 2 * H  # + word and position embeddings, final norm
BYTES_PER_PARAM = 2 + 4 + 12  # bf16 weight, fp32 main gradient, fp32 master + Adam m and v
CAPACITY = 80 * GiB
ACTIVATION_BOUND = 10e9  # K22's sbh(34 + 5as/h) is 0.23 GB a layer here: 1.4 GB for six


def big_dense():
    """The scenario above: out of memory with its optimizer state alone."""
    sc = load_scenario(str(SCENARIOS / "tiny.toml"))
    return with_overrides(sc, model={"num_layers": LAYERS, "hidden_size": H,
                                     "num_attention_heads": 64, "seq_length": SEQ,
                                     "vocab_size": VOCAB},
                          parallel={"tensor_model_parallel_size": 1,
                                    "pipeline_model_parallel_size": 1, "data_parallel_size": 8,
                                    "sequence_parallel": False, "recompute_granularity": "none",
                                    "micro_batch_size": 1, "global_batch_size": 8},
                          run={"mode": "meta"})


def expected_fits() -> dict:
    """Per switch: its persistent bytes per GPU (a lower bound of its peak) and an upper bound
    (those plus the activations' bound, and for FSDP every parameter and gradient gathered)."""
    stage0 = (LAYERS // 2) * PER_LAYER + VOCAB * H + SEQ * H  # half the layers, the embeddings
    bounds = {
        "selective recompute": (BYTES_PER_PARAM * N, None),  # nothing of the state moves
        "full recompute": (BYTES_PER_PARAM * N, None),
        "activation offload (5 layers)": (BYTES_PER_PARAM * N, None),
        "distributed optimizer": (None, 6 * N + 12 * N / 8 + ACTIVATION_BOUND),
        "2 pipeline stages": (None, BYTES_PER_PARAM * stage0 + ACTIVATION_BOUND),
        "Megatron-FSDP (ZeRO-3)": (None, BYTES_PER_PARAM * N / 8 + 6 * N + ACTIVATION_BOUND),
        "PyTorch FSDP2": (None, (4 + 4 + 12) * N / 8 + 6 * N + ACTIVATION_BOUND),
    }
    fits = {}
    for name, (lower, upper) in bounds.items():
        assert (lower is not None and lower > CAPACITY) or (upper is not None and upper < CAPACITY)
        fits[name] = upper is not None
    return fits


def test_fsdp_and_offload_are_offered_where_they_apply():
    names = [name for name, _, _ in candidate_switches(big_dense())]
    assert names == ["selective recompute", "full recompute", "distributed optimizer",
                     "2 pipeline stages", "Megatron-FSDP (ZeRO-3)", "PyTorch FSDP2",
                     "activation offload (5 layers)"]


def test_the_bundled_oom_case_gets_no_fsdp_or_offload():
    """paper-175b has one data-parallel replica (nothing to shard) and 8 stages (Megatron
    offloads only without pipeline parallelism)."""
    sc = with_overrides(load_scenario(str(SCENARIOS / "paper-175b.toml")),
                        parallel={"sequence_parallel": False, "recompute_granularity": "none"})
    names = [name for name, _, _ in candidate_switches(sc)]
    assert names == ["sequence parallelism", "selective recompute",
                     "sequence parallelism + selective recompute (K22)", "full recompute",
                     "16 pipeline stages"]


def test_the_switches_that_fit_are_those_worked_out_by_hand():
    sc = big_dense()
    run = simulate_iteration(sc, Shortcuts.for_scale(sc))
    stage = {"stage": 0, "rank": 0, "allocator_oom": None, "capacity_bytes": CAPACITY}
    explanation = explain_oom(run, [stage])  # as run --caching-allocator gives it
    failing = explanation["stages"]
    assert [s["stage"] for s in failing] == [0]
    assert failing[0]["in_use_by_category_bytes"]["weights"] == 2 * N  # the state, first
    tried = {s["switch"]: s["fits"] for s in explanation["switches"]}
    # the allocator's setting cannot help a ledger over capacity
    assert tried == {**expected_fits(), "expandable segments": False}


def test_expandable_segments_fit_where_the_default_allocator_fragments():
    """docs/allocator.md's rules by hand, capacity 60 MiB: a 40 MiB request gets its own 40 MiB
    segment; freed, it is cached; 12 MiB splits it (28 MiB > 1 MiB remain); 30 MiB fits no
    cached block, so cudaMalloc(30 MiB) would reserve 70 MiB; the only segment is split, so
    nothing can be released: out of memory with 42 MiB allocated. With expandable segments the
    40 MiB are two 20 MiB pages; the 28 MiB free block at the segment's end grows by one page:
    60 MiB reserved, no failure."""
    ledger = Ledger(0, 60 * MiB)
    ledger.alloc("a", 40 * MiB, "activations", "op", time_s=0.0)
    ledger.free("a", time_s=1.0)
    ledger.alloc("b", 12 * MiB, "activations", "op", time_s=2.0)
    ledger.alloc("c", 30 * MiB, "activations", "op", time_s=3.0)
    default, = allocator_timelines([ledger])
    assert default.oom is not None and default.oom.nbytes == 30 * MiB
    switch = expandable_switch([ledger], 1.5)
    assert switch["fits"] and switch["peak_bytes"] == 60 * MiB
    assert switch["flags"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
