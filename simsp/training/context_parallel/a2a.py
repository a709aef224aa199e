"""Ulysses attention's timing on the modelled links (--cp-comm-type a2a, meta mode).

Transformer Engine's AttnFuncWithCPAndQKVOA2A (NVIDIA/TransformerEngine
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) runs, in forward,
an all-to-all of q, k, v (sequence split -> head split), attention on the whole sequence for
heads/cp, and an all-to-all of the output back; in backward the all-to-all of dout, the
attention backward, and the all-to-all of dq, dk, dv. An all-to-all is grouped send/receive
pairs: rank i sends 1/cp of the tensor to every other rank j, each pair starting once both have
posted (a rendezvous), all pairs at once sharing the links fairly (engine/network.py); a rank
goes on when its sends and receives are delivered.
"""

import simpy

EXCHANGES = (("forward", "qkv", "attention"), ("forward", "out", None),
             ("backward", "dout", "attention backward"), ("backward", "dqkv", None))


class CpAllToAll:
    """One CP group's Ulysses exchanges on a Network: gpus in cp-rank order."""

    def __init__(self, env: simpy.Environment, network, gpus: tuple, qkv_bytes: int,
                 out_bytes: int):
        self.env, self.network, self.gpus = env, network, gpus
        self.cp = len(gpus)
        self.nbytes = {"qkv": qkv_bytes, "out": out_bytes, "dout": out_bytes, "dqkv": qkv_bytes}
        self._posted: dict = {}  # (tensor, cp rank) -> event: that rank has posted
        self._moving: dict = {}  # (tensor, src, dst) -> the pair's transfer process
        self.ends: dict = {}  # (phase, cp rank) -> end_s

    def _posted_event(self, tensor: str, rank: int) -> simpy.Event:
        return self._posted.setdefault((tensor, rank), self.env.event())

    def _pair(self, tensor: str, src: int, dst: int):
        yield self._posted_event(tensor, src) & self._posted_event(tensor, dst)
        yield self.network.transfer(self.gpus[src], self.gpus[dst],
                                    self.nbytes[tensor] // self.cp,
                                    label=f"cp a2a {tensor} {src}->{dst}")

    def _moving_pair(self, tensor: str, src: int, dst: int):
        key = (tensor, src, dst)
        if key not in self._moving:
            self._moving[key] = self.env.process(self._pair(tensor, src, dst))
        return self._moving[key]

    def exchange(self, tensor: str, rank: int) -> simpy.Event:
        """Post rank's sends and receives of `tensor`; succeeds when all are delivered."""
        others = [j for j in range(self.cp) if j != rank]
        pairs = ([self._moving_pair(tensor, rank, j) for j in others]
                 + [self._moving_pair(tensor, j, rank) for j in others])
        self._posted_event(tensor, rank).succeed()
        return simpy.AllOf(self.env, pairs)

    def run_rank(self, rank: int, attention_s: float, attention_bwd_s: float, numbers=None):
        """Rank's forward (a2a, attention, a2a) then backward (a2a, attention backward, a2a).
        `numbers` (numeric mode, training/context_parallel/a2a_numeric.py) is told when the rank posts each
        exchange, when it has arrived, and when the attention runs."""
        compute = {"attention": attention_s, "attention backward": attention_bwd_s}
        for phase, tensor, then in EXCHANGES:
            if numbers is not None:
                numbers.post(tensor)
            yield self.exchange(tensor, rank)
            if numbers is not None:
                numbers.arrived(tensor)
            if then is not None:
                yield self.env.timeout(compute[then])
            else:
                self.ends[(phase, rank)] = self.env.now
