"""`simsp probe gemm`: time GEMMs on this machine's GPU (PyTorch + CUDA) and write the CSV that
`simsp calibrate gemm` fits.

    simsp probe gemm [SCENARIO] [flags] [--out FILE.csv] [--attention-out FILE.csv] [--repeats N]

Times the linear-layer GEMMs of the scenario's layer on one TP rank (QKV, attention projection,
fc1, fc2: forward shapes; the backward ones are their transposes) and a sweep of square sizes
256..16384, in BF16 and, where the GPU has FP8 tensor cores, in FP8 (torch._scaled_mm, E4M3).
Each time is the median of --repeats CUDA-event timings after warm-up. The CSV starts with
comment lines naming the GPU, driver, CUDA and PyTorch versions and the date. Then the fused
attention kernels through PyTorch's scaled_dot_product_attention, each backend present
(FlashAttention-2: SDPBackend.FLASH_ATTENTION; cuDNN: SDPBackend.CUDNN_ATTENTION), forward and
forward + backward, at the published benchmarks' shape (16k tokens, 16 heads of 128, no mask;
docs/attention_kernels.md) and the scenario layer's (causal) on one TP rank, into
--attention-out (`simsp calibrate gemm --attention` turns it into the profile's [attention]
figures). Where PyTorch or a CUDA GPU is missing: one `error:` line, exit 2.
"""

import datetime
import statistics

from simsp.calibrate.attention_fit import ATTENTION_BACKENDS, ATTENTION_HEADER
from simsp.errors import UserError
from simsp.hardware.attention_kernels import REFERENCE_HEAD_DIM, REFERENCE_HEADS, REFERENCE_SEQ
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
    gemm.add_argument("--attention-out", type=nonempty, default="attention-probe.csv",
                      help="CSV of the attention kernels' times (default attention-probe.csv)")
    gemm.add_argument("--repeats", type=int, default=20, help="timed runs per shape (median)")
    gemm.set_defaults(handler=run)


def layer_shapes(sc) -> list[tuple[str, int, int, int]]:
    """(label, m, k, n) of one TP rank's linear GEMMs in one layer's forward (Megatron's
    column/row-parallel split: QKV and fc1 split n, projection and fc2 split k)."""
    m = sc.parallel.micro_batch_size * sc.model.seq_length
    h, t, ffn = sc.model.hidden_size, sc.parallel.tp, sc.model.ffn
    return [("qkv", m, h, 3 * h // t), ("proj", m, h // t, h), ("fc1", m, h, ffn // t),
            ("fc2", m, ffn // t, h)]


def attention_shapes(sc) -> list[tuple]:
    """(label, batch, heads, kv_heads, seq, head_dim, causal) of the attention calls probed: the
    published benchmarks' shape and one TP rank's share of the scenario layer's (causal)."""
    t, model = sc.parallel.tp, sc.model
    layer = (sc.parallel.micro_batch_size, model.num_attention_heads // t,
             max(1, model.query_groups // t), model.seq_length, model.head_dim, True)
    return [("reference", 1, REFERENCE_HEADS, REFERENCE_HEADS, REFERENCE_SEQ,
             REFERENCE_HEAD_DIM, False), ("layer", *layer)]


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


def _attention(torch, backend: str, shape: tuple, backward: bool, device: str = "cuda"):
    """A callable running one SDPA call (forward, or forward + backward) on `backend`."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention
    batch, heads, kv_heads, seq, dim, causal = shape
    def tensor(n):
        return torch.randn(batch, n, seq, dim, device=device, dtype=torch.bfloat16,
                           requires_grad=backward)
    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    def forward():
        with sdpa_kernel(getattr(SDPBackend, ATTENTION_BACKENDS[backend])):
            return scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                enable_gqa=kv_heads != heads)
    if not backward:
        return forward
    grad = torch.randn(batch, heads, seq, dim, device=device, dtype=torch.bfloat16)
    return lambda: forward().backward(grad)


def attention_lines(torch, sc, repeats: int, device: str = "cuda") -> list[str]:
    """The attention CSV's data lines: per backend that runs here and shape, the forward and
    the backward (forward + backward less forward) seconds; a backend this GPU or PyTorch
    lacks is left out, named in a comment line."""
    lines = []
    for backend in ATTENTION_BACKENDS:
        for label, *shape in attention_shapes(sc):
            try:
                calls = [_attention(torch, backend, tuple(shape), grad, device)
                         for grad in (False, True)]
                forward, both = (_time(torch, call, repeats) for call in calls)
            except RuntimeError as exc:  # no such kernel for this GPU, dtype or shape
                lines.append(f"# {backend} {label}: not run ({str(exc).splitlines()[0][:120]})")
                continue
            fields = ",".join(str(int(x)) for x in shape)
            lines += [f"{backend},fwd,{fields},{forward!r},{label}",
                      f"{backend},bwd,{fields},{max(both - forward, 1e-9)!r},{label}"]
    return lines


def run(args) -> int:
    """Time every shape in BF16 (and FP8 where supported), write the CSV."""
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise UserError("--repeats", f"must be in [1, {MAX_REPEATS}], got {args.repeats}")
    check_out_file(args.out, "--out", [args.scenario])  # before any GPU work
    check_out_file(args.attention_out, "--attention-out", [args.scenario, args.out])
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
    attention = [lines[0], ATTENTION_HEADER] + attention_lines(torch, sc, args.repeats)
    write_file(args.attention_out, "\n".join(attention) + "\n")
    print("\n".join(attention[2:]) + f"\nwrote {args.attention_out}")
    return 0
