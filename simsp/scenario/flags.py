"""Megatron-LM-style flags that override any scenario field, made from the field table
(simsp/scenario/table/), and the argparse plumbing for them.

The command line is a contract: no abbreviations, a flag given twice is an error, an empty
argument is an error, and every flag's --help gives its meaning, unit and default.
"""

import argparse
import difflib
from pathlib import Path
import sys
from typing import NamedTuple

from simsp.errors import UserError, one_line
from simsp.scenario.table import FIELDS
from simsp.scenario.table.row import INT_OR_STR


class Flag(NamedTuple):
    """A value flag as argparse takes it: the field it sets, the argparse type, its choices, its
    help and its report-folder token (simsp/scenario/table/row.py Field says what each holds)."""

    section: str
    key: str
    kind: type
    choices: tuple | None = None
    help: str = ""
    token: str | None = ""


# The order `--help` has always listed the flags in (the help text is a contract, byte for
# byte): the value flags, then the switches. A flag not listed here comes after the listed ones,
# in table order, so a new field needs only its row.
HELP_ORDER = (
    "--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--vocab-size",
    "--make-vocab-size-divisible-by", "--ffn-hidden-size", "--hidden-dropout",
    "--attention-dropout", "--num-query-groups", "--kv-channels", "--normalization",
    "--norm-epsilon", "--position-embedding-type", "--rotary-base", "--rotary-percent",
    "--attention-backend", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-router-score-function", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--moe-layer-freq", "--moe-expert-capacity-factor", "--moe-shared-expert-intermediate-size",
    "--moe-routing-imbalance", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--moe-token-dispatcher-type", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--mtp-num-layers", "--mtp-loss-scaling-factor",
    "--micro-batch-size", "--global-batch-size", "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size", "--data-parallel-size", "--context-parallel-size",
    "--cp-comm-type", "--hierarchical-context-parallel-sizes", "--data-parallel-sharding-strategy",
    "--cpu-offloading-num-layers", "--num-layers-per-virtual-pipeline-stage", "--schedule",
    "--ddp-bucket-size", "--recompute-method", "--recompute-num-layers", "--recompute-granularity",
    "--fp8-format", "--fp8-recipe", "--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
    "--exp-avg-sq-dtype", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
    "--recompute-modules", "--nodes", "--gpus-per-node", "--gpu", "--system",
    "--nvlink-bandwidth-GBps", "--ib-bandwidth-GBps", "--nvlink-latency-us", "--ib-latency-us",
    "--nvlink-efficiency", "--ib-efficiency", "--transfer-overhead-us", "--nccl-algo",
    "--nccl-proto", "--mode", "--seed", "--numeric-dtype", "--name",
    "--group-query-attention", "--swiglu", "--moe-pad-expert-input-to-capacity",
    "--multi-latent-attention", "--moe-grouped-gemm", "--moe-enable-deepep", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--use-flash-attn", "--sequence-parallel", "--no-sequence-parallel",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--use-distributed-optimizer", "--overlap-p2p-communication",
    "--no-scatter-gather-tensors-in-pipeline", "--overlap-grad-reduce", "--overlap-param-gather",
    "--accumulate-allreduce-grads-in-fp32", "--no-accumulate-allreduce-grads-in-fp32",
    "--fp8-param-gather", "--use-precision-aware-optimizer", "--use-megatron-fsdp",
    "--use-torch-fsdp2", "--cpu-offloading",
)

# --moe-layer-freq: N, or Megatron's pattern string
_ARGPARSE_TYPE = {INT_OR_STR: lambda text: int(text) if text.isdigit() else text}


def _in_help_order(flags: dict) -> dict:
    """`flags` ({flag: entry}, in table order) reordered as HELP_ORDER lists them."""
    listed = {flag: flags[flag] for flag in HELP_ORDER if flag in flags}
    return {**listed, **{flag: entry for flag, entry in flags.items() if flag not in listed}}


def _value_flags() -> dict[str, Flag]:
    """flag -> Flag for every non-boolean field of the table."""
    return {row.flag: Flag(row.section, row.name, _ARGPARSE_TYPE.get(row.kind, row.kind),
                           row.choices, row.help, row.token)
            for row in FIELDS if row.flag is not None}


def _switch_flags() -> dict[str, tuple]:
    """flag -> (section, key, value, help, token) for every switch of the table."""
    return {switch.flag: (row.section, row.name, switch.value, switch.help, switch.token)
            for row in FIELDS for switch in row.switches}


# Every field of every scenario section has a value flag here or a switch in SWITCHES, and
# `run`, `layer`, `sweep` and `search` all build their flags, help and defaults from these
# (tests/test_field_table.py). A new field: add its row to simsp/scenario/table/.
SCENARIO_FLAGS = _in_help_order(_value_flags())  # flag -> Flag
SWITCHES = _in_help_order(_switch_flags())  # flag -> (section, key, value, help, token)
ALIASES = {switch.flag: switch.aliases for row in FIELDS for switch in row.switches
           if switch.aliases}  # older spellings of a switch
LIST_FLAGS = tuple(row.flag for row in FIELDS if row.words)  # Megatron's nargs='*' flags
_DEFAULTS = {(row.section, row.name): row.default for row in FIELDS}


class Parser(argparse.ArgumentParser):
    """ArgumentParser with no abbreviations, no repeated flags and no usage dump: every error is
    one `error:` line and exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        sys.stderr.write(f"error: {one_line(message)}\n")
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):
        """argparse's parse_args, with a "did you mean" after an unrecognized flag."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       + _did_you_mean(extras, _option_names(self, parsed)))
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        """Refuse a flag given twice (under any of its names) before argparse keeps the last."""
        argv = sys.argv[1:] if args is None else list(args)
        self._refuse_empty(argv)
        seen, dests = {}, {}
        for token in argv:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is not None and action in seen:
                self.error(f"argument {seen[action]}: given more than once")
            if action is not None and dests.get(action.dest, action) is not action:
                self.error(f"argument {name}: conflicts with {seen[dests[action.dest]]}")
            if action is not None:
                seen[action] = name
                dests[action.dest] = action
        return super().parse_known_args(argv, namespace)

    def _refuse_empty(self, argv: list[str]) -> None:
        """An empty argument never means "not given": `--out ''` or `--out=` is an error."""
        for index, token in enumerate(argv):
            name, equals, value = token.partition("=")
            if token.startswith("--") and equals and value == "":
                self.error(f"argument {name}: must not be empty")
            if token == "":
                before = argv[index - 1] if index else ""
                if before.startswith("-") and "=" not in before:
                    self.error(f"argument {before}: must not be empty")
                if self._subparsers is None:  # the command's own parser names its positional
                    self.error(f"argument {self._positional_name()}: must not be empty")

    def _positional_name(self) -> str:
        """How argparse names this parser's first positional argument (SCENARIO, FILE...)."""
        for action in self._positionals._group_actions:
            return action.metavar or action.dest
        return "(an empty word)"


def _option_names(parser: argparse.ArgumentParser, parsed) -> set[str]:
    """Every option string of `parser` and of the subcommand parsers `parsed` chose."""
    names = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
            names |= _option_names(chosen, parsed) if chosen is not None else set()
    return names


def _did_you_mean(extras: list[str], names: set[str]) -> str:
    """' (did you mean --x?)' for the first unrecognized flag close to a known one, else ''."""
    for word in extras:
        close = difflib.get_close_matches(word.split("=", 1)[0], sorted(names), n=1)
        if word.startswith("-") and close:
            return f" (did you mean {close[0]}?)"
    return ""


def nonempty(text: str) -> str:
    """argparse type for free text (paths): an empty string is an error, not 'use the default'."""
    if text == "":
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _row(flag: str) -> Flag:
    return SCENARIO_FLAGS[flag]


def _switch(flag: str) -> tuple:
    """A SWITCHES entry: (section, key, value, help, token)."""
    return SWITCHES[flag]


def _dest(flag: str) -> str:
    return "scn_" + flag.lstrip("-").replace("-", "_")


def _default_text(section: str, key: str) -> str:
    """'; default: X' from the table's default, '' when the default is None (said in help)."""
    default = _DEFAULTS[(section, key)]
    return "" if default is None else f"; default: {default}"


def _switch_default(flag: str) -> str:
    """'on' when the field's default is the value this switch sets, else 'off'."""
    section, key, value = _switch(flag)[:3]
    default = _DEFAULTS[(section, key)]
    return "on" if default == value else "off"


def _metavar(row: Flag) -> str | None:
    if row.choices:
        return "{" + ",".join(row.choices) + "}"
    return {int: "N", float: "X"}.get(row.kind, "TEXT")


def flag_help(flag: str) -> str:
    """The --help text of a scenario flag: meaning and unit, default, and the scenario key."""
    row = _row(flag)
    meaning = row.help or row.key.replace("_", " ")
    return f"{meaning}{_default_text(row.section, row.key)} [{row.section}.{row.key}]"


def switch_help(flag: str) -> str:
    """The --help text of a switch: meaning, whether it is on by default, the scenario key."""
    section, key, _, meaning, _ = _switch(flag)
    return (f"{meaning or key.replace('_', ' ')}; default: {_switch_default(flag)} "
            f"[{section}.{key}]")


def add_scenario_flags(group) -> None:
    """Add every Megatron-style override flag of the field table to a parser or group."""
    for flag in SCENARIO_FLAGS:
        row = _row(flag)
        group.add_argument(flag, dest=_dest(flag), type=row.kind, choices=row.choices,
                           default=None, metavar=_metavar(row), help=flag_help(flag),
                           nargs="+" if flag in LIST_FLAGS else None)
    for flag in SWITCHES:
        group.add_argument(flag, *ALIASES.get(flag, ()), dest=_dest(flag), action="store_true",
                           help=switch_help(flag))


def add_scenario_arguments(parser: argparse.ArgumentParser, positional: bool = True,
                           outside: bool = True) -> None:
    """Add the optional scenario file, every Megatron-style override flag, --world-size, the
    pasted launch line and Hugging Face config (unless not `outside`), and --force."""
    if positional:
        parser.add_argument("scenario", nargs="?", type=nonempty, metavar="SCENARIO",
                            help="scenario TOML file (default: the built-in small GPT)")
    group = parser.add_argument_group("scenario overrides (Megatron-LM flags)")
    add_scenario_flags(group)
    group.add_argument("--world-size", dest="world_size", type=int, default=None, metavar="N",
                       help="total GPUs; derives d = N / (t x cp x p) as Megatron does, and "
                            "the nodes = N / GPUs per node unless --nodes is given (default: the "
                            "scenario's d and nodes)")
    if outside:
        _add_outside_sources(parser)
    parser.add_argument("--force", action="store_true",
                        help="run even if the estimated time is above the limit (never lifts "
                             "the memory limit; see README 'Limits')")


def _add_outside_sources(parser: argparse.ArgumentParser) -> None:
    """--megatron-args, --megatron-args-file and --hf-config (README "Start from your own
    launch line"); flags given directly override them."""
    group = parser.add_argument_group("start from your own configuration")
    group.add_argument("--megatron-args", type=nonempty, metavar="LINE", default=None,
                       help="a whole Megatron-LM launch line ('torchrun ... pretrain_gpt.py "
                            "--num-layers 96 ...'): the flags simsp models are used, torchrun's "
                            "--nnodes x --nproc-per-node set the GPUs, training-only flags are "
                            "named in one note line")
    group.add_argument("--megatron-args-file", type=nonempty, metavar="FILE", default=None,
                       help="the same, read from a file (backslash-newlines and # comments as "
                            "in a shell script)")
    group.add_argument("--hf-config", type=nonempty, metavar="FILE", default=None,
                       help="a Hugging Face config.json (Llama, Mistral/Mixtral, Qwen2/3, "
                            "DeepSeek-V3) read into the [model] section")


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The {(section, key): value} overrides the user gave on the command line."""
    found = {}
    for flag in SCENARIO_FLAGS:
        value = getattr(args, _dest(flag), None)
        if isinstance(value, list):
            value = " ".join(value)
        if value is not None:
            row = _row(flag)
            found[(row.section, row.key)] = value
    for flag in SWITCHES:
        section, key, value, _, _ = _switch(flag)
        if getattr(args, _dest(flag), False):
            found[(section, key)] = value
    if getattr(args, _dest("--sequence-parallel")) and getattr(args, _dest("--no-sequence-parallel")):
        raise UserError("--sequence-parallel", "conflicts with --no-sequence-parallel")
    backend = getattr(args, _dest("--attention-backend"), None)
    if getattr(args, _dest("--use-flash-attn"), False) and backend not in (None, "flash"):
        raise UserError("--use-flash-attn", f"conflicts with --attention-backend {backend}")
    return found


def override_tokens(args: argparse.Namespace) -> list[str]:
    """One short token per override in flag-table order (t4, p16, rc-full, sp, w64): names the
    default report folder, so variants never overwrite each other."""
    tokens = []
    for flag in SCENARIO_FLAGS:
        value = getattr(args, _dest(flag), None)
        if isinstance(value, list):
            value = "-".join(value)
        if value is not None and _row(flag).token is not None:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            text = Path(text).stem if "/" in text else text  # a profile's path: its name
            tokens.append(f"{_row(flag).token}{text}")
    tokens += [_switch(f)[4] for f in SWITCHES if getattr(args, _dest(f), False)]
    if getattr(args, "world_size", None) is not None:
        tokens.append(f"w{args.world_size}")
    return tokens
