"""Pure planning of ring collectives: chunk sizes, who sends which chunk to whom at every step.

The message is split into n chunks (the first count % n chunks one element longer, as
numpy.array_split does). Textbook ring (tinygrad schedule/allreduce.py):
- reduce-scatter step k: chunk c moves from rank (c+k+1) % n to (c+k+2) % n and is added there,
  so after n-1 steps rank c holds chunk c summed over all ranks;
- all-gather step k: chunk c moves from rank (c+k) % n to (c+k+1) % n and is copied there;
- all-reduce = the reduce-scatter steps followed by the all-gather steps
  (docs/MODEL.md#collectives).
"""

from dataclasses import dataclass
import functools

REDUCE_SCATTER, ALL_GATHER, ALL_REDUCE = "reduce_scatter", "all_gather", "all_reduce"
COLLECTIVES = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)


@dataclass(frozen=True)
class Send:
    """At one step, rank `src` sends chunk `chunk` to rank `dst` (ranks are ring positions)."""

    src: int
    dst: int
    chunk: int


@dataclass(frozen=True)
class RingStep:
    """One ring step: every rank sends one chunk to its successor. `reduce`: add, else copy."""

    phase: str  # REDUCE_SCATTER or ALL_GATHER
    index: int  # step number within the phase, from 0
    sends: tuple[Send, ...]  # one per rank, ordered by src

    @property
    def reduce(self) -> bool:
        """Receivers add the chunk (reduce-scatter) rather than copy it (all-gather)."""
        return self.phase == REDUCE_SCATTER

    def send_of(self, rank: int) -> Send:
        """What `rank` sends at this step."""
        return self.sends[rank]

    def receive_of(self, rank: int) -> Send:
        """What `rank` receives at this step (the send whose dst is `rank`)."""
        return self.sends[(rank - 1) % len(self.sends)]


def chunk_counts(count: int, n: int) -> list[int]:
    """Elements in each of n chunks of a `count`-element message (numpy.array_split sizes)."""
    if n < 1 or count < 0:
        raise ValueError(f"cannot split {count} elements into {n} chunks")
    base, extra = divmod(count, n)
    return [base + (1 if c < extra else 0) for c in range(n)]


def chunk_offsets(counts: list[int]) -> list[int]:
    """Start element of every chunk (prefix sums of `counts`)."""
    offsets, start = [], 0
    for size in counts:
        offsets.append(start)
        start += size
    return offsets


@functools.lru_cache(maxsize=32)
def _phase(phase: str, n: int, first_hop: int) -> tuple[RingStep, ...]:
    """n-1 steps in which chunk c leaves rank (c + step + first_hop) % n for the next rank
    (immutable, so made once per ring size: the full simulation runs thousands of rings; the
    last 32 sizes kept, (n - 1)·n Sends each)."""
    steps = []
    for step in range(n - 1):
        moves = [Send(src=(c + step + first_hop) % n, dst=(c + step + first_hop + 1) % n, chunk=c)
                 for c in range(n)]
        steps.append(RingStep(phase, step, tuple(sorted(moves, key=lambda s: s.src))))
    return tuple(steps)


def reduce_scatter_steps(n: int) -> list[RingStep]:
    """Chunk c starts at rank c+1 and ends, fully reduced, at rank c after n-1 steps."""
    return list(_phase(REDUCE_SCATTER, n, first_hop=1))


def all_gather_steps(n: int) -> list[RingStep]:
    """Chunk c starts at rank c and reaches every other rank after n-1 steps."""
    return list(_phase(ALL_GATHER, n, first_hop=0))


def all_reduce_steps(n: int) -> list[RingStep]:
    """The reduce-scatter's steps then the all-gather's: 2(n-1) steps."""
    return reduce_scatter_steps(n) + all_gather_steps(n)


STEPS = {REDUCE_SCATTER: reduce_scatter_steps, ALL_GATHER: all_gather_steps,
         ALL_REDUCE: all_reduce_steps}


def bytes_sent_per_rank(steps: list[RingStep], chunk_bytes: list[int]) -> list[int]:
    """Bytes each rank sends over `steps`, given every chunk's size in bytes."""
    sent = [0] * len(chunk_bytes)
    for step in steps:
        for send in step.sends:
            sent[send.src] += chunk_bytes[send.chunk]
    return sent


# Holdings: holdings[rank][chunk] = the ranks whose contributions that chunk's copy contains.
Holdings = list[list[frozenset[int]]]


def initial_holdings(collective: str, n: int) -> Holdings:
    """Before a reduction every rank holds its own data; before an all-gather only its chunk."""
    if collective == ALL_GATHER:
        return [[frozenset({r}) if c == r else frozenset() for c in range(n)] for r in range(n)]
    return [[frozenset({r}) for _ in range(n)] for r in range(n)]


def apply_step(holdings: Holdings, step: RingStep) -> Holdings:
    """Holdings after `step`: receivers add (reduce-scatter) or replace (all-gather) the chunk."""
    after = [list(row) for row in holdings]
    for send in step.sends:
        incoming = holdings[send.src][send.chunk]
        own = holdings[send.dst][send.chunk]
        after[send.dst][send.chunk] = own | incoming if step.reduce else incoming
    return after


# --------------------------------------------------------------------------------------------
# NCCL channels: several rings at once, laid out rail by rail across nodes
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Channel:
    """One NCCL channel: a ring over the group's members, carrying slice `index` of every chunk.

    `order`: group member indices in ring order; `via[p]`: the GPU whose NIC relays position p's
    outgoing hop (PXN), or None for a direct hop; `rail`: the NIC index its node-crossing hops
    use (None inside one node)."""

    index: int
    order: tuple[int, ...]
    via: tuple[int | None, ...]
    rail: int | None


def channel_rings(gpus: list[int], gpus_per_node: int) -> list[Channel]:
    """NCCL's rings for a group (docs/MODEL.md#runtime-mechanisms): one ring inside one node
    (on an NVSwitch the
    ring's time does not depend on the channel count: k channels share each GPU's NVLink k
    ways and carry 1/k of the bytes each); across nodes one channel per member a node holds
    (k = the fewest members on any node), channel c entering every node at its c-th member and
    leaving at its (c-1)-th, which sends through the NIC on the next entry's rail (PXN, NCCL
    >= 2.12) so every node-crossing hop of channel c stays on one rail."""
    by_node = members_by_node(gpus, gpus_per_node)
    if len(by_node) == 1:
        return [Channel(0, tuple(range(len(gpus))), (None,) * len(gpus), None)]
    k = min(len(members) for members in by_node)
    return [_rail_channel(c, gpus, by_node, gpus_per_node) for c in range(k)]


def members_by_node(gpus: list[int], gpus_per_node: int) -> list[list[int]]:
    """Group member indices per node, nodes in order of first appearance."""
    nodes: dict[int, list[int]] = {}
    for member, gpu in enumerate(gpus):
        nodes.setdefault(gpu // gpus_per_node, []).append(member)
    return list(nodes.values())


def _rail_channel(c: int, gpus: list[int], by_node: list[list[int]],
                  gpus_per_node: int) -> Channel:
    """Channel c: every node's members rotated to start at their c-th; the last member of a
    node relays through its node's GPU on the next node's entry rail."""
    order = [m for members in by_node for m in members[c:] + members[:c]]
    via: list[int | None] = [None] * len(order)
    end = 0
    for node_index, members in enumerate(by_node):
        end += len(members)
        src, dst = gpus[order[end - 1]], gpus[order[end % len(order)]]
        relay = src - src % gpus_per_node + dst % gpus_per_node  # same node, destination's rail
        via[end - 1] = None if relay == src else relay
    return Channel(c, tuple(order), tuple(via), gpus[by_node[0][c]] % gpus_per_node)


def slice_counts(counts: list[int], channels: int, index: int) -> list[int]:
    """Elements channel `index` carries of every chunk (each chunk split as chunk_counts)."""
    return [count // channels + (index < count % channels) for count in counts]


def channel_bytes(collective: str, counts: list[int], elem_bytes: int,
                  channels: list[Channel]) -> tuple[list[int], list[int]]:
    """Bytes each group member sends and receives over all channels, in closed form."""
    sent, received = [0] * len(counts), [0] * len(counts)
    for channel in channels:
        sizes = [s * elem_bytes for s in slice_counts(counts, len(channels), channel.index)]
        order, n = channel.order, len(channel.order)
        for p, out in enumerate(position_bytes_sent(collective, sizes, order)):
            sent[order[p]] += out
            received[order[(p + 1) % n]] += out  # a position receives what its predecessor sends
    return sent, received


def position_bytes_sent(collective: str, sizes: list[int], order: tuple[int, ...]) -> list[int]:
    """Bytes each position of one ring sends (`sizes`: bytes of every member's chunk slice): in
    a phase a position sends every chunk but one (reduce-scatter: its own; all-gather: its
    successor's)."""
    total, n = sum(sizes), len(order)
    sent = []
    for p, member in enumerate(order):
        out = 0
        if collective in (REDUCE_SCATTER, ALL_REDUCE):
            out += total - sizes[member]
        if collective in (ALL_GATHER, ALL_REDUCE):
            out += total - sizes[order[(p + 1) % n]]
        sent.append(out)
    return sent
