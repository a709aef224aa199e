"""`simsp probe gemm`'s attention part and `simsp calibrate gemm --attention`: the fused
attention figures recovered from generated probe CSVs (no GPU here), the probe's SDPA calls run
on the CPU where PyTorch is installed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simsp.calibrate.attention_fit import ATTENTION_HEADER
from simsp.hardware.attention_kernels import published_flops, reference_shape
from simsp.hardware.profile_file import DATA
from simsp.hardware.profiles import gpu_profile

ROOT = Path(__file__).resolve().parent.parent
# the figures the generated rows are made from (H100 profile: FlashAttention-3 paper Figs. 5-6)
FIGURES = {"fa2": (370.0, 322.0), "cudnn": (595.0, 516.0)}
REF_FWD = 4 * 1 * 16 * 16384 * 16384 * 128  # 4·b·h·s²·d, by hand
REF_BWD = 2.5 * REF_FWD


def _csv(path: Path, kernels=FIGURES, directions=("fwd", "bwd")) -> Path:
    lines = ["# generated", ATTENTION_HEADER]
    for kernel, (fwd, bwd) in kernels.items():
        for direction, tflops, flops in (("fwd", fwd, REF_FWD), ("bwd", bwd, REF_BWD)):
            if direction in directions:
                lines.append(f"{kernel},{direction},1,16,16,16384,128,0,{flops / tflops / 1e12!r},"
                             f"reference")
        lines.append(f"{kernel},fwd,1,16,4,8192,128,1,0.0005,layer")
    path.write_text("\n".join(lines) + "\n")
    return path


def _gemm_csv(path: Path) -> Path:
    rows = ["dtype,m,k,n,seconds,label"]
    for size in (512, 1024, 2048, 4096, 8192):
        flops, nbytes = 2 * size**3, 6 * size**2
        rows.append(f"bf16,{size},{size},{size},{3e-6 + flops / 700e12 + nbytes / 3e12!r},sq")
    path.write_text("\n".join(rows) + "\n")
    return path


def _calibrate(tmp_path, *extra):
    return subprocess.run([sys.executable, "-m", "simsp.cli", "calibrate", "gemm",
                           str(_gemm_csv(tmp_path / "gemm.csv")), "--gpu", "h100-sxm-80gb",
                           *extra], capture_output=True, text=True, cwd=ROOT)


def test_the_counted_flops_are_the_benchmarks():
    assert published_flops(reference_shape(), False) == REF_FWD
    assert published_flops(reference_shape(), True) == REF_BWD


def test_the_figures_are_recovered_and_the_fragment_loads_as_a_profile(tmp_path):
    out = tmp_path / "fragment.toml"
    result = _calibrate(tmp_path, "--attention", str(_csv(tmp_path / "att.csv")), "--out",
                        str(out), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # at the published shape the tiled model reproduces the figure it was given: error 0
    for check in doc["attention"]:
        if check["label"] == "reference":
            assert check["model_s"] == pytest.approx(check["measured_s"], rel=1e-9)
    text = (DATA / "gpus" / "h100-sxm-80gb.toml").read_text()
    profile = tmp_path / "mine.toml"
    fragment = out.read_text()
    profile.write_text(text[:text.index("[attention]")] + fragment[fragment.index("[attention]"):])
    attention = gpu_profile(str(profile)).attention
    assert attention["sm_count"] == 132
    for kernel, (fwd, bwd) in FIGURES.items():
        assert attention[f"{kernel}_fwd_TFLOPs"] == fwd
        assert attention[f"{kernel}_bwd_TFLOPs"] == bwd


@pytest.mark.parametrize("edit,message", [
    (lambda p: p.write_text(ATTENTION_HEADER + "\nfa3,fwd,1,16,16,16384,128,0,0.01,x\n"),
     "kernel must be one of fa2, cudnn"),
    (lambda p: p.write_text(ATTENTION_HEADER + "\nfa2,fwd,1,16,16,16384,128,2,0.01,x\n"),
     "causal must be 0 or 1"),
    (lambda p: p.write_text("kernel,seconds\nfa2,1\n"), "the header must be"),
    (lambda p: _csv(p, directions=("fwd",)), "in one direction only"),
    (lambda p: p.write_text(ATTENTION_HEADER + "\nfa2,fwd,1,16,16,4096,128,1,0.01,x\n"),
     "no row at the published shape"),
])
def test_a_bad_attention_file_is_one_error_line(tmp_path, edit, message):
    path = tmp_path / "att.csv"
    edit(path)
    result = _calibrate(tmp_path, "--attention", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and message in result.stderr


def test_the_probe_s_attention_shapes_by_hand():
    from simsp.commands.probe import attention_shapes
    from simsp.scenario.loading import load_scenario
    sc = load_scenario(str(ROOT / "scenarios" / "llama3-8b.toml"), {})
    # t 2: 32/2 query heads, 8/2 K/V heads, s 8192, d 128, causal; mbs 1
    assert attention_shapes(sc) == [("reference", 1, 16, 16, 16384, 128, False),
                                     ("layer", 1, 16, 4, 8192, 128, True)]


def test_the_probe_runs_each_sdpa_backend_or_names_why_not(monkeypatch):
    torch = pytest.importorskip("torch")
    from simsp.commands import probe
    from simsp.scenario.loading import load_scenario
    timed = []
    def one_run(_torch, fn, repeats):
        fn()
        timed.append(repeats)
        return 1e-3 * len(timed)
    monkeypatch.setattr(probe, "_time", one_run)
    monkeypatch.setattr(probe, "attention_shapes",
                        lambda sc: [("tiny", 1, 4, 2, 64, 32, True)])
    sc = load_scenario(None, {})
    lines = probe.attention_lines(torch, sc, 3, device="cpu")
    # FlashAttention's SDPA backend runs on the CPU: forward 1 ms, forward + backward 2 ms
    assert lines[:2] == ["fa2,fwd,1,4,2,64,32,1,0.001,tiny", "fa2,bwd,1,4,2,64,32,1,0.001,tiny"]
    # cuDNN's needs a CUDA GPU: left out, named in a comment line
    assert len(lines) == 3 and lines[2].startswith("# cudnn tiny: not run (")
