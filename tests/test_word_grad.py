"""The word embedding's gradient as PyTorch and Megatron-LM run it (model/blocks/embedding.py
word_grad_kernels, docs/hardware.md §6): the dense table zeroed, the tokens' rows scattered,
autograd's sum with an earlier contribution, Megatron's main_grad.add_; bytes counted by hand."""

import pytest

from simsp.hardware.constants import compute_for
from simsp.hardware.costmodel import kernel_time
from simsp.model.blocks.embedding import word_grad_kernels
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import simulate_iteration

S, H, V = 64, 128, 256  # tiny GPT: sequence, hidden, vocabulary (padded to 256 at t 1)
GPT = {"num_layers": 1, "hidden_size": H, "num_attention_heads": 4, "seq_length": S,
       "vocab_size": V}


def test_llama3_8b_lookup_by_hand():
    # 4096 tokens (one CP rank's micro-batch) into 128256 x 4096 rows, bf16 gradient, fp32 main
    kernels = word_grad_kernels(4096, 128256, 4096, 2, 4, after_other=False, fold=True)
    zeros = 128256 * 4096 * 2  # 1,050,673,152 B
    sorted_scatter = 4096 * 4096 * (2 + 4 + 4 + 2)  # read rows, fp32 partials out and in, rows
    add = 128256 * 4096 * (4 + 2 + 4)  # main gradient read, table read, main gradient written
    assert kernels == (zeros, sorted_scatter, add)
    assert kernels == (1_050_673_152, 201_326_592, 5_253_365_760)


def test_small_batch_kernel_and_tied_sum():
    # 3072 tokens: PyTorch's feature kernel (reads the rows, adds them into the table in place)
    assert word_grad_kernels(3072, 10, 8, 2, 4, False, True) == (160, 2 * 3072 * 8 * 2, 800)
    # 3073 tokens: the sorted path
    assert word_grad_kernels(3073, 10, 8, 2, 4, False, True)[1] == 3073 * 8 * 12
    # tied with the output layer on the same rank: summed with its placeholder, no add
    assert word_grad_kernels(64, 10, 8, 2, 4, True, False) == (160, 2 * 64 * 8 * 2, 480)
    # bf16 main gradients (--main-grads-dtype bf16): the add moves 2 + 2 + 2 bytes
    assert word_grad_kernels(64, 10, 8, 2, 2, False, True)[2] == 10 * 8 * 6


def _lookup_spans(**model) -> dict:
    """{kernel name: seconds} of the lookup's backward on rank 0 of a TP 1, PP 1 H100 run."""
    overrides = {("run", "mode"): "meta", ("cluster", "system"): "dgx-h100"}
    overrides.update({("model", k): v for k, v in {**GPT, **model}.items()})
    world = simulate_iteration(load_scenario(None, overrides)).inputs.world
    spans = world.trace.spans_of(0, "compute")
    return {s.name: s.end_s - s.start_s for s in spans if s.name.startswith("d_word_embedding")}


@pytest.mark.parametrize("untie", [False, True])
def test_the_run_prices_the_table_per_micro_batch(untie):
    cal = compute_for("h100-sxm-80gb")
    tokens = S * 1  # micro-batch 1
    table = V * H

    def t(nbytes):
        return kernel_time("elementwise", 0, nbytes, cal=cal)

    expected = {"d_word_embedding": t(table * 2), "d_word_embedding_1": t(2 * tokens * H * 2)}
    if untie:  # alone on the table: Megatron's hook adds it into the fp32 main gradient
        expected["d_word_embedding_2"] = t(table * 10)
    else:  # tied at PP 1: autograd sums it with the output layer's placeholder; no add
        expected["d_word_embedding_2"] = t(table * 6)
    assert _lookup_spans(untie_embeddings_and_output_weights=untie) == pytest.approx(
        expected, rel=1e-12)
