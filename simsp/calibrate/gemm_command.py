"""`simsp calibrate gemm FILE`: fit a GPU profile's GEMM parameters to measured GEMM times.

    simsp calibrate gemm FILE --gpu NAME [--attention FILE] [--out FRAGMENT.toml] [--json]

FILE is `simsp probe gemm`'s CSV (dtype, m, k, n, seconds[, label]). Per dtype (bf16, fp8) the
fit (simsp/calibrate/gemm_fit.py) gives the GEMM ceiling, the operand bandwidth and the launch
overhead; printed as measured vs model per shape, then written as a [compute] / [compute_fp8]
fragment to paste into a copy of the GPU's profile (`--gpu` names the peaks it is relative to).
With --attention (the probe's attention CSV) the fragment adds the [attention] figures: each
kernel's TFLOP/s at the published shape, and the tiled model's time for every measured shape
beside the measurement (simsp/calibrate/attention_fit.py).
"""

from pathlib import Path

from simsp.calibrate.attention_fit import (attention_figures, attention_fragment, model_checks,
                                           read_attention_csv)
from simsp.calibrate.gemm_fit import compute_section, fit_all, fragment, read_probe_csv
from simsp.errors import UserError
from simsp.scenario.flags import nonempty
from simsp.io_out import check_out_file, write_file
from simsp.jsonout import dumps
from simsp.hardware.constants import compute_for
from simsp.hardware.profiles import gpu_profile


def add_parser(sources) -> None:
    """Register `simsp calibrate gemm` under `simsp calibrate`."""
    gemm = sources.add_parser("gemm", help="fit GEMM parameters to `simsp probe gemm` CSV",
                              description=__doc__.split("\n\n")[0])
    gemm.add_argument("file", type=nonempty, metavar="FILE", help="probe CSV")
    gemm.add_argument("--gpu", type=nonempty, default="a100-sxm-80gb",
                      help="GPU profile whose peaks the fit is relative to (default a100-sxm-80gb)")
    gemm.add_argument("--attention", metavar="FILE", type=nonempty, default=None,
                      help="`simsp probe gemm`'s attention CSV: add the [attention] figures")
    gemm.add_argument("--out", metavar="FRAGMENT.toml", type=nonempty, default=None,
                      help="write the fragment here instead of stdout")
    gemm.add_argument("--json", action="store_true", help="one JSON object")
    gemm.set_defaults(handler=run)


def run(args) -> int:
    """Read, fit per dtype, print measured vs model per shape and the fragment."""
    if args.out:
        check_out_file(args.out, "--out", [args.file, args.attention])  # never an input
    gpu = gpu_profile(args.gpu)
    fits = fit_all(read_probe_csv(args.file), args.file)
    sections = {}
    for dtype, fit in fits.items():
        peak = gpu.peak_flops if dtype == "bf16" else gpu.peak_fp8_flops
        if peak is None:
            raise UserError("--gpu", f"{gpu.name} has no FP8 peak but the file has fp8 rows")
        if fit.ceiling_flops > peak:  # a profile's efficiency is at most 1 (simsp/hardware/profile_file.py)
            raise UserError("--gpu", f"the fitted {dtype} ceiling {fit.ceiling_flops / 1e12:.1f} "
                                     f"TFLOP/s is above {gpu.name}'s peak {peak / 1e12:.1f}: were "
                                     "the measurements taken on another GPU?")
        name = "compute" if dtype == "bf16" else "compute_fp8"
        rms = float((fit.relative_errors() ** 2).mean() ** 0.5)
        sections[name] = compute_section(fit, peak, f"simsp calibrate gemm {Path(args.file).name}: "
                                                    f"{len(fit.rows)} {dtype} shapes, rms {100 * rms:.2f}%")
    text = fragment(sections)
    attention, checks = _attention(args, gpu) if args.attention else ("", [])
    text += ("\n" if text and attention else "") + attention
    if args.out:
        write_file(args.out, text)
    if args.json:
        print(dumps({"gpu": gpu.name, "fits": {d: _fit_doc(f) for d, f in fits.items()},
                     "attention": [_check_doc(row, model) for row, model in checks],
                     "fragment": text}))
        return 0
    for dtype, fit in fits.items():
        print("\n".join(_table(fit)) + "\n")
    if checks:
        print("\n".join(_attention_table(checks)) + "\n")
    print(f"fragment: {args.out}" if args.out else text, end="" if not args.out else "\n")
    return 0


def _attention(args, gpu) -> tuple:
    """The [attention] fragment from the probe's attention CSV, and (row, model seconds) per
    measured call."""
    if "sm_count" not in gpu.attention:
        raise UserError("--gpu", f"{gpu.name} has no [attention] sm_count (the attention "
                                 f"model's waves need the GPU's SMs)")
    rows = read_attention_csv(args.attention)
    figures = attention_figures(rows, args.attention)
    checks = model_checks(rows, figures, gpu, compute_for(args.gpu))
    source = (f"simsp calibrate gemm --attention {Path(args.attention).name}: measured at the "
              f"published shape (16k tokens, 16 heads of 128, no mask)")
    return attention_fragment(figures, int(gpu.attention["sm_count"]), source), checks


def _check_doc(row, model: float) -> dict:
    shape = row.shape
    return {"kernel": row.kernel, "direction": row.direction, "label": row.label,
            "batch": shape.batch, "heads": shape.heads, "kv_heads": shape.kv_heads,
            "seq": shape.s_q, "head_dim": shape.d_qk, "causal": shape.causal,
            "measured_s": row.seconds, "model_s": model}


def _attention_table(checks: list) -> list[str]:
    lines = ["# attention: measured vs the tiled model with the fitted figures",
             f"# {'kernel':<6} {'dir':<4} {'label':<10} {'b':>3} {'heads':>5} {'kv':>4} "
             f"{'seq':>6} {'d':>4} {'causal':>6} {'measured us':>12} {'model us':>12} {'error':>8}"]
    for row, model in checks:
        s = row.shape
        lines.append(f"  {row.kernel:<6} {row.direction:<4} {row.label[:10]:<10} {s.batch:>3} "
                     f"{s.heads:>5} {s.kv_heads:>4} {s.s_q:>6} {s.d_qk:>4} {int(s.causal):>6} "
                     f"{row.seconds * 1e6:>12.2f} {model * 1e6:>12.2f} "
                     f"{100 * (model / row.seconds - 1):>+7.2f}%")
    return lines


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
