"""GEMMs by shape (simsp/hardware/gemm_shapes.py, docs/gemm_shapes.md): tile and wave counts by
hand, the table reproduced at its own points, log-space interpolation between them, the rule
kept (and labelled) where a GPU has no table."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from simsp.errors import UserError
from simsp.hardware.constants import A100_COMPUTE, compute_for
from simsp.hardware.costmodel import gemm_operand_bytes, gemm_rate, gemm_seconds, kernel_time
from simsp.hardware.gemm_shapes import GEMM_DATA, table_rate, wave_efficiency
from simsp.hardware.profile_file import DATA
from simsp.hardware.profiles import gpu_profile

ROOT = Path(__file__).resolve().parent.parent


def _csv_rates(name: str, dtype: str) -> dict:
    """The CSV's rows read apart from the code under test: (m, k, n) -> FLOP/s."""
    lines = [line for line in (GEMM_DATA / f"{name}.csv").read_text().splitlines()
             if line and not line.startswith("#")]
    return {(int(r["m"]), int(r["k"]), int(r["n"])): float(r["TFLOPs"]) * 1e12
            for r in csv.DictReader(lines) if r["dtype"] == dtype}


def test_tiles_and_waves_by_hand():
    # 4096 x 4096 on 132 SMs: 32 x 16 = 512 tiles of 128 x 256, 4 waves = 528 slots
    assert wave_efficiency(4096, 4096, 132) == 512 / 528
    # 8192 x 3072: 64 x 12 = 768 tiles, 6 waves = 792 slots
    assert wave_efficiency(8192, 3072, 132) == 768 / 792
    # one partial tile: 1 of 132 slots; 132 tiles exactly: one full wave
    assert wave_efficiency(100, 100, 132) == 1 / 132
    assert wave_efficiency(128 * 11, 256 * 12, 132) == 1.0
    # a batched GEMM of 133 one-tile copies: 2 waves, 133 of 264 slots
    assert wave_efficiency(128, 256, 132, copies=133) == 133 / 264
    # B200, 148 SMs: 4096 x 4096 -> 512 tiles, 4 waves = 592 slots
    assert wave_efficiency(4096, 4096, 148) == 512 / 592


@pytest.mark.parametrize("gpu,dtype,name", [("h100-sxm-80gb", "bf16", "xla-sm90"),
                                            ("b200", "bf16", "xla-sm100-b200"),
                                            ("b200", "fp8", "xla-sm100-b200")])
def test_the_table_is_reproduced_at_every_table_point(gpu, dtype, name):
    table = compute_for(gpu, fp8=dtype == "fp8").gemm_table
    rates = _csv_rates(name, dtype)
    assert len(rates) == 125  # 5 x 5 x 5: m, k, n in 256 ... 4096
    for (m, k, n), rate in rates.items():
        assert table_rate(table, m, k, n) == pytest.approx(rate, rel=1e-12)


def test_between_points_the_log_rate_is_interpolated_in_log2_of_the_dims():
    table = compute_for("h100-sxm-80gb").gemm_table
    rates = _csv_rates("xla-sm90", "bf16")
    # k between 2048 and 4096 (k does not change the waves): a geometric blend
    k = 2896
    frac = math.log2(k) - 11
    expected = math.exp((1 - frac) * math.log(rates[(4096, 2048, 4096)])
                        + frac * math.log(rates[(4096, 4096, 4096)]))
    assert table_rate(table, 4096, k, 4096) == pytest.approx(expected, rel=1e-12)
    # m = 3072: 24 x 16 = 384 tiles in 3 waves, as full as 2048's and 4096's (32/33): the blend
    frac = math.log2(3072) - 11
    expected = math.exp((1 - frac) * math.log(rates[(2048, 4096, 4096)])
                        + frac * math.log(rates[(4096, 4096, 4096)]))
    assert table_rate(table, 3072, 4096, 4096) == pytest.approx(expected, rel=1e-12)


def test_past_the_grid_the_edge_rate_loses_what_its_emptier_last_wave_costs():
    table = compute_for("h100-sxm-80gb").gemm_table
    edge = _csv_rates("xla-sm90", "bf16")[(4096, 4096, 4096)]  # 512 tiles, 4 waves: 512/528
    # 8192 x 4352 output: 64 x 17 = 1088 tiles, 9 waves = 1188 slots
    expected = edge * (1088 / 1188) / (512 / 528)
    assert table_rate(table, 8192, 16384, 4352) == pytest.approx(expected, rel=1e-12)
    # 8192 x 14336: 3584 tiles in 28 waves (3584/3696 = 32/33, as full as the edge): the edge
    assert table_rate(table, 8192, 16384, 14336) == pytest.approx(edge, rel=1e-12)
    cal = compute_for("h100-sxm-80gb")
    flops = 2 * 8192 * 16384 * 4352
    assert kernel_time("gemm", flops, 0, (8192, 16384, 4352), cal) == pytest.approx(
        cal.launch_overhead_s + flops / expected, rel=1e-12)


def test_a_batched_gemm_never_runs_above_its_measured_point():
    # the attention's context GEMM, 48 copies of (2048, 2048) x (2048, 128): n clamped to 256;
    # its 768 tiles fill the waves better than the single (2048, 2048, 256) point's 16, but the
    # rate stays the point's (cuBLAS ran that point with smaller tiles: no wave gain is credited)
    table = compute_for("h100-sxm-80gb").gemm_table
    point = _csv_rates("xla-sm90", "bf16")[(2048, 2048, 256)]
    assert table_rate(table, 2048, 2048, 128, copies=48) == pytest.approx(point, rel=1e-12)
    flops = 48 * 2 * 2048 * 2048 * 128
    cal = compute_for("h100-sxm-80gb")
    assert kernel_time("gemm", flops, 0, (2048, 2048, 128), cal) == pytest.approx(
        cal.launch_overhead_s + flops / point, rel=1e-12)


def test_the_rule_is_kept_where_no_table_exists(tmp_path):
    # the A100's fitted curve, unchanged: E_max I / (I + I_half) of peak
    m, k, n = 8192, 4096, 14336
    intensity = m * k * n / (m * k + k * n + m * n)
    assert gemm_rate((m, k, n), A100_COMPUTE) == pytest.approx(
        312e12 * 0.9345 * intensity / (intensity + 335.6), rel=1e-12)
    # GB200 without its [attention] section: no table, no SMs, the rule exactly
    text = (DATA / "gpus" / "gb200.toml").read_text()
    no_sms = tmp_path / "gb200-no-sms.toml"
    no_sms.write_text(text[:text.index("# Fused attention kernels")])
    cal = compute_for(str(no_sms))
    assert cal.gemm_table is None and cal.gemm_sms == 0
    ceiling, b_eff = 1939e12, 0.9 * 8.0e12
    seconds = 2 * m * k * n / ceiling + 2 * (m * k + k * n + m * n) / b_eff
    assert 2 * m * k * n / gemm_rate((m, k, n), cal) == pytest.approx(seconds, rel=1e-12)


def test_h100_fp8_keeps_the_rule_with_its_flop_term_wave_quantised():
    # the sm_90 table's FP8 rows exceed the dense FP8 peak and are not bundled
    cal = compute_for("h100-sxm-80gb", fp8=True)
    assert cal.gemm_table is None and cal.gemm_sms == 132
    m, k, n = 8192, 4096, 3072  # 768 tiles in 6 waves of 132
    flops = 2 * m * k * n
    fp8_bytes = m * k + k * n + 2 * m * n
    expected = 2e-6 + flops / (1402.6e12 * 768 / 792) + fp8_bytes / (0.9 * 3.35e12)
    assert gemm_seconds(flops, gemm_operand_bytes(m, k, n, "fp8"), cal, (m, k, n)) == \
        pytest.approx(expected, rel=1e-12)


def _gpu_file(tmp_path, edit) -> str:
    text = (DATA / "gpus" / "h100-sxm-80gb.toml").read_text()
    path = tmp_path / "gpu.toml"
    path.write_text(edit(text))
    return str(path)


def test_a_profile_naming_an_unknown_table_or_no_sms_is_refused(tmp_path):
    unknown = _gpu_file(tmp_path, lambda t: t.replace('value = "xla-sm90"', 'value = "nope"'))
    with pytest.raises(UserError, match="gemm_table: must name a bundled GEMM table"):
        gpu_profile(unknown)
    no_sms = tmp_path / "nosms.toml"
    text = (DATA / "gpus" / "h100-sxm-80gb.toml").read_text()
    no_sms.write_text(text[:text.index("[attention]")])
    with pytest.raises(UserError, match="needs the GPU's SMs"):
        gpu_profile(str(no_sms))


def test_simsp_hardware_labels_the_table_and_the_fallback():
    out = subprocess.run([sys.executable, "-m", "simsp.cli", "hardware", "--json"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    models = {p["name"]: p.get("model", {}) for p in json.loads(out)["profiles"]}
    assert models["h100-sxm-80gb"]["bf16_gemms"].startswith("measured table xla-sm90")
    assert models["h100-sxm-80gb"]["fp8_gemms"].startswith("rule (fallback: no measured fp8")
    assert models["gb200"]["bf16_gemms"] == ("rule (fallback: no measured bf16 table), its FLOP "
                                             "term wave-quantised over 152 SMs")
    assert models["a100-sxm-80gb"]["bf16_gemms"].startswith("fitted [compute] (fallback")
    assert "gemm_table" not in models["h100-sxm-80gb"]["bf16"]
