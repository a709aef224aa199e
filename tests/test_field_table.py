"""One field table: every scenario field is a flag of `run`, `layer`, `sweep` and `search`, with
the same name and help, and the default the help states is the config's own default."""

import argparse
from dataclasses import MISSING, fields
import re

import pytest

import simsp
from simsp.scenario import config
from simsp.scenario import flags
from simsp.cli import build_parser, main
from simsp.explore.arguments import field_lists
from simsp.hardware.constants import LinkCalibration

COMMANDS = ("run", "layer", "sweep", "search")


def _options(command: str) -> dict:
    """{option string: argparse action} of one command."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s: a for a in sub.choices[command]._actions for s in a.option_strings}


@pytest.fixture(scope="module")
def options():
    return {command: _options(command) for command in COMMANDS}


def _field_flags() -> dict:
    """(section, key) -> every flag of the table that sets it."""
    table = {}
    for flag, row in list(flags.SCENARIO_FLAGS.items()) + list(flags.SWITCHES.items()):
        table.setdefault((row[0], row[1]), []).append(flag)
    return table


def _defaults(section: str) -> dict:
    cls = config.SECTIONS[section]
    return {f.name: (f.default_factory() if f.default is MISSING else f.default)
            for f in fields(cls)}


def test_every_field_has_a_flag_in_every_command_with_the_same_help(options):
    table = _field_flags()
    for section, cls in config.SECTIONS.items():
        for f in fields(cls):
            assert (section, f.name) in table, f"{section}.{f.name} has no row in simsp/scenario/table/"
            for flag in table[(section, f.name)]:
                helps = {c: options[c][flag].help for c in COMMANDS if flag in options[c]}
                assert set(helps) == set(COMMANDS), f"{flag} missing from {set(COMMANDS) - set(helps)}"
                assert len(set(helps.values())) == 1, f"{flag}: {helps}"
                assert f"[{section}.{f.name}]" in helps["run"]


def _stated_default(text: str) -> str | None:
    match = re.search(r"; default: ([^;]*) \[\w+\.\w+\]$", text)
    return match.group(1) if match else None


def test_the_default_in_help_is_the_configs_default(options):
    """Parsed back from the help text and compared with the dataclass instance's value."""
    for flag, row in flags.SCENARIO_FLAGS.items():
        section, key, kind = row[0], row[1], row[2]
        default = _defaults(section)[key]
        stated = _stated_default(options["run"][flag].help)
        if default is None:  # the help says in words what "not given" means
            assert "default" in options["run"][flag].help, flag
        elif kind is float:
            assert float(stated) == default, f"{flag}: help says {stated}, config has {default}"
        else:
            assert stated == str(default), f"{flag}: help says {stated}, config has {default}"
    for flag, row in flags.SWITCHES.items():
        section, key, value = row[0], row[1], row[2]
        stated = _stated_default(options["run"][flag].help)
        assert stated == ("on" if _defaults(section)[key] == value else "off"), flag


def test_fp32_gradient_reduction_is_on_by_default(options):
    assert config.Parallel().accumulate_allreduce_grads_in_fp32 is True
    assert "default: on" in options["sweep"]["--accumulate-allreduce-grads-in-fp32"].help
    assert "default: off" in options["search"]["--no-accumulate-allreduce-grads-in-fp32"].help


def test_link_calibration_defaults_are_the_clusters():
    cluster = config.Cluster()
    calibration = LinkCalibration()
    assert calibration.nvlink_efficiency == cluster.nvlink_efficiency == 0.78
    assert calibration.ib_efficiency == cluster.ib_efficiency == 0.90
    assert calibration.transfer_overhead_s == cluster.transfer_overhead_us * 1e-6 == 0.0


def test_an_inverted_switch_sweeps_as_given_or_not():
    """`--disable-bias-linear true,false`: biases off, then on (run's own switch); alone, off."""
    parser = build_parser()
    lists = field_lists(parser.parse_args(["sweep", "--disable-bias-linear", "true,false"]))
    assert lists == {"add_bias_linear": "false,true"}
    assert field_lists(parser.parse_args(["sweep", "--disable-bias-linear"])) == {
        "add_bias_linear": "false"}
    frame = simsp.sweep(None, workers=0, mode="meta", **lists)
    assert list(frame["add_bias_linear"]) == [False, True]
    assert "--disable-bias-linear" in frame["command"][0]
    assert "--disable-bias-linear" not in frame["command"][1]


def test_search_restricts_layouts_to_the_values_given(capsys, tmp_path):
    frame = simsp.search(None, gpus=4, global_batch_size=4, num_layers=4, hidden_size=64,
                         num_attention_heads=4, seq_length=32, tensor_model_parallel_size=2,
                         recompute_granularity="none,full", micro_batch_size=1,
                         exhaustive=True, workers=0)
    assert set(frame["tensor_model_parallel_size"]) == {2}
    assert set(frame["recompute_granularity"]) == {"none", "full"}
    assert set(frame["micro_batch_size"]) == {1}
    assert main(["search", "--gpus", "4", "--mode", "numeric", "--workers", "0", "--out",
                 str(tmp_path)]) == 2
    assert "error: --mode: search simulates in meta mode only" in capsys.readouterr().err
