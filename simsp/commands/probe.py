"""`simsp probe gemm`: time GEMMs on this machine's GPU (PyTorch + CUDA) and write the CSV that
`simsp calibrate gemm` fits.

    simsp probe gemm [SCENARIO] [flags] [--out FILE.csv] [--repeats N]

Times the linear-layer GEMMs of the scenario's layer on one TP rank (QKV, attention projection,
fc1, fc2: forward shapes; the backward ones are their transposes) and a sweep of square sizes
256..16384, in BF16 and, where the GPU has FP8 tensor cores, in FP8 (torch._scaled_mm, E4M3).
Each time is the median of --repeats CUDA-event timings after warm-up. The CSV starts with
comment lines naming the GPU, driver, CUDA and PyTorch versions and the date. Where PyTorch or
a CUDA GPU is missing: one `error:` line, exit 2.
"""

import datetime
import statistics

from simsp.errors import UserError
from simsp.scenario.flags import add_scenario_arguments, nonempty
from simsp.scenario.outside import scenario_from_args
from simsp.io_out import check_out_file, write_file

SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_REPEATS = 1000  # timed runs per shape: 1000 x 14 shapes x 2 dtypes of a 16384^3 GEMM is minutes


def add_parser(subparsers) -> None:
    """Register `simsp probe gemm`."""
    parser = subparsers.add_parser("probe", help="measure this machine's GPU (GEMM times)",
                                   description=__doc__.split("\n\n")[0])
    kinds = parser.add_subparsers(dest="probe", required=True, parser_class=type(parser))
    gemm = kinds.add_parser("gemm", help="time GEMMs in BF16 and FP8, write a CSV",
                            description=__doc__.split("\n\n")[1])
    add_scenario_arguments(gemm)
    gemm.add_argument("--out", type=nonempty, default="gemm-probe.csv",
                      help="CSV to write (default gemm-probe.csv)")
    gemm.add_argument("--repeats", type=int, default=20, help="timed runs per shape (median)")
    gemm.set_defaults(handler=run)


def layer_shapes(sc) -> list[tuple[str, int, int, int]]:
    """(label, m, k, n) of one TP rank's linear GEMMs in one layer's forward (Megatron's
    column/row-parallel split: QKV and fc1 split n, projection and fc2 split k)."""
    m = sc.parallel.micro_batch_size * sc.model.seq_length
    h, t, ffn = sc.model.hidden_size, sc.parallel.tp, sc.model.ffn
    return [("qkv", m, h, 3 * h // t), ("proj", m, h // t, h), ("fc1", m, h, ffn // t),
            ("fc2", m, ffn // t, h)]


def _torch():
    try:
        import torch  # optional: only this command needs it
    except ImportError:
        raise UserError("probe", "needs PyTorch with a CUDA GPU (pip install torch); PyTorch "
                                 "is not installed here") from None
    if not torch.cuda.is_available():
        raise UserError("probe", "needs a CUDA GPU; PyTorch finds none here")
    return torch


def _time(torch, fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _gemm(torch, dtype: str, m: int, k: int, n: int):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        return lambda: a @ b.t()
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                    out_dtype=torch.bfloat16)


def run(args) -> int:
    """Time every shape in BF16 (and FP8 where supported), write the CSV."""
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise UserError("--repeats", f"must be in [1, {MAX_REPEATS}], got {args.repeats}")
    check_out_file(args.out, "--out", [args.scenario])  # before any GPU work
    sc = scenario_from_args(args)
    torch = _torch()
    capability = torch.cuda.get_device_capability()
    dtypes = ("bf16", "fp8") if capability >= (8, 9) else ("bf16",)
    shapes = layer_shapes(sc) + [(f"square{s}", s, s, s) for s in SWEEP]
    lines = [f"# simsp probe gemm on {torch.cuda.get_device_name()} (sm_{capability[0]}{capability[1]}), "
             f"CUDA {torch.version.cuda}, PyTorch {torch.__version__}, "
             f"{datetime.date.today().isoformat()}", "dtype,m,k,n,seconds,label"]
    for dtype in dtypes:
        for label, m, k, n in shapes:
            seconds = _time(torch, _gemm(torch, dtype, m, k, n), args.repeats)
            lines.append(f"{dtype},{m},{k},{n},{seconds!r},{label}")
            print(lines[-1])
    write_file(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0
