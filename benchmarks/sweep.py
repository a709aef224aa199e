"""Sweep throughput: configurations per second for 22B-class and 175B-class sweeps on an embedded
Dask LocalCluster (2 workers), against simulating the same configurations directly in this
process, and the executor's overhead per configuration (measured on tiny configurations whose
simulation takes milliseconds, so what remains is Dask's and the row's cost).

Usage: python benchmarks/sweep.py [--quick]   (--quick: fewer configurations per class)
Prints wall and CPU seconds and the machine's load average: timings on a shared machine are
noisy, so compare the CPU seconds of the direct runs with the wall time of the Dask runs.
"""

import os
import sys
import time

from simsp.api import build_configs
from simsp.explore.evaluate import evaluate
from simsp.explore.executor import Executor
from simsp.explore.runner import run_configs

CLASSES = {
    "22B": ("scenarios/paper-22b.toml", {"recompute_granularity": "none,selective,full",
                                         "sequence_parallel": "true,false",
                                         "micro_batch_size": "1,2,4", "global_batch_size": "4"}),
    "175B": ("scenarios/paper-175b.toml", {"recompute_granularity": "selective,full",
                                           "num_layers_per_virtual_pipeline_stage": "4,6"}),
    "tiny": (None, {"mode": "meta", "num_layers": "2", "micro_batch_size": "1,2,4,8",
                    "seed": ",".join(str(i) for i in range(50))}),
}
WORKERS = 2


def direct(configs) -> tuple[float, float]:
    """(wall, CPU) seconds to simulate the configurations one after another in this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    for config in configs:
        evaluate(config.values)
    return time.perf_counter() - wall, time.process_time() - cpu


def on_dask(configs) -> tuple[float, float]:
    """(cluster start-up, sweep) wall seconds on an embedded LocalCluster of 2 workers."""
    start = time.perf_counter()
    with Executor(workers=WORKERS) as executor:
        executor.client.run(lambda: None)  # wait until every worker answers
        ready = time.perf_counter()
        run_configs(configs, executor, out=None, quiet=True)
        return ready - start, time.perf_counter() - ready


def measure(name: str, quick: bool) -> dict:
    """Time one class of configurations on Dask and directly."""
    source, lists = CLASSES[name]
    configs = build_configs(source, lists)
    if quick:
        configs = configs[:4] if name != "tiny" else configs[:100]
    startup, dask_wall = on_dask(configs)
    direct_wall, direct_cpu = direct(configs)
    n = len(configs)
    return {"class": name, "configs": n, "startup_s": startup, "dask_wall_s": dask_wall,
            "configs_per_s": n / dask_wall, "direct_cpu_per_config_s": direct_cpu / n,
            "direct_wall_per_config_s": direct_wall / n,
            "overhead_per_config_s": dask_wall * WORKERS / n - direct_wall / n}


def main() -> int:
    """Print the benchmark table and the load average around it."""
    quick = "--quick" in sys.argv[1:]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"cores: {os.cpu_count()}, workers: {WORKERS}")
    print("| class | configs | cluster start (s) | Dask wall (s) | configs/s | direct CPU s/config "
          "| configs per CPU s | direct wall s/config | Dask overhead s/config |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("tiny", "22B", "175B"):
        r = measure(name, quick)
        print(f"| {r['class']} | {r['configs']} | {r['startup_s']:.1f} | {r['dask_wall_s']:.1f} | "
              f"{r['configs_per_s']:.2f} | {r['direct_cpu_per_config_s']:.3f} | "
              f"{1 / r['direct_cpu_per_config_s']:.2f} | "
              f"{r['direct_wall_per_config_s']:.3f} | {r['overhead_per_config_s']:+.3f} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("overhead = Dask wall x workers / configs - direct wall / config (2 cores, shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
