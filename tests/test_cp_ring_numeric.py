"""Ring attention run by CP rank processes on the links: each rank sees other ranks' K/V and
dK/dV only through delivered exchanges, and the result equals plain causal attention (the
oracle of tests/test_ring_attention.py, itself checked by finite differences) to rounding,
while the timeline is the meta ring's to the bit."""

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.model.context_split import gather_sequence, local_positions, split_sequence
from simsp.training.context_parallel.ring_kernels import CpShard
from simsp.training.context_parallel.ring import CpRing, run_ring
from simsp.training.context_parallel.ring_numeric import run_numeric_ring
from test_ring_attention import oracle_attention, oracle_grads

KV_BYTES = 4_000_000


def _ring(cp):
    env = simpy.Environment()
    network = Network(env, build_topology(Cluster(nodes=1)), LinkCalibration())
    return CpRing(env, network, tuple(range(cp)), KV_BYTES)


@pytest.mark.parametrize("cp,balanced", [(1, True), (2, True), (4, True), (4, False)])
def test_ranks_on_the_links_compute_full_causal_attention(cp, balanced):
    rng = np.random.default_rng(cp)
    s = 4 * cp
    q = rng.standard_normal((1, 4, s, 8))  # (b, a, s, d)
    k, v = rng.standard_normal((2, 1, 2, s, 8))  # (b, G, s, d) each
    dout = rng.standard_normal(q.shape)  # (b, a, s, d)
    cut = lambda x, r: split_sequence(x, cp, r, balanced)  # noqa: E731
    shards = [CpShard(cut(q, r), cut(k, r), cut(v, r), local_positions(s, cp, r, balanced))
              for r in range(cp)]
    # block times: some steps longer than a transfer (~20 us), some shorter, unequal per rank
    fwd = [[(5 + 40 * ((r + i) % 2)) * 1e-6 for i in range(cp)] for r in range(cp)]
    bwd = [[(9 + 30 * ((r * i) % 3)) * 1e-6 for i in range(cp)] for r in range(cp)]
    results = run_numeric_ring(_ring(cp), shards, [cut(dout, r) for r in range(cp)], fwd, bwd)
    whole = [gather_sequence([res[j] for res in results], balanced) for j in range(4)]
    expected = [oracle_attention(q, k, v), *oracle_grads(q, k, v, dout)]
    for got, want in zip(whole, expected):
        assert np.max(np.abs(got - want)) < 1e-12


def test_numbers_do_not_change_the_timeline():
    cp = 4
    rng = np.random.default_rng(0)
    shards = [CpShard(*rng.standard_normal((3, 1, 2, 2, 4)), np.arange(2) + 2 * r)
              for r in range(cp)]
    fwd = [[(10 + 7 * r + 3 * i) * 1e-6 for i in range(cp)] for r in range(cp)]
    bwd = [[(25 - 4 * r + i) * 1e-6 for i in range(cp)] for r in range(cp)]
    numeric_ring, meta_ring = _ring(cp), _ring(cp)
    run_numeric_ring(numeric_ring, shards, [rng.standard_normal(s.q.shape) for s in shards],
                     fwd, bwd)
    meta = run_ring(meta_ring.env, meta_ring, fwd, bwd)
    assert numeric_ring.timeline == meta
