"""What DualPipe holds at its memory peak (docs/dualpipe.md, "DualPipe's peak memory"): the
zero-bubble backwards' deferred weight-gradient inputs. Upstream's step() (deepseek-ai/DualPipe
3da1bbea, dualpipe/dualpipe.py lines 404-424) turns zero bubble on half-way through step 6
(nB1B0), keeps one W pending per B through step 7 (nWB0: W then B) and pops them all in step 8
(nW, h + 1 times): a rank at half-rank h = min(r, PP - 1 - r) holds the W inputs of h + 1
micro-batches at once, counted here by hand from those loops."""

import pytest

from simsp.training.driver.iteration import simulate_iteration
from tests.test_pipeline import scenario


def weight_gradient_holds(ledger) -> tuple[int, dict]:
    """The most micro-batches with W inputs ("wgrad_hold." keys) live at once, and the bytes by
    category of those inputs when their total is highest (all held_for_wgrad), walking the log
    in time order."""
    events, log = ledger.events, ledger.sorted_log()
    held, live, most, top, top_bytes = {}, {}, 0, {}, 0  # held: micro-batch -> live tensors
    for position in log.order.tolist():  # time order, ties as recorded
        e = events[position]
        if ".wgrad_hold." not in e.key:
            continue
        micro_batch = e.key.split(".")[0]
        held[micro_batch] = held.get(micro_batch, 0) + (1 if e.delta_bytes > 0 else -1)
        live[e.category] = live.get(e.category, 0) + e.delta_bytes
        if not held[micro_batch]:
            del held[micro_batch]
        most = max(most, len(held))
        if sum(live.values()) > top_bytes:
            top, top_bytes = dict(live), sum(live.values())
    assert not held and not any(live.values())  # every W ran and freed what it read
    return most, top


def dense_dualpipe(pp: int):
    """The default dense test model (h 64, s 32, FFN 4h, biases, dropout, bf16), one layer a
    chunk, t 1, d 1, micro-batch 1, m 2·PP, meta mode."""
    parallel = {"pipeline_model_parallel_size": pp, "micro_batch_size": 1,
                "global_batch_size": 2 * pp, "schedule": "dualpipe"}
    return simulate_iteration(scenario(model={"num_layers": pp}, parallel=parallel,
                                       run={"mode": "meta"}))


@pytest.mark.parametrize("pp", [4, 8])
def test_a_rank_holds_the_w_inputs_of_half_rank_plus_one_micro_batches(pp):
    """Rank r holds h + 1 micro-batches' W inputs at most (PP 8: 1, 2, 3, 4, 4, 3, 2, 1), the
    count upstream's steps 6-8 give; on a middle rank (no embedding or head) their bytes are
    h + 1 layers' worth, counted by hand, all of it held_for_wgrad: each linear keeps its input
    and its output gradient for its weight-gradient GEMM. With s·b·h = 32·1·64 elements of 2
    bytes (bf16) = 4096 B: inputs of QKV, proj and fc1 (4096 each) and fc2 (4h: 16384) = 28672
    B; output gradients of QKV (3h: 12288), proj (4096, its dropout's input gradient), fc1
    (16384) and fc2 (4096) = 36864 B."""
    run = dense_dualpipe(pp)
    for rank in range(pp):
        most, top = weight_gradient_holds(run.inputs.world.ranks[rank].ledger)
        half_rank = min(rank, pp - 1 - rank)
        assert most == half_rank + 1, rank
        if 0 < rank < pp - 1:
            assert top == {"held_for_wgrad": (half_rank + 1) * (28672 + 36864)}, rank
