"""What a layer keeps for its backward: the stash every block puts its saved tensors in, and the
recompute phase a block's backward re-runs part of its forward under.

A tensor stashed under a name (the tables in each block's docstring;
docs/MODEL.md#activation-memory) moves to the ledger's activations category; without `keep`
(full recompute) the stash only collects the names so the layer can free them after its
forward.
"""

from contextlib import contextmanager


class Stash:
    """Tensors kept for backward: saved as activations, or (keep=False) freed after forward."""

    def __init__(self, r, keep: bool):
        self.r, self.keep, self.tensors = r, keep, {}

    def put(self, name: str, tensor):
        """Keep `tensor` for backward under `name` (None: nothing to keep)."""
        if tensor is None:
            return
        if self.keep:
            self.r.save(tensor, name)
        self.tensors[name] = tensor

    def release(self):
        """Free every stashed tensor (full recompute: only the layer input outlives forward)."""
        self.r.free(*self.tensors.values())
        self.tensors = {}


@contextmanager
def recomputing(r):
    """Charge the kernels run inside to the recompute phase (hardware, not model, FLOPs), then
    give the rank its phase back."""
    phase, r.phase = r.phase, "recompute"
    yield
    r.phase = phase
