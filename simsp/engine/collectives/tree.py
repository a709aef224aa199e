"""NCCL's tree all-reduce: binary trees across nodes, a chain inside each node, pipelined.

NCCL (src/graph/trees.cc; device/all_reduce.h, runTreeUpDown): across nodes a double binary
tree, the channels alternating between the two trees (here: a heap-ordered binary tree over the
nodes and its mirror, so with two nodes each node is the root of one tree); inside a node the
channel's GPUs form a chain below the node's head, the GPU on the channel's rail. Every GPU first
reduces all slots up (wait for its children's slot, add its own, send to its parent) and then
forwards the result down; a slot is NCCL_BUFFSIZE / NCCL_STEPS = 4 MiB / 8 = 512 KiB, and a
sender starts its next slot once the previous one has left the wire.
Use as `results, stats = yield from tree_all_reduce(...)`. This is the stepwise tree at the
Simple protocol; `simsp run` and `simsp ring` time a tree all-reduce NCCL picks in closed form at
its protocol (engine/ring_timing.tree_time, docs/nccl.md).
"""

import math
from dataclasses import dataclass

import numpy as np
import simpy

from simsp.engine.collectives.ring import (DEFAULT_ELEM_BYTES, CollectiveStats, _is_meta,
                                      element_count)
from simsp.engine.network import Network
from simsp.engine.collectives.ring_plan import ALL_REDUCE, chunk_counts, chunk_offsets, members_by_node

SLOT_BYTES = 4 * 1024 * 1024 // 8  # NCCL_BUFFSIZE (4 MiB) / NCCL_STEPS (8)
TREE = "tree"


@dataclass(frozen=True)
class TreeChannel:
    """One channel's tree over the group: parent[m] is member m's parent (None: the root)."""

    index: int
    parent: tuple[int | None, ...]
    rail: int

    def children(self, member: int) -> list[int]:
        """Members whose parent is `member`, in member order."""
        return [m for m, up in enumerate(self.parent) if up == member]


def tree_channels(gpus: list[int], gpus_per_node: int) -> list[TreeChannel]:
    """One channel per GPU a node holds; channel c chains every node's members from its c-th
    (the head, on rail c) and joins the heads in tree c % 2 (the heap tree or its mirror)."""
    by_node = members_by_node(gpus, gpus_per_node)
    k = min(len(members) for members in by_node)
    channels = []
    for c in range(k):
        parent: list[int | None] = [None] * len(gpus)
        heads = []
        for members in by_node:
            chain = members[c:] + members[:c]
            heads.append(chain[0])
            for up, down in zip(chain, chain[1:]):
                parent[down] = up
        for node, up in enumerate(_node_tree(len(by_node), mirrored=c % 2 == 1)):
            if up is not None:
                parent[heads[node]] = heads[up]
        channels.append(TreeChannel(c, tuple(parent), gpus[heads[0]] % gpus_per_node))
    return channels


def _node_tree(nodes: int, mirrored: bool) -> list[int | None]:
    """Parent node of every node in a heap-ordered binary tree (position i under (i-1)//2);
    the mirror numbers positions from the last node, so the two trees have different roots."""
    node_at = (lambda pos: nodes - 1 - pos) if mirrored else (lambda pos: pos)
    parent: list[int | None] = [None] * nodes
    for pos in range(1, nodes):
        parent[node_at(pos)] = node_at((pos - 1) // 2)
    return parent


def tree_all_reduce(env: simpy.Environment, network: Network, gpus: list[int],
                    buffers: list[np.ndarray] | None, nbytes: int,
                    elem_bytes: int = DEFAULT_ELEM_BYTES, label: str = ALL_REDUCE):
    """Tree all-reduce of an S = `nbytes` message; channel c carries the c-th contiguous part.

    Returns (results, stats): results[i] has buffers[i]'s shape (numeric) or is None (meta)."""
    count = element_count(nbytes, elem_bytes)
    flats = None if _is_meta(buffers) else [np.array(b, copy=True).reshape(-1) for b in buffers]
    channels = tree_channels(list(gpus), network.graph.graph["gpus_per_node"])
    parts = chunk_counts(count, len(channels))
    trees = [_Tree(env, network, list(gpus), ch, offset, part, flats, elem_bytes, label)
             for ch, offset, part in zip(channels, chunk_offsets(parts), parts)]
    start_s = env.now
    yield env.all_of([env.process(t.member(m)) for t in trees for m in range(len(gpus))])
    sent = tuple(sum(t.sent[m] for t in trees) for m in range(len(gpus)))
    received = tuple(sum(t.received[m] for t in trees) for m in range(len(gpus)))
    stats = CollectiveStats(ALL_REDUCE, tuple(gpus), nbytes, 2 * max(len(t.slots) for t in trees),
                            sent, received, start_s, env.now)
    if flats is None:
        return [None] * len(gpus), stats
    return [f.reshape(np.shape(b)) for f, b in zip(flats, buffers)], stats


class _Tree:
    """One channel's pipelined reduce-up then broadcast-down over its slots."""

    def __init__(self, env, network, gpus, channel, offset, count, flats, elem_bytes, label):
        self.env, self.network, self.gpus, self.channel = env, network, gpus, channel
        slots = max(1, math.ceil(count * elem_bytes / SLOT_BYTES))
        sizes = chunk_counts(count, slots)
        self.slots = [(offset + o, c) for o, c in zip(chunk_offsets(sizes), sizes)]  # elements
        self.flats = flats  # [member] -> (count,) buffer, reduced in place; None in meta mode
        self.elem_bytes, self.label = elem_bytes, f"{label} tree{channel.index % 2}"
        n = len(gpus)
        self.up = [[env.event() for _ in self.slots] for _ in range(n)]  # [member][slot]
        self.down = [[env.event() for _ in self.slots] for _ in range(n)]
        self.sent, self.received = [0] * n, [0] * n

    def member(self, m: int):
        """Reduce every slot up to the parent, then forward every result slot down."""
        kids, parent = self.channel.children(m), self.channel.parent[m]
        for j in range(len(self.slots)):
            parts = yield self.env.all_of([self.up[kid][j] for kid in kids])
            partial = self._add(m, j, [parts[self.up[kid][j]] for kid in kids])
            if parent is None:
                yield from self._forward(m, j, partial, kids)
            else:
                yield self._send(m, parent, j, partial, self.up[m][j])
        for j in range(len(self.slots) if parent is not None else 0):
            result = yield self.down[m][j]
            self._store(m, j, result)
            yield from self._forward(m, j, result, kids)

    def _add(self, m: int, j: int, incoming: list):
        """Member m's slot j plus its children's partial sums (None in meta mode)."""
        if self.flats is None:
            return None
        offset, count = self.slots[j]
        return self.flats[m][offset:offset + count] + sum(incoming)  # (count,)

    def _store(self, m: int, j: int, result) -> None:
        """Write the reduced slot j into member m's buffer."""
        if self.flats is not None:
            offset, count = self.slots[j]
            self.flats[m][offset:offset + count] = result

    def _forward(self, m: int, j: int, result, kids: list[int]):
        """Keep the result of slot j and send it to every child at once."""
        self._store(m, j, result)
        yield self.env.all_of([self._send(m, kid, j, result, self.down[kid][j]) for kid in kids])

    def _send(self, src: int, dst: int, j: int, payload, inbox: simpy.Event) -> simpy.Event:
        """Put slot j on the wire to `dst`; the returned event succeeds once its last byte has
        left (the sender's next slot may go)."""
        nbytes = self.slots[j][1] * self.elem_bytes
        drained = self.env.event()
        delivered = self.network.transfer(self.gpus[src], self.gpus[dst], nbytes,
                                          f"{self.label} slot {j}", drained=drained)
        delivered.callbacks.append(lambda _e: inbox.succeed(payload))
        self.sent[src] += nbytes
        self.received[dst] += nbytes
        return drained
