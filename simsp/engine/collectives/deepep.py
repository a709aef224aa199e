"""DeepEP's normal (high-throughput) internode dispatch over the modelled links: two hops, each
token deduplicated per node and per rank.

DeepEP (deepseek-ai/DeepEP README "Normal kernels"; csrc/kernels/internode.cu dispatch: the
RDMA sender, the RDMA-to-NVLink forwarder, the NVLink receiver) sends a token bound for ranks
on another node once over RDMA to the GPU of that node on the sender's own rail (same local
index), whatever the number of experts or ranks it reaches there (`is_token_in_rank` reduced
per RDMA rank: `num_tokens_per_rdma_rank`); that GPU forwards it over NVLink to each rank of its
node the token is routed to, once per rank (`num_tokens_per_rank`). A token bound for the
sender's own node crosses no RDMA link: it goes over NVLink from the sender to each such rank.
Combine is the mirror image (NVLink to the forwarder, one reduced copy per node over RDMA).

Timing here: every RDMA send and every same-node NVLink send starts at once; a forwarded NVLink
send starts when its RDMA hop has been delivered (the kernels pipeline chunk by chunk; this
model does not, so it is an upper bound on a pair's two-hop time). Flows share links max-min
fairly with everything else in flight (engine/network.py). docs/deepep.md.
"""

from dataclasses import dataclass, field
import hashlib

import numpy as np
import simpy

from simsp.engine.network import Network

# SMs DeepEP's normal kernels run on: deep_ep/buffer.py `Buffer.num_sms = 20` (set by
# Buffer.set_num_sms), the README's "20 SMs" on H800 for its normal-kernel tables.
NUM_SMS = 20


@dataclass
class TwoHopPlan:
    """Bytes of one dispatch: RDMA (src rank, forwarder rank) and NVLink (from, to) pairs, as
    positions in the EP group; forwarded NVLink bytes keyed by their RDMA hop."""

    rdma: dict = field(default_factory=dict)  # (i, f) -> bytes, node(i) != node(f), same rail
    nvlink: dict = field(default_factory=dict)  # (i, j) -> bytes, same node, sent at once
    forwarded: dict = field(default_factory=dict)  # (i, f) -> {j: bytes} after the RDMA hop

    def key(self) -> tuple:
        """The plan as a hashable value (memo keys: equal plans, equal timings)."""
        forwarded = tuple(sorted((k, tuple(sorted(v.items()))) for k, v in self.forwarded.items()))
        return tuple(sorted(self.rdma.items())), tuple(sorted(self.nvlink.items())), forwarded

    def link_bytes(self) -> dict:
        """Bytes per hop kind: {'rdma': total, 'nvlink': total} (forwarded counted as NVLink)."""
        fwd = sum(b for hops in self.forwarded.values() for b in hops.values())
        return {"rdma": sum(self.rdma.values()), "nvlink": sum(self.nvlink.values()) + fwd}


def _add(table: dict, key, nbytes: int) -> None:
    if nbytes:
        table[key] = table.get(key, 0) + nbytes


def two_hop_plan(in_rank: list[np.ndarray], node_of: list[int], rail_of: list[int],
                 token_bytes: int) -> TwoHopPlan:
    """The plan for EP members i with in_rank[i] (T_i, n) bool (token t of member i goes to
    member j: DeepEP's is_token_in_rank), members on nodes node_of (n,), rails rail_of (n,)."""
    n, plan = len(node_of), TwoHopPlan()
    forwarder = {(node_of[f], rail_of[f]): f for f in range(n)}
    for i, targets in enumerate(in_rank):  # targets (T_i, n)
        for m in sorted(set(node_of)):
            members = [j for j in range(n) if node_of[j] == m and j != i]
            if m == node_of[i]:
                for j in members:
                    _add(plan.nvlink, (i, j), int(targets[:, j].sum()) * token_bytes)
                continue
            f = forwarder[(m, rail_of[i])]
            on_node = targets[:, [j for j in range(n) if node_of[j] == m]]  # (T_i, ranks of m)
            _add(plan.rdma, (i, f), int(on_node.any(axis=1).sum()) * token_bytes)
            hops = {}
            for j in members:
                if j != f:
                    _add(hops, j, int(targets[:, j].sum()) * token_bytes)
            if hops and (i, f) in plan.rdma:
                plan.forwarded[(i, f)] = hops
    return plan


def two_hop(env: simpy.Environment, network: Network, gpus: list[int], plan: TwoHopPlan,
            label: str = "deepep", combine: bool = False):
    """Run `plan` on GPUs `gpus` (EP order); returns the delivery time of every hop: (i, f)
    RDMA, (i, j) same-node NVLink, (i, f, j) forwarded NVLink. Dispatch sends RDMA then
    forwards; `combine` runs the mirror image: the forwarded NVLink hops j -> f first, then
    f's one reduced copy per token over RDMA f -> i; same-node NVLink j -> i from the start."""
    arrivals = {}

    def send(src, dst, nbytes, key, after=()):
        for event in after:
            yield event
        a, b = (dst, src) if combine else (src, dst)
        done = network.transfer(gpus[a], gpus[b], nbytes, f"{label} {a}->{b}")
        yield done
        arrivals[key] = done.value[1]

    def route(i, f, nbytes):
        hops = plan.forwarded.get((i, f), {})
        if combine:  # the forwarded hops into f, then f's reduced copy over RDMA
            inbound = [env.process(send(f, j, b, (i, f, j))) for j, b in hops.items()]
            yield from send(i, f, nbytes, (i, f), inbound)
            return
        yield from send(i, f, nbytes, (i, f))
        outbound = [env.process(send(f, j, b, (i, f, j))) for j, b in hops.items()]
        for process in outbound:
            yield process

    processes = [env.process(route(i, f, b)) for (i, f), b in plan.rdma.items()]
    processes += [env.process(send(i, j, b, (i, j))) for (i, j), b in plan.nvlink.items()]
    for process in processes:
        yield process
    return arrivals


def routes_key(routes: np.ndarray) -> tuple:
    """A (T, n) bool routing table as a short hashable value: its shape and a digest of it."""
    return routes.shape, hashlib.blake2b(np.ascontiguousarray(routes).tobytes()).digest()


def alone_time(graph, calibration, gpus: list[int], plan: TwoHopPlan, combine: bool) -> float:
    """Seconds of one DeepEP dispatch (or combine) alone on its links: the same flows in a
    private simulation (its time in the run when no other traffic crosses its links)."""
    env = simpy.Environment()
    env.process(two_hop(env, Network(env, graph, calibration), gpus, plan, combine=combine))
    env.run()
    return env.now
