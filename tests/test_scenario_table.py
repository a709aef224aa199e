"""The scenario field table's guarantees: one row per field, every row's flag parses to its
field, every range (as README's "Limits" table states it) and every choice enforced, the
section dataclasses frozen and typed, and a new row enough to make a new field."""

import dataclasses
from pathlib import Path
import re
import typing

import pytest

from simsp.errors import UserError
from simsp.scenario.config import SECTIONS, Cluster, Model, Parallel, Run, table_dataclass
from simsp.scenario.flags import (ALIASES, HELP_ORDER, SCENARIO_FLAGS, SWITCHES, Parser,
                                  _in_help_order, add_scenario_arguments, overrides_from_args)
from simsp.scenario.loading import load_scenario
from simsp.scenario.table import FIELDS
from simsp.scenario.table.row import Bound, Field

README = Path(__file__).resolve().parents[1] / "README.md"


def parse(argv: list[str]):
    parser = Parser(prog="test")
    add_scenario_arguments(parser)
    return parser.parse_args(argv)


def _kind(annotation) -> type:
    """int, float, str or bool from a dataclass annotation (int | None -> int)."""
    args = typing.get_args(annotation) or (annotation,)
    return next(a for a in args if a is not type(None))


def test_every_field_has_exactly_one_row_and_names_are_unique_across_sections():
    names = [row.name for row in FIELDS]
    assert len(names) == len(set(names))
    for section, cls in SECTIONS.items():
        assert [f.name for f in dataclasses.fields(cls)] == \
            [row.name for row in FIELDS if row.section == section]
    assert {row.section for row in FIELDS} == set(SECTIONS)


def test_the_dataclasses_are_frozen_and_typed():
    """Annotations as the fields were declared by hand before the table (independent list)."""
    hints = {cls: typing.get_type_hints(cls) for cls in (Model, Parallel, Cluster, Run)}
    assert hints[Model]["num_layers"] is int and hints[Model]["hidden_dropout"] is float
    assert hints[Model]["ffn_hidden_size"] == int | None
    assert hints[Model]["moe_layer_freq"] == int | str
    assert hints[Model]["swiglu"] is bool and hints[Model]["normalization"] is str
    assert hints[Parallel]["schedule"] == str | None
    assert hints[Parallel]["fp8_format"] == str | None
    assert hints[Cluster]["system"] == str | None and hints[Cluster]["nodes"] is int
    assert hints[Run]["seed"] is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        Model().num_layers = 4
    for cls in (Model, Parallel, Cluster, Run):
        for f in dataclasses.fields(cls):
            assert f.default is None or isinstance(f.default, typing.get_args(f.type) or f.type)


def test_derived_properties_survive_generation():
    m = Model(hidden_size=96, num_attention_heads=6)
    assert (m.ffn, m.head_dim, m.query_groups) == (384, 16, 6)
    assert Parallel(data_parallel_size=4, micro_batch_size=2).global_batch == 8
    assert Cluster(nodes=3).num_gpus == 24


LIST_FIELDS = {"hierarchical_context_parallel_sizes", "recompute_modules"}  # nargs='*' flags


def _argument(field: dataclasses.Field, choices) -> tuple[list[str], object]:
    """Command-line words for a field and the value they mean (a list flag joins its words)."""
    kind = _kind(field.type)
    if choices:
        return [choices[-1]], choices[-1]
    if field.name in LIST_FIELDS:
        return ["2", "1"], "2 1"
    return {str: (["x"], "x"), float: (["0.5"], 0.5)}.get(kind, (["2"], 2))


def test_every_value_flag_parses_to_its_field():
    """Megatron's spelling (dashes for underscores) of every non-boolean field, given a value,
    becomes exactly the override of that field with the typed value."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if _kind(f.type) is bool:
                continue
            flag = "--" + f.name.replace("_", "-")
            words, value = _argument(f, SCENARIO_FLAGS[flag].choices)
            assert overrides_from_args(parse([flag, *words])) == {(section, f.name): value}, flag


def test_every_switch_sets_one_field_and_aliases_match():
    known = {  # Megatron-LM's spellings whose value is not "on" for a field of the same name
        "--disable-bias-linear": ("model", "add_bias_linear", False),
        "--use-flash-attn": ("model", "attention_backend", "flash"),
        "--no-sequence-parallel": ("parallel", "sequence_parallel", False),
        "--use-distributed-optimizer": ("parallel", "distributed_optimizer", True),
        "--distributed-optimizer": ("parallel", "distributed_optimizer", True),
        "--no-scatter-gather-tensors-in-pipeline":
            ("parallel", "scatter_gather_tensors_in_pipeline", False),
        "--no-accumulate-allreduce-grads-in-fp32":
            ("parallel", "accumulate_allreduce_grads_in_fp32", False),
        "--no-align-param-gather": ("parallel", "align_param_gather", False),
        "--no-align-grad-reduce": ("parallel", "align_grad_reduce", False),
        "--no-masked-softmax-fusion": ("model", "masked_softmax_fusion", False),
        "--no-bias-gelu-fusion": ("model", "bias_gelu_fusion", False),
        "--no-bias-swiglu-fusion": ("model", "bias_swiglu_fusion", False),
        "--no-rope-fusion": ("model", "apply_rope_fusion", False),
    }
    every = list(SWITCHES) + [alias for names in ALIASES.values() for alias in names]
    assert set(known) <= set(every)
    for flag in every:
        (path, value), = overrides_from_args(parse([flag])).items()
        if flag in known:
            assert (*path, value) == known[flag]
        else:  # --swiglu sets swiglu on
            assert path[1] == flag[2:].replace("-", "_") and value is True, flag


def _readme_limits() -> dict[str, tuple[str, str]]:
    """field -> (min, max) as README's "Limits" table writes them."""
    rows = re.findall(r"^\| `(\w+\.\w+)` \| ([^|]+) \| ([^|]+) \|", README.read_text(), re.M)
    return {name: (low.strip(), high.strip()) for name, low, high in rows}


def _outside(kind: type, low: str, high: str) -> list:
    """Values just outside [low, high] for a field of `kind`."""
    if kind is int:
        return [int(low) - 1, int(high) + 1]
    below = float(low) - 1 if float(low) == 0 else float(low) / 2
    return [below, float(high) * 2]


def test_every_range_in_the_readme_is_enforced_on_both_sides():
    limits = _readme_limits()
    assert len(limits) > 40
    kinds = {f"{s}.{f.name}": _kind(f.type) for s, cls in SECTIONS.items()
             for f in dataclasses.fields(cls)}
    for name, (low, high) in limits.items():
        section, key = name.split(".")
        for value in _outside(int if kinds[name] in (int, str) else float, low, high):
            with pytest.raises(UserError) as caught:
                load_scenario(None, {(section, key): value})
            assert str(caught.value).startswith(f"{name}: {value} is outside [{low}, {high}]")
        inside = int(high) if kinds[name] is not float else float(high)
        try:
            load_scenario(None, {(section, key): inside, ("run", "mode"): "meta"})
        except UserError as error:  # a cross-field rule may refuse it, the range does not
            assert "is outside" not in str(error), name


def test_every_choice_is_enforced_from_a_scenario_file():
    for flag, row in SCENARIO_FLAGS.items():
        if not row.choices:
            continue
        with pytest.raises(UserError) as caught:
            load_scenario(None, {(row.section, row.key): "bogus"})
        assert str(caught.value) == (f"{row.section}.{row.key}: must be one of "
                                     f"{', '.join(row.choices)}, got 'bogus'")
        for choice in row.choices:
            try:
                load_scenario(None, {(row.section, row.key): choice, ("run", "mode"): "meta"})
            except UserError as error:
                assert "must be one of" not in str(error), (flag, choice)


def test_help_order_names_only_real_flags_and_a_new_flag_comes_after_them():
    assert len(HELP_ORDER) == len(set(HELP_ORDER))
    assert set(HELP_ORDER) <= set(SCENARIO_FLAGS) | set(SWITCHES)
    assert list(_in_help_order({"--zeta": 1, "--seed": 2, "--alpha": 3, "--num-layers": 4})) == \
        ["--num-layers", "--seed", "--zeta", "--alpha"]


def test_a_new_row_is_a_typed_frozen_field_after_the_others():
    """What a newcomer's row gives: a field of that type and default, in row order."""
    rows = (Field("toy", "width", int, 8, "toy width", "w", bound=Bound(1, 64, "elements", "")),
            Field("toy", "label", str, None, "toy label"))

    class Toy:
        @property
        def double(self) -> int:
            return 2 * self.width

    toy = table_dataclass(Toy, rows)
    assert [f.name for f in dataclasses.fields(toy)] == ["width", "label"]
    assert typing.get_type_hints(toy) == {"width": int, "label": str | None}
    assert (toy().width, toy().label, toy(width=3).double) == (8, None, 6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        toy().width = 2


@pytest.mark.parametrize("rows", [
    (Field("toy", "width", int, 8), Field("toy", "width", int, 4)),  # a field twice
    (Field("toy", "double", int, 8),),  # a field named as a property
])
def test_a_clashing_row_fails_at_import(rows):
    class Toy:
        @property
        def double(self) -> int:
            return 2

    with pytest.raises(TypeError, match="toy"):
        table_dataclass(Toy, rows)


def test_every_numeric_field_has_a_row_in_the_readme_limits():
    limits = _readme_limits()
    numeric = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)
               if _kind(f.type) in (int, float)]
    assert len(numeric) > 50
    assert [name for name in numeric if name not in limits] == []
