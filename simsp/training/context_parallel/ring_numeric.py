"""Ring attention's numbers carried on the ring's schedule (--cp-comm-type p2p, numeric mode).

Each CP rank's process runs CpRing's forward and backward (training/context_parallel/ring.py, the schedule of
Transformer Engine's AttnFuncWithCPAndKVP2P); at each step it stores what it sends when it posts
the exchange, computes its block with the K/V it holds (training/context_parallel/ring_kernels.py's block_forward,
merge_block and block_backward), and takes what its neighbour sent only once the exchange has
arrived on the links. A rank never reads another rank's tensors except through a delivered
exchange, so the numbers prove the schedule moves the right blocks at the right steps.
"""

import numpy as np

from simsp.training.context_parallel.ring_kernels import CpShard, block_backward, block_forward, merge_block
from simsp.training.context_parallel.ring import CpRing


class RingMailbox:
    """What each CP rank sent at each step: (phase, step, cp rank) -> payload dict."""

    def __init__(self):
        self.sent: dict = {}


class RankRingNumbers:
    """One CP rank's ring attention state: the K/V block it holds, its running (out, lse)
    forward, its dQ and the dK/dV buffer it accumulates backward."""

    def __init__(self, rank: int, cp: int, shard: CpShard, mailbox: RingMailbox):
        self.rank, self.cp, self.shard, self.sent = rank, cp, shard, mailbox.sent
        self.held = (shard.k, shard.v, shard.pos)  # the K/V block (k, v, positions) held now
        self.out = np.zeros_like(shard.q)  # (b, a, n, d)
        self.lse = np.full(shard.q.shape[:-1], -np.inf)  # (b, a, n)
        self.dout = self.delta = self.dq = self.own = self.dkv = None
        self.keep, self.p = None, 0.0  # keep(q_pos, k_pos) -> dropout keep-mask, and its rate

    def start_backward(self, dout: np.ndarray) -> None:
        """dout (b, a, n, d); delta = rowsum(dout * out) (b, a, n, 1) (Dao et al. 2022, Alg. 2)."""
        self.dout = dout
        self.delta = (dout * self.out).sum(axis=-1, keepdims=True)
        self.dq = np.zeros_like(self.shard.q)

    def post(self, phase: str, step: int) -> None:
        """Store what this rank sends at `step`: forward its K/V; backward its K/V until the
        last step and, from step 1, the dK/dV buffer finished at the step before."""
        payload = {}
        if phase == "forward" or step < self.cp - 1:
            payload["kv"] = self.held
        if phase == "backward" and step >= 1:
            payload["dkv"] = self.dkv
        self.sent[(phase, step, self.rank)] = payload

    def compute(self, phase: str, step: int) -> None:
        """This step's block: forward merged into (out, lse); backward dQ added, dK/dV kept."""
        q, (k, v, k_pos) = self.shard.q, self.held
        keep = None if self.keep is None else self.keep(self.shard.pos, k_pos)  # (b,a,nq,nk)
        if phase == "forward":
            block = block_forward(q, k, v, self.shard.pos, k_pos, keep, self.p)
            self.out, self.lse = merge_block(self.out, self.lse, *block)
            return
        dq, dk, dv = block_backward(self.dout, q, k, v, self.shard.pos, k_pos, self.lse,
                                    self.delta, keep, self.p)
        self.dq += dq
        self.own = (dk, dv)

    def arrived(self, phase: str, step: int) -> None:
        """Take the neighbour's delivered exchange of `step`: forward from rank - 1 (its K/V);
        backward from rank + 1 (its K/V, and its dK/dV buffer added to this step's own)."""
        source = (self.rank + (-1 if phase == "forward" else 1)) % self.cp
        payload = self.sent[(phase, step, source)]
        if phase == "backward":
            own = self.own
            if "dkv" in payload:
                own = (own[0] + payload["dkv"][0], own[1] + payload["dkv"][1])
            self.dkv = own
        if "kv" in payload:
            self.held = payload["kv"]


def run_numeric_ring(ring: CpRing, shards: list, douts: list, forward_s: list,
                     backward_s: list) -> list:
    """Every CP rank's forward then backward on `ring`; returns per rank (out, dq, dk, dv)."""
    mailbox = RingMailbox()
    states = [RankRingNumbers(r, ring.cp, shard, mailbox) for r, shard in enumerate(shards)]

    def one(rank):
        state = states[rank]
        yield from ring.forward(rank, forward_s[rank], state)
        state.start_backward(douts[rank])
        yield from ring.backward(rank, backward_s[rank], state)

    for rank in range(ring.cp):
        ring.env.process(one(rank))
    ring.env.run()
    return [(s.out, s.dq, *s.dkv) for s in states]
