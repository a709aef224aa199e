"""One memory verdict (simsp/memory_verdict.py): `run`, `search`, `sweep` and `whatif` give the
same headroom and fits for the same layout, and the headroom is capacity − reserve − peak, counted
here from run's own per-rank peaks."""

import json
import shlex

import pandas as pd
import pytest

from simsp.cli import main
from simsp.units import GiB

MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "64", "--vocab-size", "256", "--global-batch-size", "8"]
RESERVE = "79.99"  # leaves 10.24 MiB: layouts peaking at 7.4 to 11.2 MiB fall on both sides


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """search's rows for 4 GPUs under the reserve, and its folder."""
    folder = tmp_path_factory.mktemp("verdict")
    assert main(["search", "--gpus", "4", *MODEL, "--memory-reserve", RESERVE, "--workers", "0",
                 "--quiet", "--out", str(folder / "search")]) == 0
    return folder, pd.read_csv(folder / "search" / "results.csv")


def _layouts(frame: pd.DataFrame) -> list[list[str]]:
    """The run flags of one layout that fits and one that does not (search's commands)."""
    fitting = frame[frame["fits"]].iloc[0]["command"]
    failing = frame[~frame["fits"]].iloc[0]["command"]
    return [shlex.split(command)[2:] for command in (fitting, failing)]


def test_run_search_sweep_and_whatif_agree(searched, capsys):
    folder, frame = searched
    layouts = _layouts(frame)
    verdicts = {"search": [frame[frame["command"] == shlex.join(["simsp", "run", *flags])]
                           .iloc[0] for flags in layouts]}
    runs = []
    for flags in layouts:
        assert main(["run", *flags, "--memory-reserve", RESERVE, "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    for i, flags in enumerate(layouts):
        assert main(["sweep", *flags, "--memory-reserve", RESERVE, "--workers", "0", "--quiet",
                     "--out", str(folder / f"sweep{i}")]) == 0
    verdicts["sweep"] = [pd.read_csv(folder / f"sweep{i}" / "results.csv").iloc[0]
                         for i in range(len(layouts))]
    scenario = folder / "empty.toml"
    scenario.write_text("[run]\nmode = \"meta\"\n")
    assert main(["whatif", str(scenario), *(f"L{i}={shlex.join(flags)}"
                                            for i, flags in enumerate(layouts)),
                 "--memory-reserve", RESERVE, "--workers", "0", "--quiet",
                 "--out", str(folder / "whatif")]) == 0
    whatif = pd.read_csv(folder / "whatif" / "results.csv")
    verdicts["whatif"] = [whatif[whatif["variant"] == f"L{i}"].iloc[0] for i in range(2)]
    for i, metrics in enumerate(runs):
        peak = max(r["peak_bytes"] for r in metrics["ranks"])
        memory = metrics["memory"]
        assert memory["headroom_bytes"] == 80 * GiB - float(RESERVE) * GiB - peak
        assert memory["fits"] is (i == 0)
        for command, rows in verdicts.items():
            assert (rows[i]["headroom_bytes"], bool(rows[i]["fits"])) == \
                (memory["headroom_bytes"], memory["fits"]), command


def test_run_reserve_is_checked(capsys):
    assert main(["run", *MODEL, "--mode", "meta", "--memory-reserve", "80", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --memory-reserve")


def test_itemised_reserve_agrees_across_commands(tmp_path, capsys):
    """Without --memory-reserve every command judges with the layout's itemised non-tensor
    memory: the same reserve, headroom and fits from run, sweep, whatif and search."""
    assert main(["search", "--gpus", "4", *MODEL, "--workers", "0", "--quiet", "--top", "2",
                 "--out", str(tmp_path / "search")]) == 0
    capsys.readouterr()
    frame = pd.read_csv(tmp_path / "search" / "results.csv")
    flags = shlex.split(frame.iloc[0]["command"])[2:]
    assert main(["run", *flags, "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["memory_reserve_bytes"] == sum(i["bytes"] for i in memory["non_tensor"].values())
    assert main(["sweep", *flags, "--workers", "0", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    scenario = tmp_path / "empty.toml"
    scenario.write_text("[run]\nmode = \"meta\"\n")
    assert main(["whatif", str(scenario), f"L={shlex.join(flags)}", "--workers", "0", "--quiet",
                 "--out", str(tmp_path / "wi")]) == 0
    rows = [frame.iloc[0], pd.read_csv(tmp_path / "sw" / "results.csv").iloc[0],
            pd.read_csv(tmp_path / "wi" / "results.csv").set_index("variant").loc["L"]]
    for row in rows:
        assert (row["memory_reserve_bytes"], row["headroom_bytes"], bool(row["fits"])) == \
            (memory["memory_reserve_bytes"], memory["headroom_bytes"], memory["fits"])
