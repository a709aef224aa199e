"""Flow classes (engine/network.py): like loads starting together (same route, bytes, latency)
drain as one class in the fair-share solves. The oracle is the network with classes off
(Network.flow_classes = False: every flow one by one, as before classes): the same deliveries,
in the same order at the same times, fewer flows visited; and after every solve each flow's
rate equals a solve of all flows one by one, bit for bit (test_incremental_fair_share's
check)."""

import hypothesis.strategies as st
from hypothesis import given, settings
import simpy

from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration
from test_incremental_fair_share import _CheckedNetwork, _graph

CAL = LinkCalibration(nvlink_efficiency=1.0)


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_classes_deliver_as_their_flows_one_by_one(data):
    capacities = data.draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 7.5]), min_size=1,
                                    max_size=4))
    links = [(f"l{i}", f"m{i}") for i in range(len(capacities))]
    routes = data.draw(st.lists(st.lists(st.sampled_from(links), min_size=1, max_size=3),
                                min_size=1, max_size=3))  # a few routes: many like flows
    starts = data.draw(st.lists(st.tuples(
        st.sampled_from([0.0, 0.5, 1.0]),  # start time (s)
        st.sampled_from(routes),
        st.sampled_from([1, 4, 6]),  # bytes
        st.sampled_from([0.0, 1e-3])), min_size=1, max_size=16))  # latency (s)
    orders, visits = [], []
    for classes in (True, False):
        env = simpy.Environment()
        network = _CheckedNetwork(env, _graph(capacities), CAL)
        network.flow_classes = classes
        order = []

        def start(index, start_s, edges, nbytes, latency_s, network=network, env=env,
                  order=order):
            yield env.timeout(start_s)
            order.append((index, (yield network.load(tuple(edges), nbytes, latency_s))))

        for index, item in enumerate(starts):
            env.process(start(index, *item))
        env.run()
        orders.append(order)
        visits.append(network.flow_visits)
    assert orders[0] == orders[1]
    assert len(orders[0]) == len(starts)
    assert visits[0] <= visits[1]


def test_a_class_whose_first_flow_retires_alone_regroups_as_the_flows_would():
    """Far from t = 0 the wake lands a rounding off the finish: the woken flow retires, its
    like flow may keep a few bytes (more than DRAINED_FRACTION) and drain on alone. Its class
    then regroups (Network._regroup) and every delivery is the one-by-one network's."""
    regrouped = []

    class _Spied(Network):
        def _regroup(self, old, rest):
            regrouped.append(len(rest))
            super()._regroup(old, rest)

    for nbytes in range(2, 14):  # from t = 1e6 s, where ulp ~ 1e-10 s: a drain's end rounds
        base_s = 1e6  # to ~1e-5 of a byte off (a 1-byte flow first, then the class alone)
        plan = [(0.0, [("l0", "m0")], 1), (0.0, [("l0", "m0")], nbytes),
                (0.0, [("l0", "m0")], nbytes)]
        results = []
        for classes, kind in ((True, _Spied), (False, Network)):
            env = simpy.Environment(initial_time=base_s)
            network = kind(env, _graph([1e6]), CAL)
            network.flow_classes = classes
            order = []

            def start(index, edges, nbytes, network=network, order=order):
                order.append((index, (yield network.load(tuple(edges), nbytes, 0.0))))

            for index, (_s, edges, nbytes) in enumerate(plan):
                env.process(start(index, edges, nbytes))
            env.run()
            results.append(order)
        assert results[0] == results[1]
    assert regrouped  # the case arose (else the bytes above need changing)


def _ep_layout():
    """DualPipe, p 2, d = EP 16 on 4-GPU nodes (16 experts, top 2), meta: under the quotient
    by rail symmetry each all-to-all is 15 orbit flows, 3 to a route (tests/
    test_shortcut_ep_quotient.py's layout, wider)."""
    model = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 4,
             "seq_length": 2048, "vocab_size": 256, "ffn_hidden_size": 2048,
             "add_bias_linear": False, "num_experts": 16, "moe_router_topk": 2,
             "moe_ffn_hidden_size": 1024, "swiglu": True, "normalization": "RMSNorm",
             "position_embedding_type": "rope"}
    layout = {"pipeline_model_parallel_size": 2, "data_parallel_size": 16,
              "expert_model_parallel_size": 16, "moe_token_dispatcher_type": "alltoall",
              "moe_grouped_gemm": True, "global_batch_size": 64, "schedule": "dualpipe",
              "distributed_optimizer": True, "overlap_grad_reduce": True,
              "ddp_bucket_size": 2_000_000}
    overrides = {("model", k): v for k, v in model.items()}
    overrides.update({("parallel", k): v for k, v in layout.items()})
    overrides.update({("cluster", "gpus_per_node"): 4, ("cluster", "nodes"): 8,
                      ("cluster", "ib_bandwidth_GBps"): 2.0, ("run", "mode"): "meta"})
    return load_scenario(None, overrides)


def test_a_dualpipe_ep_run_is_the_same_with_classes(monkeypatch):
    """The run's metrics byte for byte with classes and without; the solves visit fewer flows
    (measured 5,076 against 9,016)."""
    from simsp.jsonout import dumps
    from simsp.metrics.collect import collect
    sc = _ep_layout()
    shortcuts = Shortcuts.for_scale(sc)
    results = []
    for classes in (True, False):
        monkeypatch.setattr(Network, "flow_classes", classes)
        run = simulate_iteration(sc, shortcuts, trace="none")
        network = run.inputs.world.network
        assert network.link_reps  # the quotient ran
        results.append((dumps(collect(run, shortcuts)), network.flow_visits))
    (mine, visits), (theirs, one_by_one) = results
    assert mine == theirs
    assert visits < 0.7 * one_by_one
