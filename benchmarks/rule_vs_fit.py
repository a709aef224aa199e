"""The compute rule's A100 prediction against the fitted A100 model on K22 Table 4.

    python benchmarks/rule_vs_fit.py

The rule (simsp.hardware.constants.rule_calibration, docs/hardware.md) derives a GPU's compute model from
its datasheet peak, HBM bandwidth and measured large-GEMM ceiling alone; the A100 profile's
[compute] section holds the model fitted on Table 4 itself (benchmarks/calibrate_table4.py).
Prints both tables and their rms and worst errors over the ten times. Nothing is fitted here.
"""

import math

from table4 import markdown, simulate_table

from simsp.hardware.costmodel import calibration
from simsp.hardware.constants import A100_COMPUTE, rule_calibration
from simsp.hardware.profiles import gpu_profile


def errors(rows) -> list[float]:
    """The ten relative errors (forward and backward of each row)."""
    return [sim / pub - 1 for _, fwd, bwd, pub_fwd, pub_bwd in rows
            for sim, pub in ((fwd, pub_fwd), (bwd, pub_bwd))]


def summary(name: str, rows) -> str:
    errs = errors(rows)
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    return f"{name}: rms {100 * rms:.2f}%, worst {100 * max(errs, key=abs):+.2f}%"


def main() -> None:
    gpu = gpu_profile("a100-sxm-80gb")
    rule = rule_calibration(gpu.peak_flops, gpu.ceiling_flops, gpu.hbm_bandwidth_Bps)
    print(f"rule:   {rule.describe()}")
    print(f"fitted: {A100_COMPUTE.describe()}\n")
    with calibration(A100_COMPUTE):
        fitted_rows = simulate_table()
    with calibration(rule):
        rule_rows = simulate_table()
    print("## fitted A100 model (K22 Table 4 is its training data)\n")
    print(markdown(fitted_rows) + "\n")
    print("## rule from datasheet + MAMF ceiling (no Table 4 input)\n")
    print(markdown(rule_rows) + "\n")
    print(summary("fitted", fitted_rows))
    print(summary("rule", rule_rows))


if __name__ == "__main__":
    main()
