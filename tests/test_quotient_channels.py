"""A ring's piece under the quotient by rail symmetry (shortcuts/quotient.py ring_piece) with its
channel maps composed from per-axis steps (ChannelMaps) is the piece the brute force gives: a
copy of the former _standing, which moved every hop of every channel once per member's shift
(channels x d² on a d-member ring), kept here as the oracle. docs/shortcuts.md, "Rings as their
pieces"."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsp.engine.collectives.ring_piece import RingPiece
from simsp.engine.collectives.ring_plan import Channel
from simsp.engine.collectives.ring_plan import channel_rings as nccl_rings
from simsp.shortcuts import quotient
from simsp.shortcuts.rail_symmetry import StageAxes
from simsp.training.driver.iteration import Shortcuts
from tests.test_shortcut_layouts import layout_scenario

channel_rings = nccl_rings  # the oracle's rings (doubled alongside quotient's in one test)


def brute_ring_piece(group, gpus_per_node, to_origin, moved):
    """shortcuts/quotient.py ring_piece before its channel maps were composed (a74fa45)."""
    gpus = list(group)
    n = len(gpus)
    hops = [[(gpus[ch.order[p]], gpus[ch.order[(p + 1) % n]], ch.via[p]) for p in range(n)]
            for ch in channel_rings(gpus, gpus_per_node)]  # [channel][ring position]
    at: dict[tuple, list] = {}
    for c, channel in enumerate(hops):
        for p, hop in enumerate(channel):
            at.setdefault(hop, []).append((c, p))
    executed = [pos for hop, positions in at.items() if not any(to_origin(hop[0]))
                for pos in positions]
    index = {position: i for i, position in enumerate(executed)}
    standing = brute_standing(hops, at, moved)
    source = {}
    for hop, positions in at.items():
        for c, p in positions:
            stand = standing(hop, c, to_origin(hop[0]))
            if index.get(stand) is None:
                return None
            source[(c, p)] = index[stand]
    return RingPiece(tuple(executed), tuple(source[(c, (p - 1) % n)] for c, p in executed))


def brute_standing(hops, at, moved):
    """quotient._standing before (a74fa45): every channel's hops moved per shift."""
    channels: dict[frozenset, list[int]] = {}
    for c, channel in enumerate(hops):
        channels.setdefault(frozenset(channel), []).append(c)
    onto: dict = {}

    def channel_map(shift):
        if shift not in onto:
            images = [channels.get(frozenset(quotient._moved_hop(hop, shift, moved)
                                             for hop in channel)) for channel in hops]
            onto[shift] = None if None in images else [
                c if c in image else image[0] if len(image) == 1 else None
                for c, image in enumerate(images)]
        return onto[shift]

    def stand(hop, channel, shift):
        image_hop = quotient._moved_hop(hop, shift, moved)
        mapped = channel_map(shift)
        if mapped is not None and mapped[channel] is not None:
            return mapped[channel], hops[mapped[channel]].index(image_hop)
        return quotient._in_channel(at.get(image_hop, []), channel)

    return stand


def stage_rings(axes: StageAxes, first: int) -> list[tuple[int, ...]]:
    """The stage's DP rings (one per TP rank, members in rank order), its TP groups and two
    uneven groups (a DP ring less its last member; every member of a block's first TP group
    plus one of the next node)."""
    ranks = range(first, first + axes.per_stage)
    dp = [tuple(r for r in ranks if (r - first) % axes.tp == tp) for tp in range(axes.tp)]
    tp = [tuple(ranks[i:i + axes.tp]) for i in range(0, axes.per_stage, axes.tp)]
    uneven = [dp[0][:-1]] if len(dp[0]) > 2 else []
    if axes.per_stage > axes.block:
        uneven.append(tuple(ranks[:axes.tp]) + (first + axes.block,))
    return dp + tp + uneven


def both_pieces(group, gpus_per_node, axes, steps):
    """(the piece, the oracle's) of `group` under the shifts by `steps`."""
    args = (group, gpus_per_node, lambda rank: axes.to_origin(rank, steps), axes.moved)
    return quotient.ring_piece(*args), brute_ring_piece(*args)


@settings(max_examples=60)
@given(gpus_per_node=st.sampled_from([4, 8]), tp=st.sampled_from([1, 2, 4]),
       nodes=st.sampled_from([1, 2, 3, 4, 6]), stage=st.integers(0, 1),
       steps=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2]),
                       st.sampled_from([1, 2, 3])))
def test_pieces_equal_the_brute_force_on_rail_layouts(gpus_per_node, tp, nodes, stage, steps):
    """Stages of `nodes` whole nodes (t·d = nodes x GPUs per node), shifted by every multiple of
    `steps` along (TP rank, TP group, node): channels rotated per node (several members a node),
    rails crossing nodes, steps that do not divide an axis (then some shift maps a channel onto
    none) and uneven groups (a shift maps them off themselves: no piece)."""
    axes = StageAxes(nodes * gpus_per_node, gpus_per_node, tp)
    steps = tuple(min(step, size) for step, size in zip(steps, axes.sizes))
    for group in stage_rings(axes, stage * axes.per_stage):
        mine, oracle = both_pieces(group, gpus_per_node, axes, steps)
        assert mine == oracle, group


def test_nccl_doubled_channels_equal_the_brute_force(monkeypatch):
    """NCCL may run each ring twice (2x channels: every hop set held by two channels, so a
    channel's image is ambiguous unless the shift keeps it): DP rings of 8-GPU nodes, TP 1 and
    2, with every channel repeated, against the oracle on the same doubled rings."""
    def doubled(gpus, gpus_per_node):
        rings = nccl_rings(gpus, gpus_per_node)
        return rings + [replace(ch, index=ch.index + len(rings)) for ch in rings]

    monkeypatch.setattr(quotient, "channel_rings", doubled)
    monkeypatch.setitem(globals(), "channel_rings", doubled)
    seen = 0
    for tp, nodes, steps in ((1, 4, (1, 1, 1)), (2, 2, (1, 1, 1)), (1, 4, (1, 2, 2)),
                             (2, 3, (1, 1, 1))):
        axes = StageAxes(nodes * 8, 8, tp)
        for group in stage_rings(axes, 0):
            mine, oracle = both_pieces(group, 8, axes, steps)
            assert mine == oracle, (tp, nodes, steps, group)
            seen += mine is not None
    assert seen  # some doubled ring keeps its piece (a shift that keeps every channel's set)


def test_a_hand_built_channel_repeat_stands_in_its_own_channel(monkeypatch):
    """Two channels of one hop set, rotated (channel 1 = channel 0 from its second position):
    the identity keeps each; a rail shift maps the set onto itself, so each channel onto
    itself, and its hops' images stand in the hop's own channel (the oracle agrees)."""
    def repeated(gpus, gpus_per_node):
        ring = nccl_rings(gpus, gpus_per_node)[0]
        order, via = ring.order, ring.via
        return [ring, Channel(1, order[1:] + order[:1], via[1:] + via[:1], ring.rail)]

    monkeypatch.setattr(quotient, "channel_rings", repeated)
    monkeypatch.setitem(globals(), "channel_rings", repeated)
    axes = StageAxes(8, 8, 1)
    mine, oracle = both_pieces(tuple(range(8)), 8, axes, (1, 1, 1))
    assert mine == oracle
    # rank 0 sends 0 -> 1 at position 0 of channel 0 and position 7 of channel 1 (rotated)
    assert mine.executed == ((0, 0), (1, 7))


@pytest.mark.parametrize("gpus", [512, 1024])
def test_gpt3_h100_layout_pieces_equal_the_brute_force(gpus, monkeypatch):
    """benchmarks/scale.py gpt3-175b-h100's layout (t4 SP p8 interleaved, distributed optimizer,
    overlapped reductions, d = GPUs/32 on 8-GPU DGX H100 nodes; a small model): every ring piece
    the check computes, with the shifts it finds (node steps across leaves included), is the
    oracle's for the same arguments."""
    calls = []
    piece_of = quotient.ring_piece

    def recorded(*args):
        calls.append((args, piece_of(*args)))
        return calls[-1][1]

    monkeypatch.setattr(quotient, "ring_piece", recorded)
    sc = layout_scenario(8, 4, 8, gpus // 32, True, True, True, 8, system="dgx-h100")
    assert Shortcuts.for_scale(sc).symmetry.pieces
    dp_rings = [args for args, _ in calls if len(args[0]) == gpus // 32]
    assert dp_rings
    for args, piece in calls:
        assert piece == brute_ring_piece(*args)
