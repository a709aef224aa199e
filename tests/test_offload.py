"""Activation offload (training/pipeline/offload.py): the copies' bytes and seconds, GPU memory moved to
the host and back, the compute's waits, and numbers unchanged in numeric mode."""

import json

import pytest

from simsp.analytic import layer_activation_bytes
from simsp.hardware.profiles import gpu_profile
from simsp.training.driver.compare import compare_with_reference
from simsp.training.driver.iteration import simulate_iteration
from simsp.scenario.loading import load_scenario
from simsp.training.pipeline.offload import ActivationOffload
from simsp.training.pipeline.plan import stage_plans
from simsp.training.driver.world import build_world
from tests.inprocess import cli

META = ["--mode", "meta", "--num-layers", "4", "--hidden-size", "2048", "--num-attention-heads",
        "16", "--seq-length", "2048", "--vocab-size", "32000", "--tensor-model-parallel-size", "1",
        "--data-parallel-size", "1", "--global-batch-size", "1", "--json"]


def run(*extra) -> dict:
    rc, out, err = cli(["run", *META, *extra])
    assert rc == 0, err
    return json.loads(out)


def test_offload_moves_whole_layers_to_the_host_and_back():
    """Offloading N = 2 of 4 layers: the host holds exactly what the GPU no longer does at its
    peak, each copy takes bytes / the A100's 32 GB/s PCIe Gen4, and the iteration grows by
    exactly the seconds the compute waited for copies."""
    base = run()
    off = run("--cpu-offloading", "--cpu-offloading-num-layers", "2")
    stats = off["offload"]["per_stage"][0]
    layer_saved = layer_activation_bytes(s=2048, b=1, h=2048, a=16)  # K22 Table 2: 34sbh+5as²b
    saved_peak_drop = (base["ranks"][0]["activation_peak_bytes"]
                       - off["ranks"][0]["activation_peak_bytes"])
    assert stats["host_peak_bytes"] == saved_peak_drop > 0
    assert stats["offloaded_bytes"] == stats["host_peak_bytes"]  # one micro-batch in flight
    assert stats["offloaded_bytes"] == 2 * layer_saved
    rate = gpu_profile("a100-sxm-80gb").host_link_GBps * 1e9
    assert stats["d2h_s"] == pytest.approx(stats["offloaded_bytes"] / rate, rel=1e-12)
    assert stats["h2d_s"] == pytest.approx(stats["offloaded_bytes"] / rate, rel=1e-12)
    waited = off["exposed_s_per_stage"][0]["offload"]
    assert waited == pytest.approx(stats["exposed_s"], rel=1e-12)
    assert off["iteration_time_s"] - base["iteration_time_s"] == pytest.approx(waited,
                                                                                abs=1e-12)
    assert sum(off["exposed_s_per_stage"][0].values()) == pytest.approx(
        off["iteration_time_s"], rel=1e-12)


def test_offload_leaves_the_numbers_alone():
    sc = load_scenario(overrides={("parallel", "cpu_offloading"): True,
                                  ("parallel", "cpu_offloading_num_layers"): 1,
                                  ("parallel", "tensor_model_parallel_size"): 2,
                                  ("parallel", "sequence_parallel"): True,
                                  ("parallel", "data_parallel_size"): 2,
                                  ("parallel", "global_batch_size"): 4})
    errors = compare_with_reference(simulate_iteration(sc))
    assert max(errors.values()) < 1e-12


@pytest.mark.parametrize("flags, message", [
    (["--cpu-offloading-num-layers", "1"], "parallel.cpu_offloading_num_layers: needs "
                                          "cpu_offloading"),
    (["--cpu-offloading", "--cpu-offloading-num-layers", "2"],
     "parallel.cpu_offloading_num_layers: must be below num_layers=2"),
    (["--cpu-offloading", "--recompute-granularity", "full"], "parallel.cpu_offloading: "
                                                              "Megatron: CPU offloading does "
                                                              "not work with activation "
                                                              "recomputation"),
])
def test_offload_flags_are_checked(flags, message):
    rc, _, err = cli(["run", *flags])
    assert rc == 2 and err.strip().startswith(f"error: {message}")


def test_hand_worked_offload_timeline():
    """Three layers, the first two offloaded, each keeping X bytes; copy C = X / 32 GB/s longer
    than a forward F, shorter than a backward B:
      F        L0 done: its copy out [F, F+C]; L1 runs [F, 2F]
      2F       L1 done: its copy queues behind L0's, [F+C, F+2C]; wait for L0's to F+C (C−F)
      F+C      L2 runs to 2F+C; then wait for L1's copy to F+2C (C−F)
      F+2C     backward of L2: reload of L1 issued [F+2C, F+3C]; L2 runs to F+2C+B
      F+2C+B   backward of L1: reload of L0 issued [.., F+3C+B]; L1's arrived: runs at once
      F+2C+2B  backward of L0: its reload arrived; the end at F+2C+3B.
    The host holds 2X from F+2C to F+3C; the GPU keeps only L2's X while the copies are out."""
    sc = load_scenario(overrides={("model", "num_layers"): 3, ("run", "mode"): "meta",
                                  ("parallel", "cpu_offloading"): True,
                                  ("parallel", "cpu_offloading_num_layers"): 2})
    world = build_world(sc)
    r = world.ranks[0]
    offload = ActivationOffload(r, sc, stage_plans(sc, world.grid)[0])
    X, F, B = 32_000_000, 6e-4, 1.5e-3
    C = X / 32e9
    log, kept = {}, {}

    def program():
        for i in range(3):
            r.scope = f"mb0.L{i}."
            kept[i] = r.alloc((X,), 1, "saved", "activations")
            yield r.env.timeout(F)
            yield from offload.after_forward(r, 0, i, {"saved": kept[i]})
        log["forward_end"] = (r.env.now, r.ledger.current["activations"])
        for i in (2, 1, 0):
            yield from offload.before_backward(r, 0, i)
            log[f"B{i}"] = r.env.now
            yield r.env.timeout(B)
            r.free(kept[i])
        log["end"] = r.env.now

    world.env.process(program())
    world.env.run()
    assert log["forward_end"][0] == pytest.approx(F + 2 * C, abs=1e-12)
    assert log["forward_end"][1] == X
    expected = {"B2": F + 2 * C, "B1": F + 2 * C + B, "B0": F + 2 * C + 2 * B,
                "end": F + 2 * C + 3 * B}
    for name, t in expected.items():
        assert log[name] == pytest.approx(t, abs=1e-12), name
    assert offload.stats.exposed_s == pytest.approx(2 * (C - F), abs=1e-12)
    assert offload.stats.host_peak_bytes == 2 * X
    assert offload.stats.host_timeline[-1][1] == 0
    assert r.ledger.current["activations"] == 0
