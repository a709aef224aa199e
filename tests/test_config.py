"""Scenario configuration: defaults, TOML loading, overrides, flags and every cross-field check."""

import dataclasses
from pathlib import Path

import pytest

from simsp.scenario.checks import validate
from simsp.scenario.config import SECTIONS, Cluster, Model, Parallel, Run, Scenario
from simsp.scenario.loading import load_scenario, with_overrides
from simsp.errors import UserError
from simsp.scenario.flags import SCENARIO_FLAGS, SWITCHES, Parser, add_scenario_arguments, \
    overrides_from_args

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def write(tmp_path, text: str, name: str = "case.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- defaults and derived quantities ---------------------------------------------------------

def test_default_scenario_is_the_small_two_layer_gpt():
    sc = load_scenario()
    assert sc == Scenario()
    m = sc.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (2, 64, 4, 32)
    assert m.ffn == 4 * m.hidden_size and m.head_dim == 16
    assert sc.parallel.world_size == 1 and sc.parallel.schedule_name == "1f1b"
    assert sc.run.mode == "numeric"


def test_sections_are_frozen():
    sc = load_scenario()
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.model.hidden_size = 128
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.parallel = Parallel()


def test_derived_batch_and_schedule_quantities():
    p = Parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                 data_parallel_size=3, micro_batch_size=2, global_batch_size=48)
    assert (p.tp, p.pp, p.dp, p.world_size) == (2, 4, 3, 24)
    assert p.global_batch == 48 and p.num_micro_batches == 8
    assert Parallel(micro_batch_size=2, data_parallel_size=3).global_batch == 6
    assert Parallel(num_layers_per_virtual_pipeline_stage=2).schedule_name == "interleaved"
    assert Parallel(schedule="gpipe").schedule_name == "gpipe"
    assert Model(ffn_hidden_size=100).ffn == 100
    assert Cluster(nodes=3).num_gpus == 24


# --- TOML files ------------------------------------------------------------------------------

def test_toml_values_land_in_their_sections_and_the_name_is_the_file_stem(tmp_path):
    path = write(tmp_path, "[model]\nhidden_size = 128\nnum_attention_heads = 8\n"
                           "hidden_dropout = 0\n[parallel]\ntensor_model_parallel_size = 2\n"
                           "sequence_parallel = true\n[cluster]\nnodes = 2\n", "my-case.toml")
    sc = load_scenario(path)
    assert sc.model.hidden_size == 128 and sc.model.num_attention_heads == 8
    assert sc.model.hidden_dropout == 0.0 and type(sc.model.hidden_dropout) is float
    assert sc.parallel.tp == 2 and sc.parallel.sequence_parallel is True
    assert sc.cluster.nodes == 2
    assert sc.run.name == "my-case"
    assert sc.model.seq_length == Model().seq_length  # untouched fields keep their defaults


def test_explicit_run_name_wins_over_the_stem(tmp_path):
    sc = load_scenario(write(tmp_path, '[run]\nname = "chosen"\n'))
    assert sc.run.name == "chosen"


def test_overrides_win_over_the_file(tmp_path):
    path = write(tmp_path, "[model]\nhidden_size = 128\nnum_attention_heads = 8\n")
    sc = load_scenario(path, {("model", "hidden_size"): 256, ("run", "mode"): "meta"})
    assert sc.model.hidden_size == 256 and sc.model.num_attention_heads == 8
    assert sc.run.mode == "meta"


def test_an_empty_file_is_the_default_scenario(tmp_path):
    sc = load_scenario(write(tmp_path, "# nothing\n", "empty.toml"))
    assert dataclasses.replace(sc, run=Run()) == Scenario()


# docs/MODEL.md#paper-layouts: a, h, L, t, p, GPUs, global batch, micro-batch, schedule, chunks
PAPER = {
    "paper-22b": (64, 6144, 48, 8, 1, 8, 4, 4, "1f1b", None),
    "paper-175b": (96, 12288, 96, 8, 8, 64, 64, 1, "interleaved", 3),
    "paper-530b": (128, 20480, 105, 8, 35, 280, 280, 1, "interleaved", 3),
    "paper-1t": (160, 25600, 128, 8, 64, 512, 512, 1, "1f1b", None),
}


@pytest.mark.parametrize("name", PAPER)
def test_paper_scenarios_match_reference_section_3(name):
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    m, p = sc.model, sc.parallel
    a, h, L, t, pp, gpus, B, b, schedule, chunks = PAPER[name]
    assert (m.num_attention_heads, m.hidden_size, m.num_layers) == (a, h, L)
    assert (m.seq_length, m.vocab_size) == (2048, 51200)
    assert (p.tp, p.pp, p.dp, p.world_size) == (t, pp, 1, gpus)
    assert (p.global_batch, p.micro_batch_size, p.schedule_name) == (B, b, schedule)
    assert p.sequence_parallel and p.recompute_granularity == "selective"  # "present work"
    if chunks:
        assert L // pp // p.num_layers_per_virtual_pipeline_stage == chunks
    assert sc.cluster.num_gpus >= gpus and sc.run.mode == "meta"


def test_every_shipped_scenario_loads():
    files = sorted(SCENARIOS.glob("*.toml"))
    assert files
    for path in files:
        validate(load_scenario(path))


# --- errors name the field -----------------------------------------------------------------

@pytest.mark.parametrize("text,field", [
    ("[model]\nhiden_size = 64\n", "model.hiden_size"),
    ("[modle]\n", "modle"),
    ("[model\n", "FILE:1"),  # a file-level error names the file and line (simsp.io_in)
    ('[model]\nhidden_size = "64"\n', "model.hidden_size"),
    ("[model]\nnum_layers = true\n", "model.num_layers"),
    ("[parallel]\nsequence_parallel = 1\n", "parallel.sequence_parallel"),
    ("[model]\nattention_dropout = 1.0\n", "model.attention_dropout"),
])
def test_file_errors_are_user_errors_naming_the_field(tmp_path, text, field):
    path = write(tmp_path, text)
    field = field.replace("FILE", str(path))
    with pytest.raises(UserError) as info:
        load_scenario(path)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert info.value.reason


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as info:
        load_scenario(tmp_path / "absent.toml")
    assert info.value.field == str(tmp_path / "absent.toml")
    assert info.value.reason == "file not found"


@pytest.mark.parametrize("overrides,field", [
    ({("model", "hidden_size"): 65}, "model.hidden_size"),
    ({("model", "num_attention_heads"): 2, ("parallel", "tensor_model_parallel_size"): 4},
     "parallel.tensor_model_parallel_size"),
    ({("model", "ffn_hidden_size"): 6, ("parallel", "tensor_model_parallel_size"): 4},
     "parallel.tensor_model_parallel_size"),
    ({("model", "seq_length"): 6, ("parallel", "tensor_model_parallel_size"): 4,
      ("parallel", "sequence_parallel"): True}, "parallel.sequence_parallel"),
    ({("parallel", "sequence_parallel"): True}, "parallel.sequence_parallel"),
    ({("model", "num_layers"): 3, ("parallel", "pipeline_model_parallel_size"): 2},
     "parallel.pipeline_model_parallel_size"),
    ({("model", "num_layers"): 8, ("parallel", "pipeline_model_parallel_size"): 2,
      ("parallel", "num_layers_per_virtual_pipeline_stage"): 3,
      ("parallel", "global_batch_size"): 2}, "parallel.num_layers_per_virtual_pipeline_stage"),
    ({("parallel", "schedule"): "interleaved", ("parallel", "pipeline_model_parallel_size"): 2},
     "parallel.schedule"),
    ({("parallel", "data_parallel_size"): 16}, "cluster.nodes"),
    ({("parallel", "micro_batch_size"): 0}, "parallel.micro_batch_size"),
    ({("model", "hidden_dropout"): -0.5}, "model.hidden_dropout"),
    ({("parallel", "recompute_granularity"): "partial"}, "parallel.recompute_granularity"),
    ({("run", "mode"): "fast"}, "run.mode"),
])
def test_impossible_combinations_raise_user_error_naming_the_field(overrides, field):
    with pytest.raises(UserError) as info:
        load_scenario(None, overrides)
    assert info.value.field == field


def test_with_overrides_copies_and_validates():
    sc = load_scenario()
    tp2 = with_overrides(sc, parallel={"tensor_model_parallel_size": 2})
    assert tp2.parallel.tp == 2 and sc.parallel.tp == 1
    with pytest.raises(UserError) as info:
        with_overrides(sc, parallel={"tensor_model_parallel_size": 3})
    assert info.value.field == "parallel.tensor_model_parallel_size"


def test_valid_edge_cases_are_accepted():
    load_scenario(None, {("model", "hidden_dropout"): 0.0, ("model", "attention_dropout"): 0.0})
    load_scenario(None, {("model", "hidden_size"): 4, ("model", "num_attention_heads"): 4,
                         ("model", "seq_length"): 1})
    load_scenario(None, {("parallel", "tensor_model_parallel_size"): 8,  # exactly one node
                         ("model", "num_attention_heads"): 8})


# --- Megatron-style flags ---------------------------------------------------------------------

def test_every_flag_is_the_megatron_spelling_of_a_real_field():
    for flag, (section, key, kind, *_) in SCENARIO_FLAGS.items():
        assert flag == "--" + key.replace("_", "-")
        assert key in {f.name for f in dataclasses.fields(SECTIONS[section])}
    for flag, (section, key, *_) in SWITCHES.items():
        assert key in {f.name for f in dataclasses.fields(SECTIONS[section])}


def parse(argv):
    parser = Parser(prog="test")
    add_scenario_arguments(parser)
    return parser.parse_args(argv)


def test_flags_become_overrides_and_absent_flags_do_not():
    args = parse(["--hidden-size", "128", "--sequence-parallel", "--recompute-granularity",
                  "full", "--hidden-dropout", "0"])
    assert overrides_from_args(args) == {
        ("model", "hidden_size"): 128, ("model", "hidden_dropout"): 0.0,
        ("parallel", "sequence_parallel"): True,
        ("parallel", "recompute_granularity"): "full"}
    assert overrides_from_args(parse([])) == {}


def test_no_sequence_parallel_switch_overrides_a_file(tmp_path):
    path = write(tmp_path, "[parallel]\ntensor_model_parallel_size = 2\nsequence_parallel = true\n")
    args = parse([str(path), "--no-sequence-parallel"])
    sc = load_scenario(args.scenario, overrides_from_args(args))
    assert sc.parallel.sequence_parallel is False and sc.parallel.tp == 2
