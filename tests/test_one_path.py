"""One path from flags to a simulated configuration (docs/exploration.md): every [cluster]
field, --gpu and --system reach the Scenario that run, sweep, search, whatif and the Python API
simulate, and a search on H100s reproduces its winner with `simsp run`."""

import json
import shlex

import pytest

import simsp.api
import simsp.explore.evaluation.evaluate as evaluate
import simsp.explore.search.branch_and_bound as branch_and_bound
from simsp.cli import build_parser, main
from simsp.commands import search as search_command
from simsp.explore.arguments import field_lists
from simsp.explore.search.bounds import scenario_of
from simsp.explore.search.layouts import enumerate_layouts
from simsp.explore.whatif.variants import variants_from_specs, whatif_configs
from simsp.scenario.outside import scenario_from_args
from simsp.scenario.loading import load_scenario
from simsp.scenario.table import CLUSTER

SCENARIO = "scenarios/llama-tiny.toml"
GPUS = 2  # search's world: small, so a handful of layouts
PROFILES = {"gpu": "h100-sxm-80gb", "system": "dgx-h100"}  # the text fields: known profiles
# DGX H100 as its datasheet gives it: H100 SXM, 8 GPUs on NVLink 4 (900 GB/s both directions,
# 450 per direction), one 400 Gb/s ConnectX-7 NIC per GPU (50 GB/s per direction).
H100_LINKS = {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nvlink_bandwidth_GBps": 450.0,
              "ib_bandwidth_GBps": 50.0}


def _other_value(row):
    """A valid value of the row other than its default: another choice, a known profile, the
    default plus one (integers), half the default (fractions and speeds) or 0.5 (a zero),
    twice the lower bound where that falls outside the bounds."""
    if row.choices:
        return next(choice for choice in reversed(row.choices) if choice != row.default)
    if row.kind is str:
        return PROFILES[row.name]  # a new text field must name its test value here
    if row.kind is int:
        return row.default + 1
    value = row.default / 2 if row.default else 0.5
    if row.bound is not None and not row.bound.low <= value <= row.bound.high:
        return 2 * row.bound.low  # e.g. a ratio bounded below by 1: 2
    return value


def _case(row) -> tuple:
    """(field, flag, value): a value flag with another valid value, or a switch with its value."""
    if row.flag is None:  # a switch alone (e.g. --sm-contention)
        return row.name, row.switches[0].flag, row.switches[0].value
    return row.name, row.flag, _other_value(row)


CASES = [_case(row) for row in CLUSTER]


def _text(value) -> str | None:
    """The value's text after its flag; None after a switch (a boolean)."""
    if isinstance(value, bool):
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)


# a field valid only beside another: the flags and fields that make it valid
COMPANION_FLAGS = {"--use-sharp": ["--system", "dgx-h100"]}  # needs a SHARP fabric
COMPANION_FIELDS = {"use_sharp": {"system": "dgx-h100"}}


def _tokens(flag, text) -> list[str]:
    return ([flag] if text is None else [flag, text]) + COMPANION_FLAGS.get(flag, [])


def _fields(name, value) -> dict:
    return {name: value, **COMPANION_FIELDS.get(name, {})}


def _run(flag, text):
    return [scenario_from_args(build_parser().parse_args(["run", SCENARIO,
                                                          *_tokens(flag, text)]))]


def _sweep(flag, text):
    args = build_parser().parse_args(["sweep", SCENARIO, *_tokens(flag, text)])
    return [load_scenario(None, c.overrides())
            for c in simsp.api.build_configs(args.source, field_lists(args))]


def _search(flag, text):
    args = build_parser().parse_args(["search", SCENARIO, "--gpus", str(GPUS),
                                      *_tokens(flag, text)])
    base, fixed, allowed = search_command._base(args)
    batch = base[("parallel", "global_batch_size")]
    layouts = enumerate_layouts(base, GPUS, batch, fixed, SCENARIO, allowed,
                                search_command._given_nodes(args))
    return [scenario_of(config) for config in layouts.configs]


def _whatif(flag, text):
    configs = whatif_configs(variants_from_specs(SCENARIO, [f"v={' '.join(_tokens(flag, text))}"]))
    return [load_scenario(None, configs[1].overrides())]


def _api_run(name, value, monkeypatch):
    seen = []
    monkeypatch.setattr(evaluate, "collect_metrics", lambda sc: seen.append(sc) or {})
    simsp.api.run(SCENARIO, **_fields(name, value))
    return seen


def _api_sweep(name, value, monkeypatch):
    seen = []
    monkeypatch.setattr(simsp.api, "sweep_configs", lambda configs, *a, **k: seen.extend(
        load_scenario(None, c.overrides()) for c in configs))
    simsp.api.sweep(SCENARIO, workers=0, **_fields(name, value))
    return seen


class _Enumerated(Exception):
    """Raised by the stand-in search once it has the layouts (nothing is simulated)."""


def _api_search(name, value, monkeypatch):
    seen = []

    def enumerate_only(base, gpus, batch, executor, cache, top, objective, reserve, quiet,
                       fixed, exhaustive, source, allowed, nodes=None, **kwargs):
        layouts = enumerate_layouts(base, gpus, batch, fixed, source, allowed, nodes)
        seen.extend(scenario_of(config) for config in layouts.configs)
        raise _Enumerated
    monkeypatch.setattr(branch_and_bound, "search", enumerate_only)
    with pytest.raises(_Enumerated):
        simsp.api.search(SCENARIO, gpus=GPUS, workers=0, **_fields(name, value))
    return seen


FLAG_COMMANDS = {"run": _run, "sweep": _sweep, "search": _search, "whatif": _whatif}
API_COMMANDS = {"simsp.run": _api_run, "simsp.sweep": _api_sweep, "simsp.search": _api_search}


def _check(scenarios, name, value):
    assert scenarios, "no configuration was built"
    for sc in scenarios:
        assert getattr(sc.cluster, name) == value
        if name == "system":
            assert {key: getattr(sc.cluster, key) for key in H100_LINKS} == H100_LINKS
        if name == "gpu":
            assert sc.cluster.nvlink_bandwidth_GBps == H100_LINKS["nvlink_bandwidth_GBps"]


@pytest.mark.parametrize("command", FLAG_COMMANDS)
@pytest.mark.parametrize("name, flag, value", CASES, ids=[case[0] for case in CASES])
def test_every_cluster_flag_reaches_every_command(command, name, flag, value):
    """The flag's value (and, for --system and --gpu, what the profile implies) is the value of
    every Scenario the command builds."""
    _check(FLAG_COMMANDS[command](flag, _text(value)), name, value)


@pytest.mark.parametrize("command", API_COMMANDS)
@pytest.mark.parametrize("name, flag, value", CASES, ids=[case[0] for case in CASES])
def test_every_cluster_field_reaches_the_python_api(command, name, flag, value, monkeypatch):
    _check(API_COMMANDS[command](name, value, monkeypatch), name, value)


def test_a_search_on_h100_reproduces_its_winner(tmp_path, capsys):
    """`search --system dgx-h100` simulates H100 compute and links: the winner's own `simsp run`
    command gives its iteration time to 1e-9 (it gave A100's before the one path)."""
    out = tmp_path / "search"
    assert main(["search", SCENARIO, "--mode", "meta", "--gpus", "4", "--system", "dgx-h100",
                 "--workers", "0", "--quiet", "--top", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    fits = [row for row in rows if row["status"] == "ok" and row["fits"] is True]
    winner = min(fits, key=lambda row: row["iteration_time_s"])
    assert (winner["gpu"], winner["nvlink_bandwidth_GBps"], winner["ib_bandwidth_GBps"]) == \
        ("h100-sxm-80gb", 450.0, 50.0)
    capsys.readouterr()
    command = shlex.split(winner["command"])
    assert command[:2] == ["simsp", "run"]
    assert main([*command[1:], "--json", "--quiet"]) == 0
    reproduced = json.loads(capsys.readouterr().out)
    assert reproduced["iteration_time_s"] == pytest.approx(winner["iteration_time_s"],
                                                           rel=1e-9, abs=0)
