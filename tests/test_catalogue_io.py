"""The catalogue of every command beyond `run` (sweep, search, calibrate, validate, ring): each
class of hostile or careless input a tester found ends in exactly one `error:` line (exit 2) in
seconds, or in the correct result; no traceback, no hang, no file written through a link."""

import json
import os
from pathlib import Path
import subprocess
import sys
import time

import pytest

from inprocess import cli

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
TINY = str(SCENARIOS / "tiny.toml")
SWEEP_TINY = ["sweep", TINY, "--mode", "meta", "--workers", "0", "--quiet"]
CPU_SECONDS = 10  # "in seconds": a guard against a hang or a loop, not a speed target
LOG = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  1 on nodeA device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  2 on nodeA device  1 [0x0b] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.00    0.00    0.00      0    10.00    0.00    0.00      0
        1024           256     float     sum      -1    11.00    0.09    0.09      0    11.00    0.09    0.09      0
# Avg bus bandwidth    : 0.05
"""


def assert_error(argv: list[str], field: str) -> str:
    """Exit 2, nothing on stdout, exactly one `error: <field>...` line, within seconds."""
    start = time.process_time()
    rc, out, err = cli(argv)
    assert time.process_time() - start < CPU_SECONDS
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"error: {field}") or err.startswith(f"error: argument {field}"), err
    return err


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def sweep_file(tmp_path: Path, body: str, name: str = "s.toml") -> str:
    return write(tmp_path / name, f'base = "{TINY}"\n{body}')


# --- tracebacks: sweep files of the wrong shape ------------------------------------------------

@pytest.mark.parametrize("body,where", [
    ('[[variant]]\nname = 5\n', "variant[0].name"),
    ('[[variant]]\nname = "x"\nbase = 5\n', "variant[0].base"),
    ('variant = [1, 2]\n', "variant"),
    ('variant = 3\n', "variant"),
    ('[[variant]]\nname = "x"\nnum_layers = "3"\n', "variant[0].num_layers"),
    ('[[variant]]\nname = "x"\nnum_layers = [2, 4]\n', "variant[0].num_layers"),
    ('[[variant]]\nname = "x"\ntensor_model_parallel_sise = 2\n',
     "variant[0].tensor_model_parallel_sise"),
    ('[[variant]]\nname = "a"\n[[variant]]\nname = "a"\n', "variant[1].name"),
    ('[[variant]]\nname = "two\\nlines"\n', "variant[0].name"),
    ('[[variant]]\nname = "nul\\u0000"\n', "variant[0].name"),
    ('[[variant]]\nname = ""\n', "variant[0].name"),
])
def test_sweep_file_schema(tmp_path, body, where):
    path = sweep_file(tmp_path, body)
    assert_error(["sweep", path, "--workers", "0", "--out", str(tmp_path / "o")], f"{path}:{where}")
    assert not (tmp_path / "o" / "results.csv").exists()


def test_top_level_base_of_the_wrong_type(tmp_path):
    path = write(tmp_path / "s.toml", 'base = 5\n[[variant]]\nname = "x"\n')
    assert_error(["sweep", path, "--workers", "0", "--out", str(tmp_path / "o")], f"{path}:base")


def test_all_invalid_sweep_writes_its_report(tmp_path):
    rc, out, err = cli([*SWEEP_TINY, "--tensor-model-parallel-size", "3,5", "--out",
                        str(tmp_path)])
    assert (rc, err) == (0, ""), err
    assert out.count("error: parallel.tensor_model_parallel_size") == 2
    assert "Invalid configurations" in (tmp_path / "report.md").read_text()
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 3


# --- tracebacks: --out never checked ----------------------------------------------------------

def unusable_out(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """An --out folder that cannot take results, and the name its error starts with."""
    if kind == "a file":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f", "--out"
    if kind == "/proc":
        return Path("/proc/simsp-x"), "--out"
    out = tmp_path / "o"
    out.mkdir()
    if kind == "cache a file":
        (out / "cache").write_text("x")
        return out, str(out / "cache")
    (out / "results.csv").mkdir()
    return out, str(out / "results.csv")


@pytest.mark.parametrize("kind", ["a file", "/proc", "cache a file", "results.csv a folder"])
@pytest.mark.parametrize("command", ["sweep", "search"])
def test_unusable_out_is_one_error_before_simulating(tmp_path, kind, command):
    out, field = unusable_out(tmp_path, kind)
    argv = (SWEEP_TINY if command == "sweep" else
            ["search", "--gpus", "2", TINY, "--workers", "0", "--quiet"])
    assert_error([*argv, "--out", str(out)], field)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    assert_error([*SWEEP_TINY, "--out", str(tmp_path / "ro" / "x")], "--out")


def test_output_never_replaces_an_input(tmp_path):
    log = write(tmp_path / "log.txt", LOG)
    assert_error(["calibrate", "nccl-tests", log, "--out", log], "--out")
    assert Path(log).read_text() == LOG
    (tmp_path / "o").mkdir()
    scenario = tmp_path / "o" / "results.csv"
    scenario.write_text((SCENARIOS / "tiny.toml").read_text())
    assert_error(["sweep", str(scenario), "--workers", "0", "--out", str(tmp_path / "o")],
                 "--out")


@pytest.mark.parametrize("target,field", [("DIR", "--out"), ("/proc/x.toml", "--out"),
                                          ("/dev/full", "--out"), ("LINK", "--out"),
                                          ("NOFOLDER/x.toml", "--out")])
def test_calibrate_out(tmp_path, target, field):
    log = write(tmp_path / "log.txt", LOG)
    (tmp_path / "DIR").mkdir()
    (tmp_path / "LINK").symlink_to(tmp_path / "victim")
    target = target.replace("DIR", str(tmp_path / "DIR")).replace("LINK", str(tmp_path / "LINK"))
    target = target.replace("NOFOLDER", str(tmp_path / "nofolder"))
    assert_error(["calibrate", "nccl-tests", log, "--out", target], field)
    assert not (tmp_path / "victim").exists()


@pytest.mark.parametrize("flag,target", [("--html", "/proc/x.html"), ("--html", "DIR"),
                                         ("--png", "/proc/x"), ("--png", "FILE"),
                                         ("--html", "LINK")])
def test_ring_lesson_paths(tmp_path, flag, target):
    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "LINK").symlink_to(tmp_path / "victim")
    for name in ("DIR", "FILE", "LINK"):
        target = target.replace(name, str(tmp_path / name)) if target == name else target
    assert_error(["ring", "--ranks", "4", "--collective", "all_reduce", "--size", "1M", flag,
                  target], flag)
    assert not (tmp_path / "victim").exists()


# --- output safety: planted links are refused, names are escaped ------------------------------

@pytest.mark.parametrize("name", ["results.csv", "report.md", "cache"])
def test_planted_symlink_is_refused(tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    err = assert_error([*SWEEP_TINY, "--out", str(out)], str(out / name))
    assert "symbolic link" in err
    assert victim.read_text() == "precious"


def test_planted_cache_entry_link_is_not_followed(tmp_path):
    """A link planted where a cache entry goes: the sweep replaces the link, never the file."""
    out = tmp_path / "out"
    assert cli([*SWEEP_TINY, "--out", str(out)])[0] == 0
    entry = next((out / "cache").glob("*.json"))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    entry.unlink()
    entry.symlink_to(victim)
    rc, stdout, _ = cli([*SWEEP_TINY, "--out", str(out)])
    assert rc == 0 and "1 wrong or stale entry recomputed" in stdout
    assert victim.read_text() == "precious" and not entry.is_symlink()


def test_user_text_is_escaped_in_markdown(tmp_path):
    path = sweep_file(tmp_path, '[[variant]]\nname = "<script>alert(1)</script> # x | y"\n'
                                'mode = "meta"\n')
    assert cli(["sweep", path, "--workers", "0", "--out", str(tmp_path / "o")])[0] == 0
    report = (tmp_path / "o" / "report.md").read_text()
    assert "<script>" not in report and "\\<script\\>" in report
    assert "\\# x \\| y" in report


def test_log_name_with_a_newline_stays_in_its_comment(tmp_path):
    log = write(tmp_path / "a\n[cluster]\nib_efficiency = 9\n.txt", LOG)
    rc, out, err = cli(["calibrate", "nccl-tests", log, "--out", str(tmp_path / "f.toml")])
    assert rc == 0, err
    lines = (tmp_path / "f.toml").read_text().splitlines()
    assert lines.count("[cluster]") == 1
    assert all(line.startswith("#") for line in lines[:lines.index("[cluster]")])


# --- hangs and unbounded work: bounds before work ---------------------------------------------

BOUNDED = {
    "search --gpus 10^12": (["search", "--gpus", str(10**12), "--workers", "0"], "--gpus"),
    "search batch 10^12": (["search", "--gpus", "8", "--global-batch-size", str(10**12),
                            "--workers", "0"], "--global-batch-size"),
    "search reserve nan": (["search", "--gpus", "8", "--global-batch-size", "8",
                            "--memory-reserve", "nan", "--workers", "0"],
                           "--memory-reserve"),
    "--workers 10^9": ([*SWEEP_TINY[:-3], "--workers", str(10**9)], "--workers"),
    "10^6 combinations": ([*SWEEP_TINY, "--seed", ",".join(map(str, range(1000))),
                           "--hidden-dropout", ",".join(f"0.{i:03d}" for i in range(1000))],
                          "sweep"),
    "175B numeric sweep": (["sweep", str(SCENARIOS / "paper-175b.toml"), "--mode", "numeric",
                            "--recompute-granularity", "none,full", "--workers", "0"],
                           "run.mode"),
    "calibrate --transfer-overhead-us inf": (["calibrate", "nccl-tests", "LOG",
                                              "--transfer-overhead-us", "inf"],
                                             "--transfer-overhead-us"),
    "/dev/zero as a scenario": (["sweep", "/dev/zero", "--workers", "0"], "/dev/zero"),
}


@pytest.mark.parametrize("case", BOUNDED)
def test_bounded_before_work(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    argv, field = BOUNDED[case]
    argv = [write(tmp_path / "log.txt", LOG) if a == "LOG" else a for a in argv]
    assert_error(argv, field)
    assert not (tmp_path / "reports").exists()


def test_70b_sweep_without_mode_meta_is_refused_at_once(tmp_path):
    """A 70B-class model (80 layers, h 8192) left in the default numeric mode."""
    start = time.perf_counter()
    err = assert_error(["sweep", "--num-layers", "80", "--hidden-size", "8192",
                        "--num-attention-heads", "64", "--seq-length", "4096",
                        "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size",
                        "8", "--nodes", "8", "--micro-batch-size", "1,2", "--global-batch-size",
                        "8", "--out", str(tmp_path)], "run.mode")
    assert time.perf_counter() - start < 1.0
    assert "--mode meta" in err and not (tmp_path / "results.csv").exists()


def test_row_above_the_meta_memory_limit_is_an_error_row(tmp_path):
    """A 1T row at global batch 32768 (4.2 million layer-steps, about 11 GiB of ledger and trace)
    is refused as `run` refuses it; the other rows run."""
    rc, out, err = cli(["sweep", str(SCENARIOS / "paper-1t.toml"), "--global-batch-size",
                        "32768", "--workers", "0", "--quiet", "--out", str(tmp_path)])
    assert rc == 0, err
    assert "error: work: meta mode would keep about" in out


@pytest.mark.parametrize("lines", ["ranks", "rows", "duplicate"])
def test_calibrate_log_bounds(tmp_path, lines):
    head, table = LOG.split("#\n", 1)
    if lines == "ranks":
        head = "".join(f"#  Rank {r} Group  0 Pid  1 on n{r // 8} device  {r % 8} [0x07] A100\n"
                       for r in range(100000))
    elif lines == "rows":
        rows = "".join(f"{8 * (i + 1):>12}  {2 * (i + 1):>12}  float  sum  -1  10.0  0  0  0  "
                       "10.0  0  0  0\n" for i in range(100000))
        table = "\n".join(table.splitlines()[:3]) + "\n" + rows
    else:
        head += head.splitlines()[-1] + "\n"
    log = write(tmp_path / "log.txt", head + "#\n" + table)
    assert_error(["calibrate", "nccl-tests", log], f"{log}:")


# --- silent wrong results ---------------------------------------------------------------------

EMPTY = {
    "sweep --out ''": ["sweep", "--out", "", "--workers", "0"],
    "sweep --out=": ["sweep", "--out=", "--workers", "0"],
    "sweep source ''": ["sweep", "", "--workers", "0"],
    "search --scheduler ''": ["search", "--gpus", "8", "--scheduler", ""],
    "calibrate --collective ''": ["calibrate", "nccl-tests", "x", "--collective", ""],
    "ring --size ''": ["ring", "--ranks", "4", "--collective", "all_reduce", "--size", ""],
    "validate --only ''": ["validate", "--only", ""],
    "validate --only 'a,'": ["validate", "--only", "table4,"],
}


@pytest.mark.parametrize("case", EMPTY)
def test_empty_argument_is_an_error(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    err = assert_error(EMPTY[case], "")
    assert "empty" in err


def test_switch_conflicting_with_a_list_is_an_error():
    assert_error([*SWEEP_TINY, "--sequence-parallel", "true,false", "--no-sequence-parallel"],
                 "--no-sequence-parallel")


@pytest.mark.parametrize("flags", ["--seq 8", "--seq-length 8 --seq-length 16",
                                   "--hidden-size ''"])
def test_validate_row_flags_are_strict(tmp_path, flags):
    path = tmp_path / "m.csv"
    path.write_text("name,scenario,flags,metric,measured,unit\n"
                    f'x,,"{flags} --mode meta",iteration_time,1,s\n')
    assert_error(["validate", str(path)], f"{path}:2")


@pytest.mark.parametrize("record,key", [('name = 5', "name"), ('measured = "1"', "measured"),
                                        ('flags = ["--x"]', "flags"), ('measured = true',
                                                                        "measured")])
def test_validate_toml_types(tmp_path, record, key):
    fields = {"name": '"x"', "scenario": '""', "flags": '"--mode meta"',
              "metric": '"iteration_time"', "measured": "1.0", "unit": '"s"'}
    fields[key] = record.split(" = ", 1)[1]
    path = write(tmp_path / "m.toml", "[[measurement]]\n" + "".join(
        f"{k} = {v}\n" for k, v in fields.items()))
    assert_error(["validate", path], f"{path}:measurement[0].{key}")


def test_results_jsonl_is_strict_json(tmp_path):
    assert cli([*SWEEP_TINY, "--out", str(tmp_path)])[0] == 0
    for line in (tmp_path / "results.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"non-strict JSON {name}"))


# --- write failures: one error naming the file, no half file ----------------------------------

def test_file_size_limit_is_one_error_and_no_half_file(tmp_path):
    """A 64 KiB file-size limit (as a quota or a full disk would) while a run writes its
    reports: one `error:` naming the file it could not write, no partial file left behind."""
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536)); "
              "sys.argv[1:] = sys.argv[2:]; from simsp.cli import console; console()")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", script, "-", "run", TINY, "--mode", "meta",
                           "--out", str(out), "--quiet"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {out}/"), done.stderr
    assert "File too large" in done.stderr
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    failed = Path(done.stderr.split(": ")[1])
    assert not failed.exists()  # written whole or not at all


def test_run_refuses_a_planted_report_folder_link(tmp_path, monkeypatch):
    """reports/<name> planted as a link to another folder: run refuses before simulating."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "tiny_meta").symlink_to(tmp_path / "elsewhere")
    assert_error(["run", TINY, "--mode", "meta"], "--out")
    assert list((tmp_path / "elsewhere").iterdir()) == []


# --- hardware profile files (--gpu PATH, --system PATH, `simsp hardware PATH`) -----------------

H100 = (REPO / "simsp" / "hardware/data" / "gpus" / "h100-sxm-80gb.toml").read_text()
DGX_H100 = (REPO / "simsp" / "hardware/data" / "systems" / "dgx-h100.toml").read_text()


@pytest.mark.parametrize("old,new,where", [
    ("memory_GiB = { value = 80,", 'memory_GiB = { value = "abc",', "memory_GiB"),  # was 3 GB, 28 s
    ("memory_GiB = { value = 80,", "memory_GiB = { value = inf,", "memory_GiB"),
    ("memory_GiB = { value = 80,", "memory_GiB = { value = 1e300,", "memory_GiB"),
    ("nvlink_generation = { value = 4,", "nvlink_generation = { value = 4.5,", "nvlink_generation"),
    ('name = "h100-sxm-80gb"', 'aliases = 5\nname = "x"', "aliases"),
    ('name = "h100-sxm-80gb"', 'name = "<b>x\\n# y"', "name"),
    ('name = "h100-sxm-80gb"', 'name = "x"\ncompute = 5', "compute"),
    ('name = "h100-sxm-80gb"', 'name = "x"\nmemory_gib = 3', "memory_gib"),
])
def test_gpu_profile_schema(tmp_path, old, new, where):
    path = write(tmp_path / "gpu.toml", H100.replace(old, new, 1))
    assert_error(["layer", "--gpu", path, "--mode", "meta", "--json"], f"cluster.gpu: {path}:{where}")


def test_gpu_profile_compute_section_of_the_wrong_type(tmp_path):
    path = write(tmp_path / "gpu.toml", H100 + '[compute]\ngemm_max_efficiency = '
                                               '{ value = "x", source = "s" }\n')
    assert_error(["hardware", path], f"cluster.gpu: {path}:compute.gemm_max_efficiency")


@pytest.mark.parametrize("old,new,where", [
    ("gpus_per_nvlink_domain = { value = 8,", "gpus_per_nvlink_domain = { value = 2.5,",
     "gpus_per_nvlink_domain"),  # was truncated to 2 silently
    ("nic_Gbps = { value = 400,", 'nic_Gbps = { value = "x",', "nic_Gbps"),
    ("nvswitch_generation = { value = 3,", "nvswitch_generation = { value = inf,",
     "nvswitch_generation"),
])
def test_system_profile_schema(tmp_path, old, new, where):
    path = write(tmp_path / "system.toml", DGX_H100.replace(old, new, 1))
    assert_error(["layer", "--system", path, "--mode", "meta", "--json"],
                 f"cluster.system: {path}:{where}")


@pytest.mark.parametrize("argv", [["hardware", "/dev/zero"], ["layer", "--gpu", "/dev/zero"],
                                  ["calibrate", "gemm", "/dev/zero"]])
def test_device_as_a_profile_or_probe_file_is_refused_at_once(argv):
    """These read /dev/zero until memory ran out (sweep --gpu /dev/zero was killed at 53 s)."""
    assert_error(argv, "/dev/zero: is not a regular file")


def test_an_argument_with_a_newline_stays_one_error_line():
    err = assert_error(["ring", "--ranks", "4", "--size", "1M", "a\n# H"],
                       "unrecognized arguments")
    assert "\\n" in err


# --- probe CSVs (`simsp calibrate gemm`) and `simsp probe gemm`'s output -------------------------

PROBE = "# probe\ndtype,m,k,n,seconds,label\n" + "".join(
    f"bf16,{s},{s},{s},{1e-5 + 2 * s**3 / 7e14 + 6 * s * s / 2e12!r},sq{s}\n"
    for s in (256, 512, 1024, 2048, 4096))


@pytest.mark.parametrize("row,where", [
    (f"bf16,{10**300},8,8,1e-5,x", ":8"),  # was an OverflowError traceback
    ("bf16,1_024,8,8,1e-5,x", ":8"),         # was read as 1024
    ("bf16,8,8,8,1e-5,x,extra", ":8"),       # was dropped silently
    ("bf16,8,8,8,inf,x", ":8"),
    ("bf16,8,8,8,1e-5,x\x00", ":8"),
    ("dtype,m,k,n,seconds,m", ":8"),
])
def test_probe_csv_schema(tmp_path, row, where):
    path = write(tmp_path / "probe.csv", PROBE + row + "\n")
    assert_error(["calibrate", "gemm", path, "--gpu", "h100-sxm-80gb"], f"{path}{where}")


def test_probe_csv_of_one_repeated_shape_cannot_be_fitted(tmp_path):
    """Five rows of one shape gave a fragment with gemm_max_efficiency 1e-6 and exit 0."""
    path = write(tmp_path / "probe.csv", "dtype,m,k,n,seconds\n" + "bf16,8,8,8,1e-5\n" * 5)
    assert_error(["calibrate", "gemm", path], f"{path}: bf16: need at least 3 shapes")


def test_calibrate_gemm_never_replaces_its_input_and_escapes_its_name(tmp_path):
    path = write(tmp_path / "probe.csv", PROBE)
    assert_error(["calibrate", "gemm", path, "--gpu", "h100-sxm-80gb", "--out", path], "--out")
    assert Path(path).read_text() == PROBE  # main wrote the fragment over the measurements
    named = write(tmp_path / 'q"\n[compute]\nz = 1\n.csv', PROBE)
    fragment = tmp_path / "f.toml"
    rc, _, err = cli(["calibrate", "gemm", named, "--gpu", "h100-sxm-80gb", "--out", str(fragment)])
    assert rc == 0, err
    import tomllib
    parsed = tomllib.loads(fragment.read_text())  # main's fragment had a line `z = 1`
    assert set(parsed) == {"compute"} and "z" not in parsed["compute"]
    assert "[compute]\nz = 1" in parsed["compute"]["launch_overhead_s"]["source"]


def test_calibrate_gemm_ceiling_above_the_gpu_peak(tmp_path):
    path = write(tmp_path / "probe.csv", PROBE)  # 700 TFLOP/s: an H100, not an A100 (312)
    assert_error(["calibrate", "gemm", path, "--gpu", "a100-sxm-80gb"], "--gpu")


@pytest.mark.parametrize("argv,field", [(["--out", "/proc/x.csv"], "--out"),
                                        (["--out", "DIR"], "--out"),
                                        (["--repeats", str(10**9)], "--repeats")])
def test_probe_checks_its_output_and_repeats_before_the_gpu(tmp_path, argv, field):
    (tmp_path / "DIR").mkdir()
    argv = [str(tmp_path / "DIR") if a == "DIR" else a for a in argv]
    assert_error(["probe", "gemm", *argv], field)


# --- every file of sweep, search and whatif's folders: planted links refused -------------------

@pytest.mark.parametrize("name", ["memory.png", "top.png", "exploration.json"])
def test_planted_link_at_every_sweep_file_is_refused(tmp_path, name):
    """main wrote a PNG or the manifest through these links (its list of files was stale)."""
    victim = write(tmp_path / "victim.txt", "precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    assert "symbolic link" in assert_error([*SWEEP_TINY, "--out", str(out)], str(out / name))
    assert Path(victim).read_text() == "precious"


WHATIF = ["whatif", TINY, "x=--mode meta", "--workers", "0", "--quiet"]


@pytest.mark.parametrize("name", ["whatif.md", "whatif.html", "vs_baseline.png"])
def test_planted_link_at_a_whatif_file_is_refused(tmp_path, name):
    victim = write(tmp_path / "victim.txt", "precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    assert_error([*WHATIF, "--out", str(out)], str(out / name))
    assert Path(victim).read_text() == "precious"


@pytest.mark.parametrize("spec,words", [
    ("x=--name 'abc", "No closing quotation"),        # was a shlex ValueError traceback
    ("x=--mode meta --mode meta", "given twice"),     # was accepted, the last kept
    ("a\x01b=--mode meta", "printable"),              # was 12 lines of matplotlib warnings
])
def test_whatif_variant_specs(tmp_path, spec, words):
    err = assert_error(["whatif", TINY, spec, "--workers", "0", "--out", str(tmp_path)],
                       "variant")
    assert words in err


def test_whatif_baseline_mark_must_be_a_boolean(tmp_path):
    path = sweep_file(tmp_path, '[[variant]]\nname = "a"\nbaseline = "no"\n'
                                '[[variant]]\nname = "b"\n')  # "no" was read as true
    assert_error(["whatif", path, "--workers", "0", "--out", str(tmp_path / "o")],
                 f"{path}:variant[0].baseline")


# --- ring_attention's model flags, validate's values and names ---------------------------------

@pytest.mark.parametrize("flag,value", [("--seq-length", str(10**12)),  # printed 1e50-byte blocks
                                        ("--kv-channels", str(10**9)),
                                        ("--micro-batch-size", str(10**20))])
def test_ring_attention_flags_take_runs_range_table(flag, value):
    assert_error(["ring", "--collective", "ring_attention", "--ranks", "4", flag, value], flag)


MEASURED = ('[[measurement]]\nname = "NAME"\nscenario = ""\nflags = "--mode meta"\n'
            'metric = "iteration_time"\nmeasured = VALUE\nunit = "s"\n')


@pytest.mark.parametrize("name,value,words", [("x", "inf", "finite"),  # inf was accepted
                                              ("x\\n# y", "1.0", "printable")])  # printed raw
def test_validate_measured_values_and_names(tmp_path, name, value, words):
    path = write(tmp_path / "m.toml", MEASURED.replace("NAME", name).replace("VALUE", value))
    assert words in assert_error(["validate", path], f"{path}:measurement[0]")


def test_validate_only_names_a_group_once():
    assert_error(["validate", "--only", "table4,table4"], "--only")


def test_wide_context_parallel_run_is_refused_before_the_shortcut_check():
    """CP 2048: the estimate missed the cp² ring term and the shortcut check walked every route
    first; main ran past a minute. Now one `error: work:` line at once (at CP 4096: CP 2048's
    estimate, 490 CPU s at the constants of 2026-11-29, is under the limit)."""
    err = assert_error(["run", "--mode", "meta", "--json", "--context-parallel-size", "4096",
                        "--use-flash-attn", "--nodes", "512", "--seq-length", "8192"], "work")
    assert "limit of 600 s" in err


def test_hardware_reads_a_broken_system_file_as_a_system(tmp_path):
    path = write(tmp_path / "s.toml", DGX_H100.replace("nic_Gbps = { value = 400,",
                                                       'nic_Gbps = { value = "x",'))
    assert_error(["hardware", path], f"cluster.system: {path}:nic_Gbps")


def test_readme_limits_cover_every_command_and_input_file():
    """Every command of `simsp` has a row in README's limits tables, and every kind of file the
    input layer reads (simsp/io_in.py MAX_BYTES) a row giving its size limit."""
    from simsp.cli import COMMANDS
    from simsp.io_in import MAX_BYTES, _size
    readme = (REPO / "README.md").read_text()
    limits = readme[readme.index("## Limits"):readme.index("Sharded data parallelism")]
    commands = {c.strip("` ") for line in limits.splitlines() if line.startswith("| `")
                for c in line.split("|")[1].split(",")}
    assert set(COMMANDS) <= {c.split()[0] for c in commands}, set(COMMANDS) - commands
    rows = {"scenario": "| scenario", "sweep": "| sweep file", "measurements": "| measurements",
            "nccl-tests": "| nccl-tests log", "cache": "| sweep cache entry",
            "profile": "| GPU or system profile", "probe": "| probe CSV",
            "launch line": "| launch line", "hf-config": "| Hugging Face config"}
    assert set(rows) == set(MAX_BYTES)
    for kind, start in rows.items():
        line = next(line for line in limits.splitlines() if line.startswith(start))
        assert f"| {_size(MAX_BYTES[kind])} |" in line, kind


def test_recompute_module_named_twice():
    assert_error(["layer", "--recompute-granularity", "selective", "--recompute-modules", "mlp",
                  "mlp", "--json"], "parallel.recompute_modules")


def test_search_total_work_is_bounded(tmp_path, monkeypatch):
    """search --gpus 32768 on the 1T model simulated layout after layout (~10 s each) with no
    total bound; now its batches' estimates add up to the sweep limit, then one `error: work:`
    (here the limit is lowered so that a tiny search reaches it)."""
    monkeypatch.setattr("simsp.explore.search.branch_and_bound.TOTAL_TIME_LIMIT_S", 1e-6)
    argv = ["search", "--gpus", "2", TINY, "--workers", "0", "--quiet", "--out", str(tmp_path)]
    assert "--force to go on" in assert_error(argv, "work")
    rc, out, err = cli([*argv, "--force"])
    assert rc == 0 and "top " in out, err
