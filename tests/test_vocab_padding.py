"""--make-vocab-size-divisible-by N: the vocabulary padded to a multiple of N·t as Megatron-LM's
`_vocab_size_with_padding` does; the padded table is what embedding, head, FLOPs and memory use,
tokens still come from the original vocabulary, and numbers still equal one device's."""

from pathlib import Path

from hypothesis import given, settings, strategies as st
import pytest

from simsp import analytic
from simsp.scenario.config import Model, padded_vocab_size
from simsp.scenario.loading import load_scenario
from simsp.scenario.flags import Parser, add_scenario_arguments
from simsp.scenario.outside import scenario_from_args
from simsp.metrics.collect import collect
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from simsp.training.pipeline.plan import global_batch

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def megatron_padding(vocab: int, divisible_by: int, t: int) -> int:
    """Megatron-LM's loop, verbatim in spirit: add one until divisible by N·t."""
    after, multiple = vocab, divisible_by * t
    while after % multiple != 0:
        after += 1
    return after


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 60000), divisible_by=st.integers(1, 256), t=st.integers(1, 8))
def test_padding_equals_megatrons_loop(vocab, divisible_by, t):
    m = Model(vocab_size=vocab, make_vocab_size_divisible_by=divisible_by)
    assert padded_vocab_size(m, t) == megatron_padding(vocab, divisible_by, t)


@pytest.mark.parametrize("name", ["paper-22b", "paper-175b", "paper-530b", "paper-1t"])
def test_paper_models_are_unchanged(name):
    """v = 51200 = 50 · 1024 is already a multiple of 128 · 8."""
    assert load_scenario(SCENARIOS / f"{name}.toml").padded_vocab_size == 51200


def small(t: int, sp: bool = False, **model):
    """h 48, a 6, ffn 192, s 12: t = 3 and 6 divide the heads, the FFN and the sequence."""
    overrides = {("model", "num_layers"): 2, ("model", "hidden_size"): 48,
                 ("model", "num_attention_heads"): 6, ("model", "seq_length"): 12,
                 ("model", "vocab_size"): 100, ("parallel", "tensor_model_parallel_size"): t,
                 ("parallel", "sequence_parallel"): sp, ("parallel", "global_batch_size"): 2,
                 ("cluster", "gpus_per_node"): 8}
    overrides.update({("model", k): v for k, v in model.items()})
    return load_scenario(None, overrides)


@pytest.mark.parametrize("t,sp", [(3, True), (6, False)])
def test_t_3_and_6_equal_the_single_device_reference(t, sp):
    """v = 100 is padded to 128·t rows; each rank holds 128 of them; loss and gradients match."""
    sc = small(t, sp)
    assert sc.padded_vocab_size == 128 * t
    run = simulate_iteration(sc)
    for state in run.states.values():
        assert state.weights["embedding.word"].shape == (128, 48)
    errors = compare_with_reference(run)
    assert max(errors.values()) <= 1e-10, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def test_tokens_come_from_the_original_vocabulary():
    tokens, targets = global_batch(small(3))
    assert tokens.max() < 100 and targets.max() < 100


def test_head_memory_and_flops_use_the_padded_vocabulary():
    """t 2, v 1000 -> 1024: fp32 logits are 4·s·b·1024/2 bytes per rank; the counted GEMM
    FLOPs equal 72BLsh²(1 + s/6h + 1024/12hL)."""
    s, h, L, B = 64, 128, 2, 1
    sc = load_scenario(None, {("model", "vocab_size"): 1000, ("model", "hidden_size"): h,
                              ("model", "seq_length"): s, ("model", "num_layers"): L,
                              ("parallel", "tensor_model_parallel_size"): 2,
                              ("run", "mode"): "meta"})
    shortcuts = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, shortcuts)
    logits = [e.delta_bytes for e in run.inputs.world.ranks[0].ledger.events
              if e.key.endswith("logits_fp32") and e.delta_bytes > 0]
    assert logits and set(logits) == {4 * s * B * 1024 // 2}
    metrics = collect(run, shortcuts)
    expected = 72 * B * L * s * h * h * (1 + s / (6 * h) + 1024 / (12 * h * L))
    assert metrics["model_flops"] == pytest.approx(expected, rel=1e-12)
    assert metrics["counted_model_flops"] == pytest.approx(expected, rel=1e-9)
    assert (metrics["layout"]["vocab"], metrics["layout"]["padded_vocab"]) == (1000, 1024)
    assert analytic.model_flops(sc.model, sc.parallel) == pytest.approx(expected, rel=1e-12)


def test_flag_sets_the_multiple():
    parser = Parser()
    add_scenario_arguments(parser)
    args = parser.parse_args(["--vocab-size", "129", "--make-vocab-size-divisible-by", "1",
                              "--tensor-model-parallel-size", "3", "--num-attention-heads", "6",
                              "--hidden-size", "48"])
    sc = scenario_from_args(args)
    assert sc.model.make_vocab_size_divisible_by == 1 and sc.padded_vocab_size == 129
