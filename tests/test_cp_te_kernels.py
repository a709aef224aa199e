"""Transformer Engine's bookkeeping kernels around p2p context-parallel attention
(simsp/training/context_parallel/te_p2p_kernels.py): the bytes of each, by hand from
AttnFuncWithCPAndKVP2P's branches, and their place in a layer's kernels."""

import pytest

from simsp.scenario.loading import load_scenario
from simsp.training.context_parallel import te_p2p_kernels as te
from simsp.training.driver.layer_sim import simulate_layer

Q, K, V, LSE = 1000, 200, 200, 40  # a rank's q (= output), k, v and fp32 logsumexp bytes


def test_forward_by_hand_cp2():
    # rank 0: step 1's block is the second query half against rank 1's first chunk
    # (i > rank): half merges; rank 1: step 1 <= rank, whole merges
    assert te.forward_prologue(K + V) == [("cp_kv_pack", 2 * 400)]
    assert te.forward_step(0, 0, LSE) == [("cp_lse_0", 2 * 40)]
    assert te.forward_step(1, 0, LSE) == [("cp_lse_1", 3 * 20)]
    assert te.forward_step(1, 1, LSE) == [("cp_lse_1", 3 * 40)]
    assert te.forward_epilogue(2, 0, Q) == [("cp_out_correction_0", 2 * 1000),
                                           ("cp_out_correction_1", 3 * 500)]
    assert te.forward_epilogue(2, 1, Q) == [("cp_out_correction_0", 2 * 1000),
                                           ("cp_out_correction_1", 3 * 1000)]


def test_backward_by_hand_cp2():
    # rank 0 (turn = 1): step 0 copies dQ's second half and dK, dV whole; step 1 (the
    # diagonal) copies dQ's first half and adds its second, adds dK/dV's first half and copies
    # the second. Rank 1 (turn = 0): step 0 copies dQ whole and dK, dV's first halves; step 1
    # adds all three whole.
    assert te.backward_prologue(K + V) == [("cp_kv_copy", 2 * 400)]
    assert te.backward_step(0, 2, 0, Q, K, V) == [("cp_dq_0", 2 * 500), ("cp_dk_0", 2 * 200),
                                                  ("cp_dv_0", 2 * 200)]
    assert te.backward_step(1, 2, 0, Q, K, V) == [
        ("cp_dq_1", 2 * 500), ("cp_dq_1_1", 3 * 500), ("cp_dk_1", 3 * 100),
        ("cp_dk_1_1", 2 * 100), ("cp_dv_1", 3 * 100), ("cp_dv_1_1", 2 * 100)]
    assert te.backward_step(0, 2, 1, Q, K, V) == [("cp_dq_0", 2 * 1000), ("cp_dk_0", 2 * 100),
                                                  ("cp_dv_0", 2 * 100)]
    assert te.backward_step(1, 2, 1, Q, K, V) == [("cp_dq_1", 3 * 1000), ("cp_dk_1", 3 * 200),
                                                  ("cp_dv_1", 3 * 200)]


@pytest.mark.parametrize("rank", range(4))
def test_backward_cp4_every_step_touches_every_buffer(rank):
    # cp = 4: one dQ, one dK and one dV kernel per step (two where a step splits the halves),
    # and the first touch of each buffer is a copy (2x), never an add (3x)
    steps = [te.backward_step(i, 4, rank, Q, K, V) for i in range(4)]
    for tensor, whole in (("dq", Q), ("dk", K), ("dv", V)):
        first = [b for name, b in steps[0] if name.startswith(f"cp_{tensor}_")]
        assert first and all(b in (2 * whole, whole) for b in first)
        for kernels in steps:
            assert 1 <= sum(name.startswith(f"cp_{tensor}_") for name, _ in kernels) <= 2


def test_a_cp_layer_runs_them_around_its_ring():
    # cp 2, s 64 (32 local tokens), b 1, 4 heads of 16, rank 0: q and the output
    # 32·4·16·2 = 4096 B, k and v 4096 B each; the kernels sit around the ring's blocks
    overrides = {("model", "num_layers"): 1, ("model", "hidden_size"): 64,
                 ("model", "num_attention_heads"): 4, ("model", "seq_length"): 64,
                 ("model", "vocab_size"): 128, ("model", "attention_backend"): "flash",
                 ("parallel", "context_parallel_size"): 2,
                 ("parallel", "data_parallel_size"): 1, ("run", "mode"): "meta"}
    log = simulate_layer(load_scenario(None, overrides), log_kernels=True).ranks[0].kernel_log
    nbytes = {(name, phase): b for name, phase, _, _, b, _ in log}
    order = [name for name, *_ in log]
    q = k = v = 32 * 4 * 16 * 2
    assert nbytes[("cp_kv_pack", "forward")] == 2 * (k + v)
    assert nbytes[("cp_out_correction_0", "forward")] == 2 * q
    assert nbytes[("cp_out_correction_1", "forward")] == 3 * q // 2
    assert nbytes[("cp_kv_copy", "backward")] == 2 * (k + v)
    assert nbytes[("cp_dq_0", "backward")] == q  # its second half copied
    assert nbytes[("cp_dq_1_1", "backward")] == 3 * q // 2
    assert order.index("cp_kv_pack") < order.index("cp_scores_0") < order.index("cp_lse_0") \
        < order.index("cp_scores_1") < order.index("cp_out_correction_0")
