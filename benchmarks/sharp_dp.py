"""NeMo 24.07's Llama 2 7B recipe (the validation set's inline scenario) scaled to d 64 on 8
DGX H100 nodes, with and without --use-sharp: the iteration and its DP collectives by the
algorithm NCCL ran them as (docs/nccl.md, "What it costs").

    python benchmarks/sharp_dp.py [--ddp]
"""

import sys
import tomllib

from simsp.metrics.collect import collect
from simsp.scenario.loading import load_scenario
from simsp.shortcuts.check import Shortcuts
from simsp.training.driver.iteration import simulate_iteration
from simsp.validation.scenarios import inline_overrides

PUBLISHED = "simsp/validation/data/published.toml"
RECIPE = "nemo-llama2-7b"


def scenario(use_sharp: bool, distributed_optimizer: bool):
    """The recipe at d 64 on 8 nodes, global batch 1,024."""
    with open(PUBLISHED, "rb") as f:
        sections = tomllib.load(f)["scenarios"][RECIPE]
    overrides = inline_overrides(PUBLISHED, RECIPE, sections)
    overrides.update({("cluster", "nodes"): 8, ("parallel", "data_parallel_size"): 64,
                      ("parallel", "global_batch_size"): 1024,
                      ("cluster", "use_sharp"): use_sharp})
    if not distributed_optimizer:
        overrides.update({("parallel", "distributed_optimizer"): False,
                          ("parallel", "overlap_param_gather"): False})
    return load_scenario(None, overrides)


def main() -> None:
    """One line per setting: iteration, exposed communication, DP collectives' seconds."""
    distributed_optimizer = "--ddp" not in sys.argv[1:]
    for use_sharp in (False, True):
        sc = scenario(use_sharp, distributed_optimizer)
        shortcuts = Shortcuts.for_scale(sc)
        run = simulate_iteration(sc, shortcuts, trace="none")
        m = collect(run, shortcuts)
        seconds: dict = {}
        for s in run.inputs.world.comm.stats:
            if len(s.gpus) == 64:
                key = f"{s.collective}/{s.algorithm}"
                count, total = seconds.get(key, (0, 0.0))
                seconds[key] = (count + 1, total + s.end_s - s.start_s)
        parts = ", ".join(f"{k} x{n} {t * 1e3:.1f} ms" for k, (n, t) in sorted(seconds.items()))
        print(f"use_sharp={use_sharp}: iteration {m['iteration_time_s']:.4f} s, exposed comm "
              f"{m['exposed_comm_s'] * 1e3:.1f} ms; DP: {parts}")


if __name__ == "__main__":
    main()
