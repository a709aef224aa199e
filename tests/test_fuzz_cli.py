"""Fuzzing the real command line in-process: random scenario files (valid and broken: wrong types,
nan/inf, huge numbers, unknown keys, path-like names) and random flags (repeated, empty,
abbreviated, odd sizes). Whatever the input: no traceback; exit 0/1 with strict JSON on stdout
when --json; or exit 2 with exactly one `error:` line; nothing written outside the folder."""

import json
import os
from pathlib import Path
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from inprocess import cli

MAX_EXAMPLES = 200

NUMBERS = st.one_of(
    st.integers(-3, 9), st.sampled_from([0, 1, 2, 4, 8, 16, 64, 10**30, 2**63 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-300, 0.5, 1.0, 300.0]))
WRONG_TYPES = st.one_of(st.booleans(), st.text(max_size=5), st.lists(st.integers(0, 3),
                                                                      max_size=2))
VALUES = st.one_of(NUMBERS, WRONG_TYPES)
KEYS = {
    "model": ["num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
              "ffn_hidden_size", "hidden_dropout", "attention_dropout", "hiden_size"],
    "parallel": ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "data_parallel_size", "micro_batch_size", "global_batch_size",
                 "sequence_parallel", "recompute_granularity", "schedule",
                 "num_layers_per_virtual_pipeline_stage", "distributed_optimizer"],
    "cluster": ["nodes", "gpus_per_node", "nvlink_bandwidth_GBps", "ib_bandwidth_GBps",
                "nvlink_latency_us", "ib_latency_us", "nvlink_efficiency", "transfer_overhead_us"],
    "run": ["seed", "numeric_dtype", "modes"],
}
NAMES = st.sampled_from(["/ESCAPE/abs", "../../escape", "../../../ESCAPE", "", "..", ".", "a/b",
                         "ok-name", "nul\x01name", "ü/../x", "~"])

INT_FLAGS = ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
             "--vocab-size", "--micro-batch-size", "--global-batch-size",
             "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
             "--data-parallel-size", "--nodes", "--seed", "--world-size"]
FLAG_VALUES = st.sampled_from(["1", "2", "4", "8", "0", "-1", "", "1_024", "\u0661", "nan", "inf",
                               "1e3", str(10**30), "4096", "abc"])
CHOICE_FLAGS = [("--recompute-granularity", ["none", "selective", "full", "full", "", "some"]),
                ("--schedule", ["gpipe", "1f1b", "1f1b", "zigzag"])]
SWITCHES = ["--sequence-parallel", "--no-sequence-parallel", "--use-distributed-optimizer",
            "--distributed-optimizer", "--force", "--glob", "--num-lay", "--seq", ""]
SIZES = st.sampled_from(["8", "1K", "1M", "4G", "1_024", "0", "-8", "", "1.5M", "12", "1B", "2T",
                         "1" + "0" * 309, "\u0661\u0660\u0662\u0664", "8KiB", "64k"])


@st.composite
def scenario_text(draw) -> str:
    """A TOML scenario: a small valid model in meta mode, then random (often broken) fields."""
    text = {"model": {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2,
                      "seq_length": 8, "vocab_size": 16},
            "parallel": {}, "cluster": {}, "run": {"mode": "meta", "name": draw(NAMES)}}
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from(sorted(KEYS)))
        text[section][draw(st.sampled_from(KEYS[section]))] = draw(VALUES)
    return "\n".join(f"[{section}]\n" + "".join(f"{key} = {_toml(value)}\n"
                                                for key, value in body.items())
                     for section, body in text.items())


def _toml(value) -> str:
    """A TOML literal for a Python value (nan and inf as TOML writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value > 0 else "-inf") \
            if abs(value) == float("inf") else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


@st.composite
def flags(draw) -> list[str]:
    """Random scenario flags: values good and bad, repeats, abbreviations, empty strings."""
    argv = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 2))
        if kind == 0:
            argv += [draw(st.sampled_from(INT_FLAGS)), draw(FLAG_VALUES)]
        elif kind == 1:
            flag, choices = draw(st.sampled_from(CHOICE_FLAGS))
            argv += [flag, draw(st.sampled_from(choices))]
        else:
            argv.append(draw(st.sampled_from(SWITCHES)))
    return argv


@st.composite
def command_line(draw) -> tuple[list[str], bool]:
    """(argv, wants_json): run/layer on a scenario file, or ring with random sizes."""
    wants_json = draw(st.booleans())
    command = draw(st.sampled_from(["run", "run", "layer", "ring"]))
    if command == "ring":
        argv = ["ring", "--ranks", draw(st.sampled_from(["2", "4", "8", "3", "0", "16"])),
                "--size", draw(SIZES)]
        argv += draw(st.sampled_from([[], ["--explain"], ["--size", "8"]]))
    else:
        argv = [command, "SCENARIO", *draw(flags())]
        argv += draw(st.sampled_from([[], [], ["--out", "OUT"], ["--out", ""], ["--out", "../up"]])) \
            if command == "run" else []
    return argv + (["--json"] if wants_json else []), wants_json


def _strict_json(text: str):
    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def check_outcome(argv, wants_json, rc, out, err) -> None:
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if rc == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), \
            (argv, err)
        assert out == "", (argv, out)
        return
    assert rc in (0, 1), (argv, rc, err)
    if wants_json:
        _strict_json(out)


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scenario_text(), command_line())
def test_random_input_never_crashes_or_escapes(text, line):
    argv, wants_json = line
    with tempfile.TemporaryDirectory() as base:
        base = Path(base)
        work = base / "a" / "b" / "work"
        work.mkdir(parents=True)
        (base / "s.toml").write_text(text.replace("ESCAPE", str(base / "escape")[1:]))
        argv = [str(base / "s.toml") if a == "SCENARIO" else str(work / "out") if a == "OUT"
                else a for a in argv]
        before = _files_under(base)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            rc, out, err = cli(argv)
        finally:
            os.chdir(cwd)
        check_outcome(argv, wants_json, rc, out, err)
        new = _files_under(base) - before
        allowed = (work / "reports", work / "out", work.parent / "up")
        assert all(any(p == a or a in p.parents for a in allowed) for p in new), (argv, new)
        if wants_json and "--out" not in argv:
            assert not (work / "reports").exists(), argv
