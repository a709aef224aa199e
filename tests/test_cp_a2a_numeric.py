"""Ulysses attention run by CP rank processes through the all-to-alls on the links: each rank
takes other ranks' pieces only once an exchange is delivered; the result equals plain causal
attention (tests/test_ring_attention.py's oracle) to rounding and the timeline is unchanged."""

import numpy as np
import pytest
import simpy

from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.model.context_split import gather_sequence, local_positions, split_sequence
from simsp.training.context_parallel.ring_kernels import CpShard
from simsp.training.context_parallel.a2a import CpAllToAll
from simsp.training.context_parallel.a2a_numeric import run_numeric_a2a
from test_ring_attention import oracle_attention, oracle_grads


def _a2a(cp):
    env = simpy.Environment()
    network = Network(env, build_topology(Cluster(nodes=1)), LinkCalibration())
    return CpAllToAll(env, network, tuple(range(cp)), 3_000_000, 1_000_000)


@pytest.mark.parametrize("cp,balanced", [(2, True), (4, True), (4, False)])
def test_ranks_through_the_all_to_alls_compute_full_causal_attention(cp, balanced):
    rng = np.random.default_rng(cp)
    s = 4 * cp
    q = rng.standard_normal((1, 8, s, 8))  # (b, a, s, d)
    k, v = rng.standard_normal((2, 1, 4, s, 8))  # (b, G, s, d) each: G = 4 divides by cp
    dout = rng.standard_normal(q.shape)  # (b, a, s, d)
    cut = lambda x, r: split_sequence(x, cp, r, balanced)  # noqa: E731
    shards = [CpShard(cut(q, r), cut(k, r), cut(v, r), local_positions(s, cp, r, balanced))
              for r in range(cp)]
    numeric = _a2a(cp)
    results = run_numeric_a2a(numeric, shards, [cut(dout, r) for r in range(cp)], 3e-5, 7e-5)
    whole = [gather_sequence([res[j] for res in results], balanced) for j in range(4)]
    expected = [oracle_attention(q, k, v), *oracle_grads(q, k, v, dout)]
    for got, want in zip(whole, expected):
        assert np.max(np.abs(got - want)) < 1e-12
    meta = _a2a(cp)
    for rank in range(cp):
        meta.env.process(meta.run_rank(rank, 3e-5, 7e-5))
    meta.env.run()
    assert numeric.ends == meta.ends
