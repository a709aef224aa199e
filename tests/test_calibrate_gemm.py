"""`simsp calibrate gemm`: recovering known GEMM parameters from generated probe CSVs."""

import json
import subprocess
import sys

import numpy as np
import pytest

from simsp.calibrate.gemm_fit import GemmRow, fit_all
from simsp.commands.probe import SWEEP
from simsp.hardware.costmodel import gemm_operand_bytes, gemm_seconds, kernel_time
from simsp.hardware.constants import compute_for

TRUE = {"bf16": (700e12, 3.0e12, 4e-6), "fp8": (1300e12, 3.1e12, 5e-6)}  # C, B, L
SHAPES = [(2048, 12288, 4608), (2048, 1536, 12288), (2048, 12288, 6144), (2048, 6144, 12288),
          (64, 64, 64), (512, 512, 512)] + [(s, s, s) for s in SWEEP]


def _seconds(dtype, m, k, n):
    """Generated from the model by hand: L + 2mkn / C + bytes / B (bytes written out here)."""
    ceiling, bandwidth, launch = TRUE[dtype]
    nbytes = 2 * (m * k + k * n + m * n) if dtype == "bf16" else m * k + k * n + 2 * m * n
    return launch + 2 * m * k * n / ceiling + nbytes / bandwidth


def _csv(path, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    lines = ["# generated", "dtype,m,k,n,seconds,label"]
    for dtype in TRUE:
        for m, k, n in SHAPES:
            t = _seconds(dtype, m, k, n) * (1 + noise * rng.standard_normal())
            lines.append(f"{dtype},{m},{k},{n},{t!r},s{m}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_generated_parameters_are_recovered_to_1e_4(tmp_path):
    result = subprocess.run([sys.executable, "-m", "simsp.cli", "calibrate", "gemm",
                             str(_csv(tmp_path / "probe.csv")), "--gpu", "h100-sxm-80gb",
                             "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    fits = json.loads(result.stdout)["fits"]
    for dtype, (ceiling, bandwidth, launch) in TRUE.items():
        assert fits[dtype]["ceiling_flops"] == pytest.approx(ceiling, rel=1e-4)
        assert fits[dtype]["memory_Bps"] == pytest.approx(bandwidth, rel=1e-4)
        assert fits[dtype]["launch_s"] == pytest.approx(launch, rel=1e-4)
    assert "[compute]" in json.loads(result.stdout)["fragment"]


def test_with_two_percent_noise_the_fit_stays_within_a_few_percent(tmp_path):
    from simsp.calibrate.gemm_fit import read_probe_csv
    fits = fit_all(read_probe_csv(str(_csv(tmp_path / "noisy.csv", noise=0.02, seed=7))))
    for dtype, (ceiling, bandwidth, _) in TRUE.items():
        assert fits[dtype].ceiling_flops == pytest.approx(ceiling, rel=0.03)
        assert fits[dtype].memory_Bps == pytest.approx(bandwidth, rel=0.15)
        assert np.sqrt(np.mean(fits[dtype].relative_errors() ** 2)) < 0.03


def test_the_fragment_in_a_profile_reproduces_the_measured_times(tmp_path):
    out = tmp_path / "fragment.toml"
    subprocess.run([sys.executable, "-m", "simsp.cli", "calibrate", "gemm",
                    str(_csv(tmp_path / "probe.csv")), "--gpu", "h100-sxm-80gb", "--out",
                    str(out)], check=True, capture_output=True)
    from simsp.hardware.profile_file import DATA
    profile = tmp_path / "h100-measured.toml"
    profile.write_text((DATA / "gpus" / "h100-sxm-80gb.toml").read_text() + "\n" + out.read_text())
    for dtype, fp8 in (("bf16", False), ("fp8", True)):
        cal = compute_for(str(profile), fp8=fp8)
        m, k, n = 2048, 12288, 6144
        model = gemm_seconds(2 * m * k * n, gemm_operand_bytes(m, k, n, dtype), cal)
        assert model == pytest.approx(_seconds(dtype, m, k, n), rel=1e-4)
    bf16 = compute_for(str(profile))
    assert kernel_time("gemm", 2 * m * k * n, 0, (m, k, n), bf16) == \
        pytest.approx(_seconds("bf16", m, k, n), rel=1e-4)


def test_probe_without_pytorch_or_a_gpu_is_one_error_line():
    try:
        import torch  # noqa: F401
        pytest.skip("PyTorch is installed here")
    except ImportError:
        pass
    result = subprocess.run([sys.executable, "-m", "simsp.cli", "probe", "gemm"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("error: probe:")
    assert result.stderr.count("\n") == 1


def test_a_csv_without_the_columns_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("dtype,m,k\nbf16,1,2\n")
    result = subprocess.run([sys.executable, "-m", "simsp.cli", "calibrate", "gemm", str(bad)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "missing column" in result.stderr
    assert GemmRow("bf16", 1, 2, 3, 1.0).flops == 12
