"""The sweep cache cannot lie: a changed simulator (code or model constants) misses it, an
entry of another configuration or of the wrong shape is recomputed and counted, concurrent
writers never collide, and a folder that cannot be written still gives every result."""

from dataclasses import replace
import json
from pathlib import Path
import shutil
import threading

import pytest

from simsp.hardware import costmodel
from simsp.hardware import constants as hardware
from simsp.explore.evaluation import cache as cache_module
from simsp.api import build_configs, sweep_configs
from simsp.explore.evaluation.cache import ResultCache

REPO = Path(__file__).resolve().parents[1]
TINY = {"mode": "meta", "recompute_granularity": "none,full"}


def sweep(out: Path):
    """Two tiny meta configurations into `out`, in this process."""
    return sweep_configs(build_configs(REPO / "scenarios" / "tiny.toml", TINY), out, workers=0,
                         report=False)


def test_rerun_reuses_every_row(tmp_path):
    first = sweep(tmp_path)
    assert first.attrs["cache"] == "cache: 0 reused, 2 simulated"
    again = sweep(tmp_path)
    assert again.attrs["cache"] == "cache: 2 reused, 0 simulated"
    assert again.equals(first)


def test_model_constant_change_recomputes(tmp_path):
    """A slower GEMM curve (a compute-model constant) misses the cache: new, slower rows."""
    before = sweep(tmp_path)
    slower = replace(costmodel.active_calibration(), gemm_max_efficiency=0.5)
    with costmodel.calibration(slower):
        after = sweep(tmp_path)
    assert after.attrs["cache"] == "cache: 0 reused, 2 simulated"
    assert (after["iteration_time_s"] > before["iteration_time_s"]).all()


def test_gpu_constant_change_recomputes(tmp_path, monkeypatch):
    before = sweep(tmp_path)
    gpu = hardware.GPUS["A100-SXM4-80GB"]
    monkeypatch.setitem(hardware.GPUS, gpu.name, replace(gpu, memory_bytes=gpu.memory_bytes // 2))
    after = sweep(tmp_path)
    assert after.attrs["cache"] == "cache: 0 reused, 2 simulated"
    assert (after["capacity_bytes"] * 2 == before["capacity_bytes"]).all()


def test_code_change_changes_every_key(tmp_path, monkeypatch):
    """An edit to any of simsp's files (here a default in a copy of scenario/table/cluster.py) changes the
    simulator digest, so every configuration's key."""
    copy = tmp_path / "simsp"
    shutil.copytree(cache_module.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = build_configs(None, {"mode": "meta"})[0]
    monkeypatch.setattr(cache_module, "PACKAGE", copy)
    same = config.digest()
    config_py = copy / "scenario/table/cluster.py"
    text = config_py.read_text()
    assert '"ib_efficiency", float, 0.90' in text
    config_py.write_text(text.replace('"ib_efficiency", float, 0.90', '"ib_efficiency", float, 0.80'))
    cache_module.source_digest.cache_clear()  # read once per process: a new process reads it
    assert config.digest() != same


def _entries(out: Path) -> list[Path]:
    return sorted((out / "cache").glob("*.json"))


def test_entry_of_another_configuration_is_recomputed(tmp_path):
    """An entry copied over another configuration's is never served as its result."""
    first = sweep(tmp_path)
    a, b = _entries(tmp_path)
    b.write_bytes(a.read_bytes())
    again = sweep(tmp_path)
    assert again.attrs["cache"] == "cache: 1 reused, 1 simulated, 1 wrong or stale entry " \
                                   "recomputed"
    assert again.equals(first)


@pytest.mark.parametrize("text", ["", "{", "[]", "5", '{"format": 1}', "nan",
                                  '{"format": 1, "key": "KEY", "config": [], "row": {"status":'
                                  ' "ok"}}', "[" * 100000])
def test_corrupt_entry_is_recomputed(tmp_path, text):
    first = sweep(tmp_path)
    entry = _entries(tmp_path)[0]
    entry.write_text(text.replace("KEY", entry.stem))
    again = sweep(tmp_path)
    assert "1 wrong or stale entry recomputed" in again.attrs["cache"]
    assert again.equals(first)
    assert json.loads(entry.read_text())["key"] == entry.stem


def test_unwritable_cache_still_gives_results(tmp_path, monkeypatch):
    """A cache folder that refuses new files (read-only, as root cannot be made to see): every
    row computed, and the command says it was not cached."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(cache_module, "_new_temporary", refuse)
    frame = sweep(tmp_path)
    assert frame.attrs["cache"].startswith("cache: 0 reused, 2 simulated, 2 not cached (")
    assert "Permission denied" in frame.attrs["cache"]
    assert frame["status"].tolist() == ["ok", "ok"] and _entries(tmp_path) == []


def test_concurrent_writers_never_collide(tmp_path):
    """Eight writers storing the same key at once: one whole entry, no temporary left."""
    store = ResultCache(tmp_path)
    values = ((("run", "seed"), 1),)
    rows = [{"status": "ok", "error": None, "iteration_time_s": float(i)} for i in range(8)]
    threads = [threading.Thread(target=lambda r=r: [store.put("k" * 64, r, values)
                                                     for _ in range(50)]) for r in rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.name for p in tmp_path.iterdir()] == ["k" * 64 + ".json"]
    assert ResultCache(tmp_path).get("k" * 64, values) in rows
