"""Notebook-style exploration with simsp's Python API, as a plain script (no __main__ guard
needed): one run, a what-if sweep over the GPUs and the InfiniBand bandwidth, and a search.

    python examples/explore.py [--workers N]     (default: 2 Dask workers)
"""

import sys

import simsp

WORKERS = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 2
MODEL = {"mode": "meta", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
         "seq_length": 512, "vocab_size": 1024}

# 1. One iteration: the metrics of `simsp run --json`.
metrics = simsp.run(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                    global_batch_size=8, **MODEL)
print(f"t2 p2 on 4 GPUs: {metrics['iteration_time_s'] * 1e3:.2f} ms, MFU {metrics['mfu']:.1%}")

# 2. What if we had twice the GPUs, or twice the InfiniBand? d follows the world size.
frame = simsp.sweep(None, workers=WORKERS, world_size=[4, 8], ib_bandwidth_GBps=[25, 50],
                    tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                    global_batch_size=8, **MODEL)
print(frame[["variant", "gpus", "data_parallel_size", "iteration_time_s", "tokens_per_s",
             "fits"]].to_string(index=False))

# 3. The fastest layouts for 4 GPUs, with the command that reproduces the winner.
best = simsp.search(None, gpus=4, global_batch_size=8, top=3, workers=WORKERS, **MODEL)
print(best[["variant", "iteration_time_s", "headroom_bytes"]].head(3).to_string(index=False))
print("reproduce the winner:", best["command"].iloc[0])
