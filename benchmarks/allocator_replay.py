"""Time the caching-allocator model (simsp/engine/allocator/) on a training-like allocation
stream of about a million events, with and without expandable segments, and a memory snapshot
written and read back (docs/allocator.md).

The stream: weights allocated once; then micro-batches whose sequence length varies (as with
variable-length batches), each a forward pass that keeps per-layer activations and frees
temporaries, and a backward pass that frees them in reverse while gradient temporaries come and
go. Prints CPU seconds (time.process_time), microseconds per event, the reserved and allocated
peaks and the fragmentation at the allocated peak.

    python benchmarks/allocator_replay.py [--events N] [--alloc-conf TEXT] [--snapshot-events N]
"""

import argparse
import os
import tempfile
import time

from simsp.engine.allocator.config import parse_alloc_conf
from simsp.engine.allocator.replay import Alloc, Free, replay, segments_at
from simsp.engine.allocator.snapshot import Site, build_snapshot, write_snapshot
from simsp.engine.allocator.snapshot_read import read_snapshot

MiB, GiB = 1 << 20, 1 << 30
HIDDEN, LAYERS, BYTES = 4096, 32, 2  # a 7B-like model in bf16 on one GPU
SEQ_LENGTHS = (3584, 3968, 3712, 4096, 3840, 4032)  # tokens per micro-batch, in turn
ACTIVATIONS = (("qkv", 3), ("attn_out", 1), ("fc1", 4), ("gelu", 4), ("fc2_in", 1))  # x hidden


def training_stream(target_events: int) -> list:
    """Alloc/Free events of a training-like run until there are `target_events` of them."""
    events: list = []
    for layer in range(LAYERS):
        events.append(Alloc(("w", layer), 12 * HIDDEN * HIDDEN * BYTES,
                            context=Site((f"layers.{layer}",), "weights")))
    step = 0
    while len(events) < target_events:
        tokens = SEQ_LENGTHS[step % len(SEQ_LENGTHS)]
        _micro_batch(events, step, tokens)
        step += 1
    return events[:target_events]


def _micro_batch(events: list, step: int, tokens: int) -> None:
    """One micro-batch's forward and backward, appended to `events`."""
    time_s = len(events) * 1e-6
    for layer in range(LAYERS):
        for name, width in ACTIVATIONS:
            site = Site((f"layers.{layer}", name), "activations")
            events.append(Alloc((step, layer, name), tokens * width * HIDDEN * BYTES, 0, time_s, site))
        events.append(Alloc((step, layer, "tmp"), tokens * HIDDEN * 4, 0, time_s))
        events.append(Free((step, layer, "tmp"), time_s))
    for layer in reversed(range(LAYERS)):
        events.append(Alloc((step, layer, "dgrad"), tokens * 4 * HIDDEN * BYTES, 1, time_s))
        for name, _ in reversed(ACTIVATIONS):
            events.append(Free((step, layer, name), time_s))
        events.append(Free((step, layer, "dgrad"), time_s))


def _measure(events: list, conf: str) -> None:
    """Replay once and print the timing and the figures."""
    config = parse_alloc_conf(conf, 80 * GiB)
    start = time.process_time()
    timeline = replay(events, config).timeline
    spent = time.process_time() - start
    peak_segments = segments_at(events, config, timeline.allocated_peak_index)
    print(f"{conf or '(defaults)':<28}{len(events):>9}{spent:>8.2f}{1e6 * spent / len(events):>8.2f}"
          f"{timeline.reserved_peak / GiB:>10.2f}{timeline.allocated_peak / GiB:>10.2f}"
          f"{timeline.fragmentation_at_peak / GiB:>10.2f}{len(peak_segments):>7}")


def _snapshot_round_trip(events: list, conf: str) -> None:
    """Write the snapshot of a replay with its trace, read it back, print sizes and seconds."""
    run = replay(events, parse_alloc_conf(conf, 80 * GiB), record_trace=True)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "snapshot.pickle")
        start = time.process_time()
        write_snapshot(path, build_snapshot(run.allocator))
        written = time.process_time() - start
        start = time.process_time()
        snapshot = read_snapshot(path)
        read = time.process_time() - start
        print(f"snapshot of {len(events)} events: {os.path.getsize(path) / MiB:.1f} MiB, "
              f"{len(snapshot['device_traces'][0])} trace entries, written in {written:.2f} s, "
              f"read and checked in {read:.2f} s")


def main() -> None:
    """Parse the flags, build the stream, time the replays and the snapshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--alloc-conf", default=None, help="one PYTORCH_CUDA_ALLOC_CONF to time")
    parser.add_argument("--snapshot-events", type=int, default=100_000)
    args = parser.parse_args()
    events = training_stream(args.events)
    confs = [args.alloc_conf] if args.alloc_conf is not None else ["", "expandable_segments:True"]
    print(f"{'PYTORCH_CUDA_ALLOC_CONF':<28}{'events':>9}{'cpu s':>8}{'us/ev':>8}"
          f"{'rsv GiB':>10}{'alloc GiB':>10}{'frag GiB':>10}{'segs':>7}")
    for conf in confs:
        _measure(events, conf)
    _snapshot_round_trip(events[:args.snapshot_events], confs[0])


if __name__ == "__main__":
    main()
