"""The deferred weight gradient of a split backward (zero-bubble schedules): B records each
linear's weight-gradient GEMM with the tensors it reads, W runs them later.

Source: Qi et al., "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 §2 (B and W), and
sail-sg/zero-bubble-pipeline-parallelism megatron/core/weight_grad_store.py (WeightGradStore:
`put` during the backward, `pop` runs the stored GEMMs). What a deferred GEMM reads (the linear's
input and its output gradient) stays in the rank's ledger under a "wgrad_hold." key, moved from
its own category (activations, temporaries, communication) to held_for_wgrad when B hands it
over, until the W step frees it (ZB Table 1's M_W): the memory W's deferral costs, named.
"""

import copy

from simsp.engine.memory import HELD_FOR_WGRAD


class WeightGradStore:
    """One B step's deferred weight-gradient GEMMs, in the order the backward met them."""

    def __init__(self):
        self.work = []  # generator factories, one per deferred GEMM
        self.held = []  # Tensor copies whose ledger keys W frees

    def defer(self, r, tensors: tuple, gemm) -> tuple:
        """Keep `tensors` (each linear input / output gradient) alive past B; returns their
        copies for `gemm(*copies)`, the generator W runs."""
        kept = tuple(self._hold(r, t) for t in tensors)
        self.work.append(lambda: gemm(*kept))
        return kept

    def _hold(self, r, tensor):
        """A copy of `tensor` (its data copied: the caller may reuse the array) that now owns its
        ledger entry, held_for_wgrad; the caller's own free of `tensor` becomes a no-op."""
        kept = copy.copy(tensor)
        if r.numeric:
            kept.data = tensor.data.copy()
        if tensor.key is not None:
            kept.key = r.ledger.retag(tensor.key, HELD_FOR_WGRAD, r._unique_key(
                r.key("wgrad_hold." + tensor.key.rsplit(".", 1)[-1])))
            self.held.append(kept)
            tensor.key = None
        return kept

    def run(self, r):
        """W: every deferred GEMM in order, then free what they held."""
        yield from self.run_pending(r)
        r.free(*self.held)
        self.held = []

    def run_pending(self, r):
        """The GEMMs deferred so far, in order, what they read kept until `run` (a DualPipe
        pair's weight gradients beside its next collective, model/blocks/moe/comm_stream.py)."""
        work, self.work = self.work, []
        for gemm in work:
            yield from gemm()
