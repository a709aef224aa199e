"""Measure the meta-mode cost per layer-step that simsp/scenario/work.py uses to estimate run time.

Prints, for a few layouts, the layer-steps (layers x micro-batches, forward and backward of one
layer for one micro-batch on one simulated stage) and the CPU seconds of one simulated iteration
(time.process_time, so other processes on the machine do not inflate it).

    python benchmarks/work_estimate.py

The constants themselves (simsp/scenario/work_constants.py) are measured all together by
benchmarks/estimate_constants.py, which reuses these layouts; this script keeps the per-term
views below.

`--exchanges` measures instead the CPU price of one flow of Transformer Engine's ring
exchanges (--tp-comm-overlap; simsp/shortcuts/overlap_counts.py), work.py's
EXCHANGE_SECONDS_PER_FLOW: benchmarks/scale.py's GPT-3 175B H100 layout at 128 GPUs with and
without the overlap, the best of three runs each, the ring flows the overlap adds taken off at
SECONDS_PER_FLOW.

`--visits` measures work.py's SECONDS_PER_FLOW_VISIT: a DeepSeek-V3-shaped DualPipe run scaled
down (13 layers, p 4, d = EP 64, the quotient by rail symmetry with its EP groups) at m 8 and
16, the CPU seconds inside Network._reschedule (its solves) over the flows they took up
(Network.flow_visits), beside the estimate of those visits (work_counts.py ep_visits).

Then, for the layouts where a term other than layer-steps dominates (tests/test_work_estimate.py
CASES and PAIRS: pipeline depth, TP without shortcuts, one-tensor buckets, the CP and EP pair
terms), the estimate (meta_seconds) against the measured CPU seconds, and their ratio: README
"Limits" promises a factor of 4 (2 for the pair terms).
"""

import sys
import time
from pathlib import Path

from simsp.scenario.work import layer_steps, meta_seconds
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

LAYOUTS = [  # (label, overrides)
    ("22B-like L48 m4", dict(num_layers=48, global_batch_size=4, pp=1, dp=1, nodes=1)),
    ("L96 p8 m64", dict(num_layers=96, global_batch_size=64, pp=8, dp=1, nodes=8)),
    ("L96 p8 m64 d4", dict(num_layers=96, global_batch_size=256, pp=8, dp=4, nodes=32)),
    ("L96 p8 m256", dict(num_layers=96, global_batch_size=256, pp=8, dp=1, nodes=8)),
    ("L32 p4 m128 d64", dict(num_layers=32, global_batch_size=8192, pp=4, dp=64, nodes=256)),
]


def scenario(overrides: dict):
    """A 175B-width model in meta mode with the given layers, batch and layout."""
    o = overrides
    flags = {("model", "num_layers"): o["num_layers"], ("model", "hidden_size"): 12288,
             ("model", "num_attention_heads"): 96, ("model", "seq_length"): 2048,
             ("model", "vocab_size"): 51200,
             ("parallel", "tensor_model_parallel_size"): 8,
             ("parallel", "pipeline_model_parallel_size"): o["pp"],
             ("parallel", "data_parallel_size"): o["dp"],
             ("parallel", "sequence_parallel"): True,
             ("parallel", "recompute_granularity"): "selective",
             ("parallel", "global_batch_size"): o["global_batch_size"],
             ("cluster", "nodes"): o["nodes"], ("run", "mode"): "meta"}
    return load_scenario(None, flags)


def main() -> None:
    """Time each layout and print CPU seconds per layer-step."""
    print(f"{'layout':<20}{'layer-steps':>12}{'cpu s':>9}{'ms/step':>9}")
    for label, overrides in LAYOUTS:
        sc = scenario(overrides)
        start = time.process_time()
        simulate_iteration(sc, Shortcuts.for_scale(sc))
        spent = time.process_time() - start
        steps = layer_steps(sc)
        print(f"{label:<20}{steps:>12}{spent:>9.2f}{1e3 * spent / steps:>9.3f}")


def accuracy() -> None:
    """The estimate against the measured CPU time on the tests' layouts, with the promised factor."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_work_estimate import CASES, PAIRS, TINY  # noqa: E402 (the tests' layouts)
    rows = [(label, {**base, **layout}, representative, 4)
            for label, (base, layout, representative) in CASES.items()]
    rows += [(label, {**TINY, **layout}, True, 2) for label, layout in PAIRS.items()]
    print(f"\n{'layout':<45}{'estimate s':>11}{'cpu s':>9}{'ratio':>7}  within")
    for label, overrides, representative, factor in rows:
        sc = load_scenario(None, overrides)
        shortcuts = Shortcuts.for_scale(sc) if representative else Shortcuts()
        start = time.process_time()
        simulate_iteration(sc, shortcuts)
        spent = time.process_time() - start
        estimate = meta_seconds(sc, representative)
        ok = spent / factor <= estimate <= spent * factor
        print(f"{label:<45}{estimate:>11.2f}{spent:>9.2f}{estimate / spent:>7.2f}  "
              f"{'yes' if ok else 'NO'} (x{factor})")


def exchanges(gpus: int = 128, repeats: int = 3) -> None:
    """CPU seconds per TE exchange flow: (CPU with --tp-comm-overlap − without − the added
    ring flows x SECONDS_PER_FLOW) / exchange flows, on scale.py's gpt3-175b-h100 layout."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scale import _gpt3  # noqa: E402 (the benchmark's layout)
    from simsp.cli import build_parser
    from simsp.scenario.outside import scenario_from_args
    from simsp.scenario.work import SECONDS_PER_FLOW
    from simsp.shortcuts.work_counts import estimated_counts
    rows = []
    for extra in ([], ["--tp-comm-overlap"]):
        args = build_parser().parse_args(["run", *_gpt3(gpus), *extra, "--mode", "meta"])
        sc = scenario_from_args(args)
        shortcuts = Shortcuts.for_scale(sc)
        spent = []
        for _ in range(repeats):
            start = time.process_time()
            simulate_iteration(sc, shortcuts, trace="none")
            spent.append(time.process_time() - start)
        rows.append((min(spent), estimated_counts(sc, shortcuts)))
    (base, plain), (overlapped, counts) = rows
    rings = counts.flows - plain.flows
    price = (overlapped - base - rings * SECONDS_PER_FLOW) / counts.exchange_flows
    print(f"{gpus} GPUs: {base:.2f} CPU s without, {overlapped:.2f} with --tp-comm-overlap; "
          f"{counts.exchange_flows} exchange flows, {rings} more ring flows: "
          f"{price:.2e} s per exchange flow")


def visits(batches: tuple[int, ...] = (512, 1024)) -> None:
    """CPU seconds per flow visit: the seconds spent in Network._reschedule over the flows its
    solves took up, on DeepSeek-V3's DualPipe layout scaled down."""
    from simsp.engine.network import Network
    from simsp.shortcuts.work_counts import estimated_counts
    spent = [0.0]
    reschedule = Network._reschedule

    def timed(self, event=None):
        start = time.process_time()
        reschedule(self, event)
        spent[0] += time.process_time() - start

    Network._reschedule = timed
    for batch in batches:
        sc = load_scenario("scenarios/deepseek-v3.toml", {
            ("model", "num_layers"): 13, ("model", "moe_layer_freq"): "([0]*1+[1]*12)",
            ("parallel", "pipeline_model_parallel_size"): 4, ("parallel", "schedule"): "dualpipe",
            ("parallel", "global_batch_size"): batch, ("cluster", "nodes"): 32})
        shortcuts, spent[0] = Shortcuts.for_scale(sc), 0.0
        network = simulate_iteration(sc, shortcuts, trace="none").inputs.world.network
        estimate = estimated_counts(sc, shortcuts).flow_visits
        print(f"m {sc.parallel.num_micro_batches}: {network.flow_visits} visits "
              f"(estimated {estimate:.3g}) in {spent[0]:.2f} CPU s: "
              f"{spent[0] / network.flow_visits:.2e} s per visit")
    Network._reschedule = reschedule


if __name__ == "__main__":
    if "--exchanges" in sys.argv:
        exchanges()
    elif "--visits" in sys.argv:
        visits()
    else:
        main()
        accuracy()
