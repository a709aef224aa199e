"""Megatron-LM's --moe-layer-freq pattern string, parsed into its per-layer 0/1 list."""

import functools
import re

MAX_LAYERS = 4096  # num_layers' limit (scenario/table/model.py): a longer pattern cannot match
MAX_TEXT = 65536  # characters; a pattern of 4096 layers written out is ~12,000
MAX_DEPTH = 64  # nested parentheses; Megatron's patterns use one or two


@functools.lru_cache(maxsize=64)
def moe_layer_pattern(text: str) -> tuple[int, ...]:
    """Megatron's --moe-layer-freq pattern, e.g. "([0]*3+[1]*58)" or "([1]*3+[0]*1)*3", as its
    per-layer 0/1 list (arguments.py moe_freq_type evaluates it as a Python list expression;
    simsp parses lists, +, * by an integer and parentheses only, never evaluating Python,
    and stops as soon as the pattern would exceed MAX_LAYERS layers or MAX_DEPTH nested
    parentheses). ValueError if malformed or too large."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"is {len(text)} characters, above the {MAX_TEXT} a pattern may have")
    tokens = re.findall(r"\d+|[\[\]()+*,]|\S", text.replace(" ", ""))
    values, end = _pattern_sum(tokens, 0, 0)
    if end != len(tokens):
        raise ValueError(f"unexpected {''.join(tokens[end:])!r}")
    return tuple(values)


def _pattern_sum(tokens: list, i: int, depth: int) -> tuple[list, int]:
    """Terms joined by +, from token i: their concatenated values and the next token's index."""
    values, i = _pattern_term(tokens, i, depth)
    while i < len(tokens) and tokens[i] == "+":
        more, i = _pattern_term(tokens, i + 1, depth)
        values = _bounded(values + more)
    return values, i


def _bounded(values: list) -> list:
    """The values, or ValueError once they exceed MAX_LAYERS (checked before any list grows)."""
    if len(values) > MAX_LAYERS:
        raise ValueError(f"gives more than {MAX_LAYERS} layers (the most num_layers allows)")
    return values


def _pattern_term(tokens: list, i: int, depth: int) -> tuple[list, int]:
    """A parenthesised sum or a [0/1, ...] list, each repeated by any * N that follows."""
    if i < len(tokens) and tokens[i] == "(":
        if depth >= MAX_DEPTH:
            raise ValueError(f"nests parentheses deeper than {MAX_DEPTH}")
        values, i = _pattern_sum(tokens, i + 1, depth + 1)
        if i >= len(tokens) or tokens[i] != ")":
            raise ValueError("unbalanced parentheses")
        i += 1
    elif i < len(tokens) and tokens[i] == "[":
        values, i = [], i + 1
        while i < len(tokens) and tokens[i] != "]":
            if not tokens[i].isdigit() or int(tokens[i]) not in (0, 1):
                raise ValueError(f"list items must be 0 or 1, got {tokens[i]!r}")
            values = _bounded(values + [int(tokens[i])])
            i += 2 if i + 1 < len(tokens) and tokens[i + 1] == "," else 1
        if i >= len(tokens):
            raise ValueError("unclosed [")
        i += 1
    else:
        raise ValueError(f"expected [ or ( at {''.join(tokens[i:]) or 'the end'!r}")
    while i + 1 < len(tokens) and tokens[i] == "*" and tokens[i + 1].isdigit():
        times = int(tokens[i + 1])
        if values and times > MAX_LAYERS:
            raise ValueError(f"repeats {times} times, more than {MAX_LAYERS} layers")
        values, i = _bounded(values * times), i + 2
    return values, i
