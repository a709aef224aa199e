"""K22 Table 4 on the simulator: one 22B layer's forward and backward times, five configurations.

    python benchmarks/table4.py

Runs `simulate_layer` in meta mode on the 8 ranks of one TP group and prints markdown: simulated
vs published milliseconds, where the time goes on rank 0, the 175B layer (not fitted), and every
constant of the cost model and of the link calibration.
"""

from collections import defaultdict

from simsp.scenario.loading import load_scenario
from simsp.hardware.costmodel import active_calibration
from simsp.hardware.constants import LinkCalibration
from simsp.training.driver.layer_sim import simulate_layer

# (experiment, sequence parallel, recompute granularity, published forward ms, backward ms);
# K22 Table 4, 22B model, t = 8 (docs/MODEL.md#paper-layouts)
EXPERIMENTS = [
    ("TP, no recompute", False, "none", 7.7, 11.9),
    ("TP + SP", True, "none", 7.2, 11.8),
    ("TP, full recompute", False, "full", 7.7, 19.5),
    ("TP, selective recompute", False, "selective", 7.7, 13.2),
    ("TP + SP + selective", True, "selective", 7.2, 13.1),
]
# One layer of the paper's models (docs/MODEL.md#paper-layouts): h, a, s, micro-batch b, t, v
MODEL_22B = dict(hidden_size=6144, num_attention_heads=64, seq_length=2048, micro_batch_size=4)
MODEL_175B = dict(hidden_size=12288, num_attention_heads=96, seq_length=2048, micro_batch_size=1)
TP, VOCAB = 8, 51200


def scenario(model: dict, sp: bool, recompute: str):
    """A meta-mode one-layer scenario of `model` on t = 8 with SP and recompute as given."""
    overrides = {("model", "num_layers"): 1, ("model", "vocab_size"): VOCAB,
                 ("parallel", "tensor_model_parallel_size"): TP,
                 ("parallel", "sequence_parallel"): sp,
                 ("parallel", "recompute_granularity"): recompute, ("run", "mode"): "meta"}
    for key, value in model.items():
        section = "parallel" if key == "micro_batch_size" else "model"
        overrides[(section, key)] = value
    return load_scenario(None, overrides)


def simulate_ms(model: dict, sp: bool, recompute: str) -> tuple[float, float]:
    """(forward ms, backward ms) of one layer: the slowest rank's pass times."""
    result = simulate_layer(scenario(model, sp, recompute))
    return result.forward_time_s * 1e3, result.backward_time_s * 1e3


def simulate_table(model: dict = MODEL_22B) -> list[tuple]:
    """[(experiment, simulated fwd ms, bwd ms, published fwd ms, bwd ms)] for the five rows."""
    rows = []
    for name, sp, recompute, fwd, bwd in EXPERIMENTS:
        rows.append((name, *simulate_ms(model, sp, recompute), fwd, bwd))
    return rows


def error_pct(simulated: float, published: float) -> float:
    """Signed relative error in percent."""
    return 100 * (simulated / published - 1)


def markdown(rows: list[tuple]) -> str:
    """Simulated vs published, forward / backward / total, with signed errors."""
    lines = ["| experiment | sim fwd | sim bwd | sim total | K22 fwd | K22 bwd | K22 total "
             "| err fwd | err bwd | err total |", "|---" * 10 + "|"]
    for name, fwd, bwd, pub_fwd, pub_bwd in rows:
        total, pub_total = fwd + bwd, pub_fwd + pub_bwd
        lines.append(f"| {name} | {fwd:.2f} | {bwd:.2f} | {total:.2f} | {pub_fwd} | {pub_bwd} "
                     f"| {pub_total:.1f} | {error_pct(fwd, pub_fwd):+.1f}% "
                     f"| {error_pct(bwd, pub_bwd):+.1f}% | {error_pct(total, pub_total):+.1f}% |")
    return "\n".join(lines)


def breakdown(model: dict, sp: bool, recompute: str) -> dict:
    """Rank 0's milliseconds per (pass, what): GEMM, memory-bound kernels, exposed communication
    (pass time minus compute time); recompute kernels are counted in the backward pass."""
    result = simulate_layer(scenario(model, sp, recompute))
    busy = defaultdict(float)
    for span in result.ranks[0].trace.spans_of(0, "compute"):
        side = "forward" if span.args["phase"] == "forward" else "backward"
        busy[side, span.args["kind"]] += span.duration_s * 1e3
        if span.args["phase"] == "recompute":
            busy["recompute", "all"] += span.duration_s * 1e3
    wall = {"forward": result.forward_time_s * 1e3, "backward": result.backward_time_s * 1e3}
    for side in wall:
        busy[side, "exposed comm"] = wall[side] - busy[side, "gemm"] - busy[side, "elementwise"]
    return busy


def breakdown_markdown(model: dict = MODEL_22B) -> str:
    """Where the time goes on rank 0, per experiment (ms)."""
    lines = ["| experiment | fwd GEMM | fwd mem-bound | fwd exposed comm | bwd GEMM "
             "| bwd mem-bound | bwd exposed comm | of which recompute |", "|---" * 8 + "|"]
    for name, sp, recompute, _, _ in EXPERIMENTS:
        b = breakdown(model, sp, recompute)
        cells = [b[side, what] for side in ("forward", "backward")
                 for what in ("gemm", "elementwise", "exposed comm")]
        cells.append(b["recompute", "all"])
        lines.append(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    rows = simulate_table()
    print("## K22 Table 4: 22B layer (h 6144, a 64, s 2048, b 4, t 8), milliseconds\n")
    print(markdown(rows))
    print("\n## Where the time goes (rank 0, ms)\n")
    print(breakdown_markdown())
    print("\n## 175B layer (h 12288, a 96, s 2048, b 1, t 8), not part of the fit\n")
    print("| experiment | sim fwd | sim bwd | sim total |\n|---|---|---|---|")
    for name, sp, recompute, _, _ in EXPERIMENTS:
        fwd, bwd = simulate_ms(MODEL_175B, sp, recompute)
        print(f"| {name} | {fwd:.2f} | {bwd:.2f} | {fwd + bwd:.2f} |")
    print(f"\ncompute: {active_calibration().describe()}")
    print(f"links: {LinkCalibration().describe()}")


if __name__ == "__main__":
    main()
