"""`simsp calibrate gemm FILE`: fit a GPU profile's GEMM parameters to measured GEMM times.

    simsp calibrate gemm FILE --gpu NAME [--out FRAGMENT.toml] [--json]

FILE is `simsp probe gemm`'s CSV (dtype, m, k, n, seconds[, label]). Per dtype (bf16, fp8) the
fit (simsp/calibrate/gemm_fit.py) gives the GEMM ceiling, the operand bandwidth and the launch
overhead; printed as measured vs model per shape, then written as a [compute] / [compute_fp8]
fragment to paste into a copy of the GPU's profile (`--gpu` names the peaks it is relative to).
"""

from pathlib import Path

from simsp.calibrate.gemm_fit import compute_section, fit_all, fragment, read_probe_csv
from simsp.errors import UserError
from simsp.scenario.flags import nonempty
from simsp.io_out import check_out_file, write_file
from simsp.jsonout import dumps
from simsp.hardware.profiles import gpu_profile


def add_parser(sources) -> None:
    """Register `simsp calibrate gemm` under `simsp calibrate`."""
    gemm = sources.add_parser("gemm", help="fit GEMM parameters to `simsp probe gemm` CSV",
                              description=__doc__.split("\n\n")[0])
    gemm.add_argument("file", type=nonempty, metavar="FILE", help="probe CSV")
    gemm.add_argument("--gpu", type=nonempty, default="a100-sxm-80gb",
                      help="GPU profile whose peaks the fit is relative to (default a100-sxm-80gb)")
    gemm.add_argument("--out", metavar="FRAGMENT.toml", type=nonempty, default=None,
                      help="write the fragment here instead of stdout")
    gemm.add_argument("--json", action="store_true", help="one JSON object")
    gemm.set_defaults(handler=run)


def run(args) -> int:
    """Read, fit per dtype, print measured vs model per shape and the fragment."""
    if args.out:
        check_out_file(args.out, "--out", [args.file])  # before any work; never the input
    gpu = gpu_profile(args.gpu)
    fits = fit_all(read_probe_csv(args.file), args.file)
    sections = {}
    for dtype, fit in fits.items():
        peak = gpu.peak_flops if dtype == "bf16" else gpu.peak_fp8_flops
        if peak is None:
            raise UserError("--gpu", f"{gpu.name} has no FP8 peak but the file has fp8 rows")
        if fit.ceiling_flops > peak:  # a profile's efficiency is at most 1 (simsp/hardware/profiles.py)
            raise UserError("--gpu", f"the fitted {dtype} ceiling {fit.ceiling_flops / 1e12:.1f} "
                                     f"TFLOP/s is above {gpu.name}'s peak {peak / 1e12:.1f}: were "
                                     "the measurements taken on another GPU?")
        name = "compute" if dtype == "bf16" else "compute_fp8"
        rms = float((fit.relative_errors() ** 2).mean() ** 0.5)
        sections[name] = compute_section(fit, peak, f"simsp calibrate gemm {Path(args.file).name}: "
                                                    f"{len(fit.rows)} {dtype} shapes, rms {100 * rms:.2f}%")
    text = fragment(sections)
    if args.out:
        write_file(args.out, text)
    if args.json:
        print(dumps({"gpu": gpu.name, "fits": {d: _fit_doc(f) for d, f in fits.items()},
                     "fragment": text}))
        return 0
    for dtype, fit in fits.items():
        print("\n".join(_table(fit)) + "\n")
    print(f"fragment: {args.out}" if args.out else text, end="" if not args.out else "\n")
    return 0


def _fit_doc(fit) -> dict:
    return {"ceiling_flops": fit.ceiling_flops, "memory_Bps": fit.memory_Bps,
            "launch_s": fit.launch_s,
            "rows": [{"label": r.label, "m": r.m, "k": r.k, "n": r.n, "measured_s": r.seconds,
                      "model_s": t} for r, t in zip(fit.rows, fit.model_s)]}


def _table(fit) -> list[str]:
    errors = fit.relative_errors()
    lines = [f"# {fit.dtype}: ceiling {fit.ceiling_flops / 1e12:.2f} TFLOP/s, operand bandwidth "
             f"{fit.memory_Bps / 1e12:.3f} TB/s, launch {fit.launch_s * 1e6:.2f} us",
             f"# {'label':<14} {'m':>7} {'k':>7} {'n':>7} {'measured us':>12} {'model us':>12} "
             f"{'error':>8} {'TFLOP/s':>8}"]
    for row, model, err in zip(fit.rows, fit.model_s, errors):
        lines.append(f"  {row.label[:14]:<14} {row.m:>7} {row.k:>7} {row.n:>7} "
                     f"{row.seconds * 1e6:>12.2f} {model * 1e6:>12.2f} {100 * err:>+7.2f}% "
                     f"{row.flops / row.seconds / 1e12:>8.1f}")
    lines.append(f"# rms error {100 * float((errors ** 2).mean() ** 0.5):.3f}%, worst "
                 f"{100 * float(abs(errors).max()):.3f}%")
    return lines
