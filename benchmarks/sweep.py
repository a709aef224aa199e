"""Sweep throughput: configurations per CPU second for 22B-class and 175B-class grids, simulated
in this process and on an embedded Dask LocalCluster of 2 workers, and the wall time of the
whole mixed grid (1,008 configurations: 576 of 22B, 432 of 175B) on those 2 workers.

Usage: python benchmarks/sweep.py [--sample N] [--full]
  --sample N  configurations per class for the per-class figures (every k-th of the grid;
              default 24)
  --full      also run the whole mixed grid on 2 workers and print its wall time
Prints wall and CPU seconds and the machine's load average: on a shared machine wall times are
noisy, so the CPU seconds (this process's, or the workers' own) are the figures to compare.
"""

import os
import sys
import time

from simsp.api import build_configs
from simsp.explore.evaluation.evaluate import evaluate
from simsp.explore.evaluation.executor import Executor
from simsp.explore.evaluation.runner import run_configs

# The mixed grid: what a user weighs for each model, the link speeds as what-ifs.
CLASSES = {
    "22B": ("scenarios/paper-22b.toml", {
        "recompute_granularity": "none,selective,full", "sequence_parallel": "true,false",
        "micro_batch_size": "1,2,4,8", "global_batch_size": "8,16,32,64",
        "nvlink_bandwidth_GBps": "150,300,600", "transfer_overhead_us": "0,5"}),
    "175B": ("scenarios/paper-175b.toml", {
        "recompute_granularity": "none,selective,full", "micro_batch_size": "1,2",
        "num_layers_per_virtual_pipeline_stage": "none,4,6,12",
        "sequence_parallel": "true,false", "ib_bandwidth_GBps": "12.5,25,50",
        "nvlink_bandwidth_GBps": "150,300,600"}),
}
WORKERS = 2


def sample(configs: list, count: int) -> list:
    """`count` configurations spread evenly over the grid (every k-th)."""
    step = max(1, len(configs) // count)
    return configs[::step][:count]


def in_process(configs) -> float:
    """CPU seconds per configuration, simulated one after another in this process."""
    cpu = time.process_time()
    for config in configs:
        evaluate(config.values)
    return (time.process_time() - cpu) / len(configs)


def _workers_cpu(client) -> float:
    """CPU seconds the worker processes have used so far, together."""
    return sum(client.run(time.process_time).values())


def on_dask(configs) -> tuple[float, float, float]:
    """(cluster start-up wall s, sweep wall s, the workers' CPU s per configuration) on an
    embedded LocalCluster of 2 workers (this process submits and collects)."""
    start = time.perf_counter()
    with Executor(workers=WORKERS) as executor:
        cpu_before = _workers_cpu(executor.client)
        ready = time.perf_counter()
        run_configs(configs, executor, out=None, quiet=True)
        wall = time.perf_counter() - ready
        cpu = (_workers_cpu(executor.client) - cpu_before) / len(configs)
    return ready - start, wall, cpu


def main() -> int:
    """Print the per-class table, then (with --full) the whole mixed grid's wall time."""
    args = sys.argv[1:]
    count = int(args[args.index("--sample") + 1]) if "--sample" in args else 24
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"cores: {os.cpu_count()}, workers: {WORKERS}")
    print("| class | grid | sampled | in-process CPU s/config | configs per CPU s | Dask start (s) "
          "| Dask wall (s) | Dask configs/s | workers' CPU s/config |")
    print("|---|---|---|---|---|---|---|---|---|")
    grids = {name: build_configs(*CLASSES[name]) for name in CLASSES}
    for name, configs in grids.items():
        chosen = sample(configs, count)
        cpu = in_process(chosen)
        startup, wall, worker_cpu = on_dask(chosen)
        print(f"| {name} | {len(configs)} | {len(chosen)} | {cpu:.3f} | {1 / cpu:.2f} | "
              f"{startup:.1f} | {wall:.1f} | {len(chosen) / wall:.2f} | {worker_cpu:.3f} |")
    if "--full" in args:
        mixed = [config for configs in grids.values() for config in configs]
        startup, wall, worker_cpu = on_dask(mixed)
        print(f"mixed grid: {len(mixed)} configurations on {WORKERS} workers: {wall:.0f} s wall "
              f"(cluster start {startup:.1f} s), workers' CPU {worker_cpu:.3f} s per "
              f"configuration ({worker_cpu * len(mixed) / WORKERS:.0f} s of each core)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
