"""Fuzzing every input file type beyond scenarios, in-process, as tests/test_fuzz_cli.py fuzzes
scenarios: random sweep files, measurement files (CSV and TOML) and nccl-tests logs, valid and
broken (wrong types, nan/inf, huge numbers, duplicated and missing lines, control characters,
unknown keys). Whatever the input: no traceback, no hang (seconds per example), and either exit
0 or exit 2 with exactly one `error:` line; nothing written outside the chosen folder."""

import json
from pathlib import Path
import tempfile
import time

from hypothesis import HealthCheck, given, settings, strategies as st

from inprocess import cli

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "scenarios" / "tiny.toml")
SECONDS = 30  # per example: a guard against a hang, far above any example's time
FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

GOOD = {"num_layers": st.sampled_from([2, 4]), "micro_batch_size": st.sampled_from([1, 2]),
        "global_batch_size": st.sampled_from([4, 8]), "sequence_parallel": st.booleans(),
        "recompute_granularity": st.sampled_from(["none", "selective", "full"]),
        "seed": st.integers(0, 9), "ib_bandwidth_GBps": st.sampled_from([12.5, 25, 50.0]),
        "parallel.schedule": st.sampled_from(["gpipe", "1f1b"])}
VALUES = st.one_of(
    st.integers(-2, 9), st.sampled_from([10**30, 2**63, 0.5, 1e-300]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.sampled_from(["none", "meta", "numeric", "full", "selective", "", "x\ny", "<b>", "nul\x00"]),
    st.lists(st.integers(0, 3), max_size=2))
SWEEP_KEYS = ["num_layers", "hidden_size", "micro_batch_size", "global_batch_size",
              "tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
              "recompute_granularity", "mode", "seed", "ib_bandwidth_GBps", "parallel.schedule",
              "num_layers_per_virtual_pipeline_stage", "hiden_size", "model.nope", "base", "name"]


def toml_value(value) -> str:
    """A TOML literal (nan/inf as TOML spells them; strings JSON-escaped, valid TOML too)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and abs(value) == float("inf"):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def outcome_ok(argv, rc, out, err) -> None:
    """No traceback; exit 0, or exit 2 with one `error:` line and nothing on stdout."""
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if rc == 2:
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    else:
        assert rc == 0, (argv, rc, err)


def run_in(folder: Path, argv: list[str]):
    """cli() with a guard on its time; returns (rc, out, err)."""
    start = time.perf_counter()
    rc, out, err = cli(argv)
    assert time.perf_counter() - start < SECONDS, argv
    return rc, out, err


def escapes(folder: Path, before: set, allowed: Path) -> set:
    return {p for p in folder.rglob("*") if p not in before and allowed not in (p, *p.parents)}


@st.composite
def sweep_text(draw) -> str:
    """A sweep file: a tiny meta base, then 1-3 variants of random (often bad) overrides."""
    lines = [f"base = {json.dumps(TINY)}" if draw(st.integers(0, 5)) < 5 else
             f"base = {toml_value(draw(VALUES))}"]
    for index in range(draw(st.sampled_from([1, 1, 2, 3, 0]))):
        lines.append("[[variant]]")
        lines.append(f"name = {toml_value(draw(st.sampled_from([f'v{index}'] * 6 + ['v0', 5, ''])))}")
        lines.append('mode = "meta"')
        for key in draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=3, unique=True)):
            lines.append(f"{key} = {toml_value(draw(GOOD[key]))}")  # valid values
        if draw(st.integers(0, 2)) == 2:  # and, one variant in three, a random key and value
            lines.append(f"{draw(st.sampled_from(SWEEP_KEYS))} = {toml_value(draw(VALUES))}")
    if draw(st.integers(0, 8)) == 8:
        lines.append(draw(st.sampled_from(["[oops", "x = ", "variant = 3", "\x00", "[[variant]]"])))
    return "\n".join(lines) + "\n"


LIST_FLAGS = st.sampled_from([[], [], [], ["--micro-batch-size", "1,2"], ["--seed", "1,,2"],
                              ["--recompute-granularity", "none,full"], ["--num-layers", "x"],
                              ["--ib-bandwidth-GBps", "inf,25"], ["--hidden-dropout", "nan"]])


@settings(FUZZ, max_examples=20)  # each valid example runs a sweep: fewer, for the suite's time
@given(sweep_text(), LIST_FLAGS)
def test_random_sweep_files(text, flags):
    with tempfile.TemporaryDirectory() as base:
        base = Path(base)
        (base / "s.toml").write_text(text, encoding="utf-8", errors="surrogatepass")
        before = set(base.rglob("*"))
        argv = ["sweep", str(base / "s.toml"), *flags, "--workers", "0", "--quiet", "--out",
                str(base / "out")]
        rc, out, err = run_in(base, argv)
        outcome_ok(argv, rc, out, err)
        if rc == 0:
            rows = (base / "out" / "results.jsonl").read_text().splitlines()
            assert all(json.loads(row, parse_constant=lambda c: 1 / 0) for row in rows)
        assert not escapes(base, before, base / "out")


MEASUREMENT = {"name": "tiny", "scenario": "", "flags": "--mode meta",
               "metric": "iteration_time", "measured": 0.01, "unit": "s"}
MEASUREMENT_VALUES = st.one_of(
    VALUES, st.sampled_from(["--seq 8 --mode meta", "--mode meta --mode meta", "--mode",
                             "iteration_time", "peak_memory", "busbw", "GiB", "ms", "tiny.toml",
                             "../escape.toml", "all_reduce", "1M", "'unclosed"]))


@st.composite
def measurement_file(draw) -> tuple[str, str]:
    """(suffix, text): a CSV or TOML file of 1-3 rows from a valid one, fields mutated."""
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        row = dict(MEASUREMENT)
        for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
            key = draw(st.sampled_from(list(MEASUREMENT) + ["group", "baseline", "size",
                                                            "collective", "extra"]))
            row[key] = draw(MEASUREMENT_VALUES)
        if draw(st.integers(0, 6)) == 6:
            row.pop(draw(st.sampled_from(list(row))))
        rows.append(row)
    if draw(st.booleans()):
        return ".toml", "".join("[[measurement]]\n" + "".join(
            f"{k} = {toml_value(v)}\n" for k, v in row.items()) for row in rows)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cell = lambda v: '"' + str(v).replace('"', '""') + '"'  # noqa: E731
    return ".csv", ",".join(columns) + "\n" + "".join(
        ",".join(cell(row.get(c, "")) for c in columns) + "\n" for row in rows)


@FUZZ
@given(measurement_file(), st.sampled_from([[], ["--json"], [], ["--json"], ["--only", "m"],
                                            ["--only", "x,"]]))
def test_random_measurement_files(made, flags):
    suffix, text = made
    with tempfile.TemporaryDirectory() as base:
        base = Path(base)
        (base / "tiny.toml").write_text((REPO / "scenarios" / "tiny.toml").read_text())
        (base / f"m{suffix}").write_text(text, encoding="utf-8", errors="surrogatepass")
        before = set(base.rglob("*"))
        argv = ["validate", str(base / f"m{suffix}"), "--quiet", *flags]
        rc, out, err = run_in(base, argv)
        outcome_ok(argv, rc, out, err)
        if rc == 0 and "--json" in flags:
            json.loads(out, parse_constant=lambda c: 1 / 0)
        assert not escapes(base, before, base / "none")


LOG_LINES = [
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 4(factor) warmup iters: 5 iters: 20",
    "#  Rank  0 Group  0 Pid  1 on nodeA device  0 [0x07] NVIDIA A100-SXM4-80GB",
    "#  Rank  1 Group  0 Pid  2 on nodeA device  1 [0x0b] NVIDIA A100-SXM4-80GB",
    "#  Rank  2 Group  0 Pid  3 on nodeB device  0 [0x07] NVIDIA A100-SXM4-80GB",
    "#  Rank  3 Group  0 Pid  4 on nodeB device  1 [0x0b] NVIDIA A100-SXM4-80GB",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
    "time   algbw   busbw #wrong",
    "           8             2     float     sum      -1    12.00    0.00    0.00      0    "
    "12.00    0.00    0.00      0",
    "        4096          1024     float     sum      -1    20.00    0.20    0.31      0    "
    "20.00    0.20    0.31      0",
    "     1048576        262144     float     sum      -1   150.00    6.99   10.49      0   "
    "150.00    6.99   10.49      0",
    "# Avg bus bandwidth    : 3.6",
]
MUTATIONS = st.sampled_from(["keep"] * 24 + ["drop", "twice", "garbage", "number", "nul", "long"])


@st.composite
def nccl_log(draw) -> str:
    """The 4-rank, 2-node all_reduce log above, each line kept, dropped, doubled or mangled."""
    lines = []
    for line in LOG_LINES:
        mutation = draw(MUTATIONS)
        if mutation == "drop":
            continue
        if mutation == "twice":
            lines += [line, line]
        elif mutation == "garbage":
            lines.append(draw(st.text(max_size=40)))
        elif mutation == "number":
            words = line.split(" ")
            spot = draw(st.integers(0, len(words) - 1))
            words[spot] = draw(st.sampled_from(["-1", "0", "nan", "inf", "1e400", str(10**30),
                                                "\u0661", "x"]))
            lines.append(" ".join(words))
        elif mutation == "nul":
            lines.append(line + "\x00")
        elif mutation == "long":
            lines.append(line + " " + "9" * 5000)
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


@FUZZ
@given(nccl_log(), st.sampled_from([[], ["--json"], ["--out", "OUT"], [], ["--json"], ["--out", "LOG"],
                                    ["--nodes", "2", "--gpus-per-node", "2"],
                                    ["--collective", "all_gather"], ["--gpus-per-node", "0"]]))
def test_random_nccl_tests_logs(text, flags):
    with tempfile.TemporaryDirectory() as base:
        base = Path(base)
        log = base / "log.txt"
        log.write_text(text, encoding="utf-8", errors="surrogatepass")
        before = set(base.rglob("*"))
        flags = [str(base / "out" / "f.toml") if f == "OUT" else str(log) if f == "LOG" else f
                 for f in flags]
        (base / "out").mkdir()
        argv = ["calibrate", "nccl-tests", str(log), *flags]
        rc, out, err = run_in(base, argv)
        outcome_ok(argv, rc, out, err)
        if rc == 0 and "--json" in flags:
            json.loads(out, parse_constant=lambda c: 1 / 0)
        assert log.read_text(encoding="utf-8", errors="surrogatepass") == text
        assert not escapes(base, before, base / "out")


PROFILES = REPO / "simsp" / "hardware/data"
PROFILE_VALUES = st.one_of(VALUES, st.sampled_from(['{ value = 8, source = "s" }', "HDR"]))


@st.composite
def profile_text(draw) -> tuple[str, str]:
    """(kind, text): a bundled GPU or system profile, a few lines dropped, doubled or given a
    random value (wrong types, nan/inf, huge, 0, control characters) or a misspelt key."""
    kind = draw(st.sampled_from(["gpu", "system"]))
    source = PROFILES / ("gpus/h100-sxm-80gb.toml" if kind == "gpu" else "systems/dgx-h100.toml")
    lines = []
    for line in source.read_text().splitlines():
        key = line.split(" = ", 1)[0]
        mutation = draw(st.sampled_from(["keep"] * 8 + ["drop", "twice", "value", "inner", "key"]))
        if mutation == "drop":
            continue
        if mutation == "value" and " = " in line:
            line = f"{key} = {toml_value(draw(VALUES))}"
        elif mutation == "inner" and "value = " in line:
            line = f'{key} = {{ value = {toml_value(draw(VALUES))}, source = "fuzz" }}'
        elif mutation == "key" and " = " in line:
            line = f"{key}x = {line.split(' = ', 1)[1]}"
        lines += [line, line] if mutation == "twice" else [line]
    if draw(st.integers(0, 4)) == 4:
        lines.append(draw(st.sampled_from(["[compute]", "compute = 5", "aliases = [1]",
                                           "[compute]\ngemm_max_efficiency = 2"])))
    return kind, "\n".join(lines) + "\n"


@FUZZ
@given(profile_text(), st.sampled_from([["hardware", "PATH", "--json"], ["hardware", "PATH"],
                                        ["layer", "--KIND", "PATH", "--mode", "meta", "--json"]]))
def test_random_hardware_profiles(made, argv):
    kind, text = made
    with tempfile.TemporaryDirectory() as base:
        path = Path(base) / "profile.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        argv = [str(path) if a == "PATH" else f"--{kind}" if a == "--KIND" else a for a in argv]
        rc, out, err = run_in(Path(base), argv)
        outcome_ok(argv, rc, out, err)
        if rc == 0 and "--json" in argv:
            json.loads(out, parse_constant=lambda c: 1 / 0)


PROBE_FIELDS = st.one_of(st.sampled_from(["bf16", "fp8", "fp16", "", "8", "1024", "0", "-8",
                                          "1_024", "1e3", "nan", "inf", "1e-5", "2e-3",
                                          str(10**30), "\u0661", "x", '"a,b"', "a\x00"]),
                         st.text(max_size=6))


@st.composite
def probe_csv(draw) -> str:
    """A probe CSV: a valid header and 0-9 rows from a valid sweep, fields and lines mutated."""
    header = draw(st.sampled_from(["dtype,m,k,n,seconds,label"] * 8 + [
        "dtype,m,k,n,seconds", "dtype,m,k,n", "dtype,m,k,n,seconds,m", "dtype,m,k,n,seconds,x"]))
    lines = ["# probe", header]
    sizes = st.sampled_from([256, 512, 1024, 2048, 4096, 8192])
    for size in draw(st.lists(sizes, min_size=2, max_size=6, unique=True)):
        fields = ["bf16", str(size), str(size), str(size),  # 250 TFLOP/s: an A100's fit
                  repr(1e-5 + 2 * size**3 / 2.5e14 + 6 * size * size / 1.5e12), f"s{size}"]
        if draw(st.integers(0, 5)) == 5:
            fields[draw(st.integers(0, 5))] = draw(PROBE_FIELDS)
        if draw(st.integers(0, 19)) == 19:
            fields = fields[:draw(st.integers(0, 5))]
        lines.append(",".join(fields))
    return "\n".join(lines) + "\n"


@FUZZ
@given(probe_csv(), st.sampled_from([[], ["--json"], ["--gpu", "h100-sxm-80gb"],
                                     ["--gpu", "h100-sxm-80gb", "--out", "OUT"],
                                     ["--out", "IN"]]))
def test_random_probe_csvs(text, flags):
    with tempfile.TemporaryDirectory() as base:
        base = Path(base)
        probe = base / "probe.csv"
        probe.write_text(text, encoding="utf-8", errors="surrogatepass")
        (base / "out").mkdir()
        flags = [str(base / "out" / "f.toml") if f == "OUT" else str(probe) if f == "IN" else f
                 for f in flags]
        before = set(base.rglob("*"))
        argv = ["calibrate", "gemm", str(probe), *flags]
        rc, out, err = run_in(base, argv)
        outcome_ok(argv, rc, out, err)
        if rc == 0 and "--json" in flags:
            json.loads(out, parse_constant=lambda c: 1 / 0)
        if rc == 0 and "--out" in flags:
            import tomllib
            tomllib.loads((base / "out" / "f.toml").read_text())  # the fragment is valid TOML
        assert probe.read_text(encoding="utf-8", errors="surrogatepass") == text
        assert not escapes(base, before, base / "out")
