"""Ring attention's timing on the modelled links (--cp-comm-type p2p, meta mode).

The schedule of Transformer Engine's AttnFuncWithCPAndKVP2P (NVIDIA/TransformerEngine
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py):

- forward, step i of cp: wait for step i-1's send and receive, post step i's (send the K/V block
  held to rank r + 1, receive the next from r - 1; none at the last step), then compute the
  block's attention, so each transfer overlaps the block compute of its step;
- backward, step i: post the exchange (now to r - 1, from r + 1): K/V at step 0, K/V with the
  dK/dV buffer at steps 1..cp-2, the dK/dV buffer alone at the last step; compute the block's
  backward; wait for the exchange (the received dK/dV is added to).

A transfer starts once both its sender and its receiver have posted (NCCL p2p is a rendezvous).
The buffers are in the ledger: the forward copies its own K/V into a send buffer and allocates
a receive buffer per step (category communication), keeping them until it returns; the last one
received (rank r + 1's K/V) is what it saves for backward (moved to activations); the backward
holds two buffers of K/V plus dK/dV for its whole length and frees the saved K/V at its end.
"""

from dataclasses import dataclass, field

import simpy

from simsp.hardware.costmodel import kernel_time


@dataclass
class RingTimeline:
    """Per rank and step: compute (start_s, end_s) and the rank's forward/backward end times."""

    compute: dict = field(default_factory=dict)  # (phase, cp rank, step) -> (start_s, end_s)
    ends: dict = field(default_factory=dict)  # (phase, cp rank) -> end_s
    waited: dict = field(default_factory=dict)  # (phase, cp rank) -> s blocked on exchanges


def exchange_bytes(phase: str, step: int, cp: int, kv_bytes: int) -> int:
    """Bytes one rank sends at `step`: forward K/V until the last step; backward K/V at 0,
    K/V + dK/dV in between, dK/dV at the last step (none with cp = 1)."""
    if phase == "forward":
        return kv_bytes if step < cp - 1 else 0
    if cp == 1:
        return 0
    return kv_bytes if step in (0, cp - 1) else 2 * kv_bytes


def diagonal_step(phase: str, cp: int) -> int:
    """The step at which a rank holds its own K/V block: the first forward step, the last
    backward step (TE's backward runs "in reversed order of fwd": `i == cp_size - 1` is its
    diagonal branch, AttnFuncWithCPAndKVP2P.backward)."""
    return 0 if phase == "forward" else cp - 1


def block_gemm(n: int, d: int, diagonal: bool) -> tuple:
    """(m, k, n) of a step's score GEMM for n local tokens: the whole (n, n) block at the
    diagonal step (diagonal_step), else half of it, as TE slices (K/V from an earlier rank: its
    first chunk; from a later rank: the second query chunk), (n, d, n/2) either way by FLOPs
    and intensity."""
    return (n, d, n) if diagonal else (n, d, n // 2)


def block_seconds(b: int, heads: int, n: int, d: int, diagonal: bool, backward: bool) -> float:
    """A step's block attention time from the cost model: 2 batched GEMMs forward (scores,
    context), 5 backward (recomputed scores, dV, dP, dQ, dK), 2·b·heads·m·k·n FLOPs each, as
    simsp/model/blocks/attention/flash.py charges the FlashAttention core."""
    m, k, cols = block_gemm(n, d, diagonal)
    gemms = 5 if backward else 2
    return gemms * kernel_time("gemm", 2 * b * heads * m * k * cols, 0, gemm=(m, k, cols))


class CpRing:
    """One CP group's ring attention on a Network: gpus in cp-rank order, block times given."""

    def __init__(self, env: simpy.Environment, network, gpus: tuple, kv_bytes: int,
                 ledgers: dict | None = None, prefix: str = "", lone=None):
        self.env, self.network, self.gpus, self.kv_bytes = env, network, gpus, kv_bytes
        self.lone = lone  # context_parallel/lone_ring.py LoneRing: sends timed in arithmetic
        # context_parallel/ring_pass.py RingPass: the group's whole call worked out at once
        self.arith = None
        self.cp = len(gpus)
        self.ledgers = {} if ledgers is None else ledgers
        self.prefix = prefix  # ledger key scope of the buffers (a layer's, in the training loop)
        self.timeline = RingTimeline()
        self._moving: dict = {}  # (phase, step, src cp rank) -> [sides posted, delivered]
        self._kv_keys = None  # (cp,) ledger keys of the forward's K/V buffers, made once

    def kv_keys(self) -> tuple:
        """The ledger keys of the forward's K/V buffers cp_kv_0..cp_kv_{cp−1} (step i receives
        into cp_kv_{i+1}), under the ring's scope."""
        if self._kv_keys is None:
            self._kv_keys = tuple(f"{self.prefix}cp_kv_{i}" for i in range(self.cp))
        return self._kv_keys

    def _post(self, phase: str, step: int, rank: int) -> tuple:
        """Post this rank's send and receive of `step`: their delivery events (none at a step
        that sends nothing)."""
        nbytes = exchange_bytes(phase, step, self.cp, self.kv_bytes)
        if nbytes == 0:
            return ()
        to = 1 if phase == "forward" else -1
        return (self._side(phase, step, rank, (rank + to) % self.cp, nbytes),
                self._side(phase, step, (rank - to) % self.cp, rank, nbytes))

    def _side(self, phase: str, step: int, src: int, dst: int, nbytes: int) -> simpy.Event:
        """One side (src's send or dst's receive) of the transfer src -> dst of `step`: the
        transfer starts when its second side is posted (both have then posted the step) and
        the event returned succeeds on delivery."""
        key = (phase, step, src)
        sides = self._moving.get(key)
        if sides is None:
            self._moving[key] = [1, self.env.event()]
            return self._moving[key][1]
        sides[0] += 1
        label = f"cp {phase} step {step} {src}->{dst}"
        if self.lone is not None:
            self.lone.send(self.gpus[src], self.gpus[dst], nbytes, label, sides[1])
        else:
            self.network.transfer(self.gpus[src], self.gpus[dst], nbytes, label=label,
                                  delivered=sides[1])
        return sides[1]

    def _compute(self, phase: str, rank: int, step: int, seconds):
        """The step's block attention: `seconds`, or a generator function of (phase, step)
        that runs it on the rank's compute stream (training/context_parallel/attention.py)."""
        start = self.env.now
        if callable(seconds):
            yield from seconds(phase, step)
        else:
            yield self.env.timeout(seconds)
        self.timeline.compute[(phase, rank, step)] = (start, self.env.now)

    def _wait(self, phase: str, rank: int, pending: tuple):
        """Wait for a posted exchange (both its transfers delivered: the later one's delivery,
        as a condition on both would), adding the time blocked to the timeline's `waited`."""
        start = self.env.now
        for delivered in pending:
            yield delivered
        key = (phase, rank)
        self.timeline.waited[key] = self.timeline.waited.get(key, 0.0) + (self.env.now - start)

    def _buffer(self, rank: int, key: str, nbytes: int, alloc: bool,
                time_s: float | None = None) -> None:
        """Allocate or free a ring buffer of `rank` in its ledger (at time_s, default now)."""
        ledger = self.ledgers.get(rank)
        if ledger is None or nbytes == 0:
            return
        if alloc:
            ledger.alloc(self.prefix + key, nbytes, "communication", "cp_ring",
                         self.env.now if time_s is None else time_s)
        else:
            ledger.free(self.prefix + key, "cp_ring", self.env.now)

    def forward(self, rank: int, block_s: list, numbers=None):
        """Rank `rank`'s forward: block_s[i] is its step-i block attention time (or a compute
        generator function, see _compute). `numbers`
        (numeric mode, training/context_parallel/ring_numeric.py) is told when the rank posts, computes and
        has received each step's exchange."""
        self._buffer(rank, "cp_kv_0", self.kv_bytes if self.cp > 1 else 0, True)
        if self.arith is not None:  # every step at once: the call's charges
            yield from self.arith.side("forward", rank, block_s.call_seconds("forward"))
        else:
            yield from self._forward_steps(rank, block_s, numbers)
        ledger = self.ledgers.get(rank)
        if ledger is not None and self.kv_bytes:  # the send and receive buffers but the last
            ledger.free_each(self.kv_keys()[:self.cp - 1], "cp_ring", self.env.now)
        if ledger is not None and self.cp > 1:  # TE saves the last K/V received for backward
            ledger.retag(f"{self.prefix}cp_kv_{self.cp - 1}", "activations",
                         f"{self.prefix}cp_kv_saved")
        self.timeline.ends[("forward", rank)] = self.env.now

    def _forward_steps(self, rank: int, block_s, numbers):
        """The forward's steps, event by event."""
        pending = None
        for step in range(self.cp):
            if pending is not None:
                yield from self._wait("forward", rank, pending)
                if numbers is not None:
                    numbers.arrived("forward", step - 1)
            if step < self.cp - 1:
                self._buffer(rank, f"cp_kv_{step + 1}", self.kv_bytes, True)
                if numbers is not None:
                    numbers.post("forward", step)
                pending = self._post("forward", step, rank)
            if numbers is not None:
                numbers.compute("forward", step)
            yield from self._compute("forward", rank, step,
                                     block_s if callable(block_s) else block_s[step])

    def backward(self, rank: int, block_s: list, numbers=None):
        """Rank `rank`'s backward: block_s[i] is its step-i block backward time (`numbers`: as
        in forward)."""
        buffers = 4 * self.kv_bytes if self.cp > 1 else 0  # two (K/V, dK/dV) buffers
        self._buffer(rank, "cp_kv_dkv_buffers", buffers, True)
        if self.arith is not None:  # every step at once, as forward
            yield from self.arith.side("backward", rank, block_s.call_seconds("backward"))
        else:
            yield from self._backward_steps(rank, block_s, numbers)
        self._buffer(rank, "cp_kv_dkv_buffers", buffers, False)
        self._buffer(rank, "cp_kv_saved", self.kv_bytes if self.cp > 1 else 0, False)
        self.timeline.ends[("backward", rank)] = self.env.now

    def _backward_steps(self, rank: int, block_s, numbers):
        """The backward's steps, event by event."""
        for step in range(self.cp):
            if numbers is not None:
                numbers.post("backward", step)
            pending = self._post("backward", step, rank)
            if numbers is not None:
                numbers.compute("backward", step)
            yield from self._compute("backward", rank, step,
                                     block_s if callable(block_s) else block_s[step])
            yield from self._wait("backward", rank, pending)
            if numbers is not None:
                numbers.arrived("backward", step)


def run_ring(env: simpy.Environment, ring: CpRing, forward_s: list, backward_s: list):
    """Run every rank's forward then backward (forward_s[r][i], backward_s[r][i] in seconds)."""
    def one(rank):
        yield from ring.forward(rank, forward_s[rank])
        yield from ring.backward(rank, backward_s[rank])
    for rank in range(ring.cp):
        env.process(one(rank))
    env.run()
    return ring.timeline
