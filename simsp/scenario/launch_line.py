"""A Megatron-LM launch line pasted into `--megatron-args` (or read from `--megatron-args-file`):
the flags simsp models become scenario overrides, torchrun's --nnodes x --nproc-per-node the
GPUs, the flags simsp does not model are named in one note line, an unknown flag is refused
with "did you mean" (README "Start from your own launch line")."""

import difflib
import shlex
from typing import NamedTuple

from simsp import io_in
from simsp.errors import UserError
from simsp.scenario import flags
from simsp.scenario.megatron_flags import KNOWN, LAUNCHER_WORLD, TOKENIZER_FLAGS, TRAINING_ONLY

WHERE = "--megatron-args"
# Megatron's flag values simsp has no row for, read as what they run (none now: every
# --attention-backend value of megatron/core/transformer/enums.py AttnBackend is a row)
READ_AS: dict = {}


class LaunchLine(NamedTuple):
    """What a launch line says: the overrides of the flags simsp models ({(section, key):
    value}, the launcher's nodes and GPUs per node among them) and the flags it ignores."""

    overrides: dict
    training_only: tuple  # Megatron's (and the launcher's) flags that change no iteration
    not_modelled: tuple  # Megatron's flags that may change time or memory, not simulated
    read_as: tuple = ()  # 'flag value as simsp-value' for the values READ_AS translates
    tokenizer: str = ""  # the tokenizer flag that sets Megatron's vocabulary, if not --vocab-size

    def note(self) -> str | None:
        """The one note line naming every ignored flag, None when none was ignored."""
        if not (self.training_only or self.not_modelled or self.read_as or self.tokenizer):
            return None
        count = len(self.training_only) + len(self.not_modelled)
        parts = [f"ignored {count} flag(s) simsp does not simulate:" if count else "",
                 f"training-only {' '.join(self.training_only)};" if self.training_only else "",
                 f"not modelled {' '.join(self.not_modelled)};" if self.not_modelled else "",
                 f"read {', '.join(self.read_as)};" if self.read_as else "",
                 f"the vocabulary Megatron reads from {self.tokenizer} is not read: simsp uses "
                 "--vocab-size (the scenario's unless given)" if self.tokenizer else ""]
        return f"note: {WHERE}: " + " ".join(part for part in parts if part).rstrip(";")


def simsp_flags() -> frozenset:
    """Every scenario flag simsp models, under every spelling (value flags, switches, aliases)."""
    aliases = {alias for names in flags.ALIASES.values() for alias in names}
    return frozenset(flags.SCENARIO_FLAGS) | frozenset(flags.SWITCHES) | aliases


def suggestion(name: str, candidates) -> str:
    """' (did you mean --x?)' from difflib's closest match among `candidates`, else ''."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def read_launch_text(args) -> str | None:
    """The launch line of --megatron-args, or the text of --megatron-args-file (simsp.io_in)."""
    text, path = getattr(args, "megatron_args", None), getattr(args, "megatron_args_file", None)
    if text is not None and path is not None:
        raise UserError("--megatron-args", "conflicts with --megatron-args-file (give one)")
    return io_in.read_text(path, "launch line") if path is not None else text


def split_words(text: str) -> list[str]:
    """The shell words of a launch line: backslash-newline joins lines, # starts a comment."""
    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise UserError(WHERE, f"cannot split into words: {exc}") from None


def _script_index(words: list[str]) -> int:
    """Index of the training script (the first word ending in .py), -1 when there is none."""
    return next((i for i, word in enumerate(words) if word.endswith(".py")), -1)


def _groups(words: list[str]) -> list[tuple[str, list[str]]]:
    """[(flag, [its words: the flag itself and the values after it])] of a flags-only tail."""
    found = []
    for word in words:
        if word.startswith("--"):
            found.append((word.split("=", 1)[0], [word]))
        elif not found:
            raise UserError(WHERE, f"unexpected word {word!r} before the first flag (a launch "
                                   "line is `[torchrun ...] script.py --flag value ...`)")
        else:
            found[-1][1].append(word)
    return found


def _launcher_world(words: list[str]) -> tuple[dict, list[str]]:
    """torchrun's nodes and GPUs per node ({(cluster, key): N}) and its other flags' names; the
    program name and any VAR=value settings before its first flag are dropped."""
    world, others = {}, []
    start = next((i for i, word in enumerate(words) if word.startswith("--")), len(words))
    for flag, group in _groups(words[start:]):
        key = LAUNCHER_WORLD.get(flag)
        if key is None:
            others.append(flag)
            continue
        value = group[0].split("=", 1)[1] if "=" in group[0] else " ".join(group[1:2])
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"{WHERE} {flag}", f"must be a positive whole number, got {value!r}")
        world[("cluster", key)] = int(value)
    return world, others


def parse_launch_line(text: str) -> LaunchLine:
    """Split a launch line into simsp's overrides and the ignored flags; refuse unknown flags."""
    words = split_words(text)
    script = _script_index(words)
    if script < 0 and words and not words[0].startswith("--"):
        raise UserError(WHERE, f"no training script (a word ending in .py) and {words[0]!r} is "
                               "not a flag")
    world, launcher = _launcher_world(words[:script]) if script >= 0 else ({}, [])
    modelled = simsp_flags()
    used, training, other, read_as = [], list(launcher), [], []
    for flag, group in _groups(words[script + 1:]):
        if flag in modelled:
            used += _translated(flag, group, read_as)
        elif flag in KNOWN:
            (training if flag in TRAINING_ONLY else other).append(flag)
        else:
            raise UserError(WHERE, f"unknown flag {flag}"
                                   + suggestion(flag, modelled | KNOWN | set(LAUNCHER_WORLD)))
    overrides = {**world, **flags.overrides_from_args(_LineParser().parse_args(used))}
    tokenizer = "" if ("model", "vocab_size") in overrides else next(
        (flag for flag in training if flag in TOKENIZER_FLAGS), "")
    return LaunchLine(overrides, tuple(dict.fromkeys(training)), tuple(dict.fromkeys(other)),
                      tuple(read_as), tokenizer)


def _translated(flag: str, group: list[str], read_as: list[str]) -> list[str]:
    """A modelled flag's words with READ_AS's values replaced (each replacement noted)."""
    table = READ_AS.get(flag, {})
    words = []
    for word in group:
        name, equals, value = word.partition("=") if word.startswith("--") else ("", "", word)
        if value in table:
            read_as.append(f"{flag} {value} as {table[value]}")
            word = f"{name}={table[value]}" if equals else table[value]
        words.append(word)
    return words


class _LineParser(flags.Parser):
    """The scenario flags under `run`'s strict rules, whose errors name --megatron-args."""

    def __init__(self):
        super().__init__(prog=WHERE, add_help=False)
        flags.add_scenario_flags(self)

    def error(self, message):
        """argparse's error: one UserError naming the pasted line, instead of exiting."""
        raise UserError(WHERE, message)
