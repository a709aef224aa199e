"""Ulysses attention's numbers carried on the all-to-all schedule (--cp-comm-type a2a, numeric).

Each CP rank's process runs CpAllToAll.run_rank (training/context_parallel/a2a.py, the exchanges of Transformer
Engine's AttnFuncWithCPAndQKVOA2A): it stores its tensor when it posts an exchange and, once the
exchange has arrived on the links, takes from every rank the piece addressed to it
(training/context_parallel/ulysses_kernels.py's seq_to_heads / heads_to_seq); its head group's attention is
block_forward / block_backward of training/context_parallel/ring_kernels.py on the whole sequence.
"""

import numpy as np

from simsp.training.context_parallel.ring_kernels import block_backward, block_forward
from simsp.training.context_parallel.ulysses_kernels import heads_to_seq, seq_to_heads
from simsp.training.context_parallel.a2a import CpAllToAll


class RankA2ANumbers:
    """One CP rank's Ulysses state: what it posts per exchange, and its head group's tensors."""

    def __init__(self, rank: int, shards: list, douts: list, sent: dict):
        self.rank, self.shards, self.douts, self.sent = rank, shards, douts, sent
        self.positions = [s.pos for s in shards]  # each rank's global positions (n,)
        self.full = np.arange(sum(len(p) for p in self.positions))  # (s,)
        self.group: dict = {}  # head group's q, k, v, out, lse, dout (b, a/cp, s, ...)
        self.result: dict = {}  # this rank's out, dq, dk, dv back on its tokens (b, ., n, d)

    def post(self, tensor: str) -> None:
        """Store what this rank sends in the `tensor` exchange (all of it; each peer takes its piece)."""
        shard = self.shards[self.rank]
        mine = {"qkv": (shard.q, shard.k, shard.v), "out": (self.group.get("out"),),
                "dout": (self.douts[self.rank],), "dqkv": self.group.get("dqkv")}[tensor]
        self.sent[(tensor, self.rank)] = mine

    def _gather(self, tensor: str) -> list:
        """Every rank's posted `tensor`, per component: [component][rank]."""
        posted = [self.sent[(tensor, j)] for j in range(len(self.shards))]
        return [list(parts) for parts in zip(*posted)]

    def arrived(self, tensor: str) -> None:
        """The exchange is delivered: re-shard what it carried, then run the attention it feeds."""
        if tensor in ("qkv", "dout"):  # sequence split -> this rank's head group, whole sequence
            pieces = [seq_to_heads(parts, self.positions)[self.rank]
                      for parts in self._gather(tensor)]
            if tensor == "qkv":
                q, k, v = pieces
                out, lse = block_forward(q, k, v, self.full, self.full)
                self.group.update(q=q, k=k, v=v, out=out, lse=lse)
            else:
                g = self.group
                delta = (pieces[0] * g["out"]).sum(axis=-1, keepdims=True)  # (b, a/cp, s, 1)
                g["dqkv"] = block_backward(pieces[0], g["q"], g["k"], g["v"], self.full,
                                           self.full, g["lse"], delta)
            return
        names = ("out",) if tensor == "out" else ("dq", "dk", "dv")  # head group -> sequence
        for name, parts in zip(names, self._gather(tensor)):
            self.result[name] = heads_to_seq(parts, self.positions)[self.rank]


def run_numeric_a2a(a2a: CpAllToAll, shards: list, douts: list, attention_s: float,
                    attention_bwd_s: float) -> list:
    """Every CP rank's forward then backward through `a2a`; per rank (out, dq, dk, dv)."""
    sent: dict = {}
    states = [RankA2ANumbers(r, shards, douts, sent) for r in range(a2a.cp)]
    for rank, state in enumerate(states):
        a2a.env.process(a2a.run_rank(rank, attention_s, attention_bwd_s, state))
    a2a.env.run()
    return [tuple(s.result[name] for name in ("out", "dq", "dk", "dv")) for s in states]
