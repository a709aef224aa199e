"""GPU and system profiles as data (simsp/hardware/profiles.py), the compute rule, NVLS timing."""

from dataclasses import replace
import math
import subprocess
import sys
import tomllib

import pytest
import simpy

from simsp.cluster.topology import build_topology, route
from simsp.scenario.config import Cluster
from simsp.scenario.loading import load_scenario
from simsp.hardware.costmodel import kernel_time
from simsp.engine.communicator import Communicator
from simsp.engine.group_timing import RING_ALONE, EveryGroup
from simsp.engine.network import Network
from simsp.engine.collectives.nvls import nvls_all_reduce_time
from simsp.errors import UserError
from simsp.hardware.constants import A100_COMPUTE, LinkCalibration, compute_for, rule_calibration
from simsp.hardware.profile_file import DATA, available
from simsp.hardware.profiles import gpu_profile, system_profile
from simsp.units import GiB


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "simsp.cli", *args], capture_output=True,
                          text=True)


@pytest.mark.parametrize("path", sorted(DATA.glob("*/*.toml")), ids=lambda p: p.stem)
def test_every_number_of_every_bundled_profile_names_its_source(path):
    data = tomllib.loads(path.read_text())
    numbers = {k: v for k, v in data.items() if k not in ("name", "description", "gpu", "aliases")}
    for section in ("compute", "compute_fp8", "attention", "fabric"):
        numbers.update({f"{section}.{k}": v for k, v in numbers.pop(section, {}).items()})
    assert numbers
    for key, entry in numbers.items():
        assert set(entry) == {"value", "source"} and len(entry["source"]) > 20, key


def test_the_bundled_set_is_the_issue_s_list():
    assert available("gpu") == ["a100-sxm-40gb", "a100-sxm-80gb", "b200", "gb200",
                                "h100-sxm-80gb", "h200-sxm-141gb", "h800-sxm-80gb"]
    assert available("system") == ["dgx-a100", "dgx-b200", "dgx-h100", "dgx-h200", "dgx-h800",
                                   "gb200-nvl72"]


def test_the_default_gpu_is_the_fitted_a100_unchanged():
    gpu = gpu_profile(Cluster().gpu)
    assert compute_for(Cluster().gpu) == A100_COMPUTE
    assert gpu.memory_bytes == 80 * GiB and gpu.peak_flops == 312e12
    assert gpu_profile("A100-SXM4-80GB") == gpu  # the old name is an alias


def test_a_system_fills_the_cluster_and_a_flag_still_wins():
    sc = load_scenario(None, {("cluster", "system"): "dgx-h100"})
    c = sc.cluster
    assert (c.gpu, c.gpus_per_node, c.nvlink_bandwidth_GBps, c.ib_bandwidth_GBps) == \
        ("h100-sxm-80gb", 8, 450.0, 50.0)  # NDR 400 Gb/s = 50 GB/s
    sc = load_scenario(None, {("cluster", "system"): "dgx-h100",
                              ("cluster", "ib_bandwidth_GBps"): 100.0})
    assert sc.cluster.ib_bandwidth_GBps == 100.0  # XDR 800 Gb/s given by hand
    assert load_scenario(None, {("cluster", "gpu"): "b200"}).cluster.nvlink_bandwidth_GBps == 900


def test_nvl72_is_one_72_gpu_nvlink_domain():
    c = load_scenario(None, {("cluster", "system"): "gb200-nvl72"}).cluster
    assert c.gpus_per_node == 72 and system_profile("gb200-nvl72").nvswitch_generation == 4
    graph = build_topology(c)
    kinds = {graph.edges[e]["kind"] for e in route(graph, "gpu0", "gpu71")}
    assert kinds == {"nvlink"}  # TP 72 never leaves NVLink


def test_the_rule_is_flops_at_the_ceiling_plus_bytes_at_the_memory_rate():
    peak, ceiling, hbm = 989e12, 794.5e12, 3.35e12
    cal = rule_calibration(peak, ceiling, hbm)
    m, k, n = 8192, 1536, 6144
    flops, nbytes = 2 * m * k * n, 2 * (m * k + k * n + m * n)
    by_hand = 2e-6 + flops / ceiling + nbytes / (0.9 * hbm)
    assert kernel_time("gemm", flops, 0, (m, k, n), cal) == pytest.approx(by_hand, rel=1e-12)
    assert cal.gemm_max_efficiency == pytest.approx(ceiling / peak)


def test_a_user_profile_file_works_and_one_without_sources_is_one_error_line(tmp_path):
    own = tmp_path / "my-gpu.toml"
    text = (DATA / "gpus" / "h100-sxm-80gb.toml").read_text().replace(
        'name = "h100-sxm-80gb"', 'name = "my-gpu"').replace("value = 80,", "value = 96,", 1)
    own.write_text(text)
    assert gpu_profile(str(own)).memory_bytes == 96 * GiB
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('memory_GiB = { value = 96, source', 'memory_GiB = { value = 96, x'))
    with pytest.raises(UserError, match="names its source"):
        gpu_profile(str(bad))
    result = _cli("layer", "--gpu", str(bad), "--json")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: cluster.gpu:")


def test_nvls_all_reduce_time_by_hand():
    """H100 (NVLink 4): 25 us + 1 GiB x (1 + 1/8) at 450 GB/s x 0.78 x 0.85 (tuning.cc)."""
    by_hand = 25e-6 + 2**30 * 1.125 / (450e9 * 0.78 * 0.85)
    assert nvls_all_reduce_time(2**30, 8, 450.0, 0.78, 4) == pytest.approx(by_hand, rel=1e-12)


def test_ring_nvls_is_refused_on_nvswitch_2_and_across_nodes():
    refused = _cli("ring", "--ranks", "8", "--nccl-algo", "nvls", "--size", "1M")
    assert refused.returncode == 2 and "NVSwitch-3" in refused.stderr
    across = _cli("ring", "--system", "dgx-h100", "--ranks", "16", "--nodes", "2",
                  "--nccl-algo", "nvls", "--size", "1M")
    assert across.returncode == 2 and "one NVLink domain" in across.stderr
    ok = _cli("ring", "--system", "dgx-h100", "--ranks", "8", "--nccl-algo", "nvls",
              "--size", "1G", "--json")
    assert ok.returncode == 0
    busbw = __import__("json").loads(ok.stdout)["busbw_GBps"]
    n, t = 8, nvls_all_reduce_time(2**30, 8, 450.0, 0.78, 4)
    assert busbw == pytest.approx(2**30 / t / 1e9 * 2 * (n - 1) / n, rel=1e-9)
    assert math.isfinite(busbw)


def test_simsp_hardware_lists_every_profile_with_its_sources():
    result = _cli("hardware", "--json")
    assert result.returncode == 0
    profiles = __import__("json").loads(result.stdout)["profiles"]
    assert [p["name"] for p in profiles] == available("gpu") + available("system")
    for profile in profiles:
        assert all(item["source"] for item in profile["numbers"].values())
    h100 = next(p for p in profiles if p["name"] == "h100-sxm-80gb")
    assert h100["model"]["bf16_from"] == "rule"
    assert h100["model"]["bf16"]["gemm_max_efficiency"] == pytest.approx(794.5 / 989)
    a100 = next(p for p in profiles if p["name"] == "a100-sxm-80gb")
    assert a100["model"]["bf16_from"] == "fitted [compute]"
    text = _cli("hardware", "dgx-h100")
    assert text.returncode == 0 and "NDR" in text.stdout and "nvswitch_generation = 3" in text.stdout


def test_the_nemo_group_runs_only_when_named():
    from simsp.validation.runner import check_all, load_sets, select_groups
    sets = load_sets([])
    assert "nemo-24.07-h100" not in [g[0] for g in select_groups(sets, None)]
    (group,) = select_groups(sets, ["nemo-24.07-h100"])
    names = [row.name.split()[0] for _, row in group[3]]
    assert names == ["GPT3-5B", "GPT3-20B", "GPT3-175B", "GPT3-175B", "LLAMA2-7B", "LLAMA2-13B",
                     "LLAMA2-70B", "LLAMA3-8B", "LLAMA3-70B"] and "not model" in group[2]
    check_all([group])  # every row's scenario loads and passes run's work check


def test_a_swept_system_fills_its_cluster_unless_that_key_is_swept_too():
    from simsp.explore.configs.grid import base_values, expand
    from simsp.explore.configs.fields import by_key
    fields = by_key()
    configs = expand([("", base_values(None))],
                     [(fields["cluster.system"], ["dgx-h100", "gb200-nvl72"]),
                      (fields["cluster.ib_bandwidth_GBps"], [100.0])])
    values = [dict(c.values) for c in configs]
    assert [(v[("cluster", "gpu")], v[("cluster", "gpus_per_node")]) for v in values] == \
        [("h100-sxm-80gb", 8), ("gb200", 72)]
    assert {v[("cluster", "ib_bandwidth_GBps")] for v in values} == {100.0}  # swept: kept
    assert values[1][("cluster", "nvlink_bandwidth_GBps")] == 900.0


def test_plain_ring_names_nccl_s_pick_only_where_nvls_can_run():
    h100 = _cli("ring", "--system", "dgx-h100", "--ranks", "8", "--size", "1G")
    assert h100.returncode == 0 and "-> nvls" in h100.stdout
    for args in (("--ranks", "8"), ("--system", "dgx-h100", "--ranks", "16", "--nodes", "2")):
        other = _cli("ring", *args, "--size", "1G")
        assert other.returncode == 0 and "NVLS" not in other.stdout


def test_reports_name_the_hardware_only_when_it_is_not_the_default():
    from simsp.metrics.layout import layout
    from simsp.report.run.summary_md import _hardware_line
    assert "gpu" not in layout(load_scenario(None))
    lay = layout(load_scenario(None, {("cluster", "system"): "dgx-h100",
                                      ("parallel", "fp8_format"): "hybrid"}))
    assert _hardware_line(lay) == ["Hardware: h100-sxm-80gb in dgx-h100, FP8 hybrid (delayed)."]


def _all_reduce(cluster, gpus, nbytes, calibration=None):
    """One all-reduce of `nbytes` over `gpus` through the training loop's Communicator (meta
    buffers, closed-form timing): its stats."""
    env = simpy.Environment()
    calibration = calibration or LinkCalibration.from_cluster(cluster)
    comm = Communicator(env, Network(env, build_topology(cluster), calibration),
                        timing_of=EveryGroup(RING_ALONE))
    for rank in gpus:
        env.process(comm.all_reduce(tuple(gpus), rank, None, nbytes, "tp"))
    env.run()
    return comm.stats[0]


def test_a_training_all_reduce_runs_as_nvls_where_nccl_would_pick_it():
    h100 = load_scenario(None, {("cluster", "system"): "dgx-h100",
                                ("cluster", "nodes"): 2}).cluster
    big = _all_reduce(h100, range(8), 2**28)  # 256 MiB in one node: NVLS, by hand
    assert big.algorithm == "nvls"
    assert big.time_s == pytest.approx(25e-6 + 2**28 * 1.125 / (450e9 * 0.78 * 0.85), rel=1e-12)
    # 16 KiB: ring/LL 6.6 + 14 x (0.6 + 2 KiB / (450 GB/s x 0.78 x LL on 1 of 24 channels:
    # Hopper's graph is 12 channels of 30 GB/s, LL on half a graph channel 0.5 x 30 x 0.5 =
    # 7.5 of Simple's 360 GB/s busbw)) = 18.92 us < NVLS 25 + 18 KiB / (450 x 0.78 x 0.85 GB/s)
    small = _all_reduce(h100, range(8), 2**14)
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert small.time_s == pytest.approx((6.6 + 14 * (0.6 + 2048 / 7.3125e9 * 1e6)) * 1e-6,
                                         rel=1e-12)
    assert _all_reduce(h100, (0, 8), 2**28).algorithm != "nvls"  # two NVLink domains
    forced = _all_reduce(h100, range(8), 2**28,
                         replace(LinkCalibration.from_cluster(h100), nccl_algo="ring"))
    assert forced.algorithm == "ring" and forced.time_s > 1.3 * big.time_s
    a100 = load_scenario(None, {}).cluster
    assert _all_reduce(a100, range(8), 2**28).algorithm == "ring"  # NVSwitch 2: no NVLS
