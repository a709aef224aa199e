"""--pipeline-model-parallel-layout: every virtual stage's layers, parsed and checked as
Megatron-LM does (megatron/core/transformer/pipeline_parallel_layer_layout.py,
PipelineParallelLayerLayout.parse_str_to_list and validate_layer_layout; docs/pipeline-layout.md).

`E` embedding, `t` transformer layer, `m` MTP depth, `L` loss; `|` between virtual stages;
`(...)*n` and `x*n` repeat; commas are cosmetic. Virtual stage k of the flat list is
(pp rank k mod p, model chunk k div p), the order simsp's pipeline_split uses too."""

import functools
import re

from simsp.errors import UserError

FIELD = "parallel.pipeline_model_parallel_layout"
SYMBOLS = "ELtm"  # Megatron's char2layer_type: embedding, loss, decoder, mtp
# Megatron's two unrolling patterns, applied in this order: (...)*n, then x*n
_REPEATS = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")
MAX_SYMBOLS = 1 << 20  # simsp's cap on the unrolled string (a guard against `t*99999999999`)


@functools.lru_cache(maxsize=64)
def parse_layout(text: str) -> tuple[str, ...]:
    """The layout string as one string of symbols per virtual stage, in flat order k."""
    flat = text.replace(",", "")
    for pattern in _REPEATS:
        grown = [len(flat)]  # the unrolled length so far, checked before each copy is made
        flat = re.sub(pattern, lambda match: _unrolled(match, grown), flat)
    stages = tuple(flat.split("|"))
    for stage in stages:
        bad = next((c for c in stage if c not in SYMBOLS), None)
        if bad is not None:
            raise UserError(FIELD, f"invalid layer character {bad!r} in stage {stage!r} "
                                   f"(known: E, L, t, m)")
    return stages


def _unrolled(match: re.Match, grown: list) -> str:
    """One `(...)*n` or `x*n` written out n times; the whole string refused past MAX_SYMBOLS."""
    grown[0] += len(match.group(1)) * int(match.group(2)) - len(match.group(0))
    if grown[0] > MAX_SYMBOLS:
        raise UserError(FIELD, f"unrolls to more than {MAX_SYMBOLS} symbols (at "
                               f"{match.group(0)[:40]!r})")
    return match.group(1) * int(match.group(2))


def layout_chunks(text: str, pp: int) -> int:
    """Virtual stages per pipeline rank: the stage count over p (Megatron arguments.py)."""
    stages = parse_layout(text)
    if len(stages) % pp:
        raise UserError(FIELD, f"{len(stages)} virtual stages are not divisible by "
                               f"pipeline_model_parallel_size={pp}")
    return len(stages) // pp


def validate_layout(text: str, pp: int, num_layers: int, mtp_num_layers: int | None) -> None:
    """Megatron's validate_layer_layout, plus simsp's placement: the embedding in virtual stage
    0 and the loss in the last; the MTP depths off the first pipeline rank."""
    stages, chunks = parse_layout(text), layout_chunks(text, pp)
    flat = "".join(stages)
    _check(flat[:1] == "E", f"the first layer must be the embedding E, got {flat[:1]!r}")
    _check(flat[-1:] == "L", f"the last layer must be the loss L, got {flat[-1:]!r}")
    _check(flat.count("E") == 1, "the embedding E must be given exactly once")
    _check(flat.count("L") == 1, "the loss L must be given exactly once")
    _check(flat.count("t") == num_layers, f"{flat.count('t')} transformer layers t, but "
                                          f"num_layers={num_layers}")
    _check(flat.count("m") == (mtp_num_layers or 0), f"{flat.count('m')} MTP layers m, but "
                                                    f"mtp_num_layers={mtp_num_layers}")
    _check("m" not in flat or "t" not in flat[flat.index("m"):],
           "decoder layers must be placed before MTP layers")
    _check(all("m" not in stages[c * pp + r] for r in range(pp) for c in range(chunks - 1)),
           "MTP must be in the last virtual stage of its pipeline rank (Megatron)")
    _check("m" not in flat or max(s.count("m") for s in stages) == flat.count("m"),
           "all MTP layers must be in one virtual stage (Megatron)")
    _check("E" in stages[0], "simsp needs the embedding E in the first virtual stage")
    _check("L" in stages[-1], "simsp needs the loss L in the last virtual stage")
    _check(pp == 1 or all("m" not in stages[c * pp] for c in range(chunks)),
           "MTP must not be on the first pipeline rank (Megatron's restriction; there its "
           "copy of the word embedding would stay out of the embedding group)")


def standalone_mtp_stage(text: str | None) -> int | None:
    """The virtual stage of Megatron's standalone MTP (the depths in a stage of their own
    before the loss's: `mtp_standalone`, validate_layer_layout), or None."""
    if text is None:
        return None
    stages = parse_layout(text)
    return next((k for k, stage in enumerate(stages[:-1]) if "m" in stage), None)


def last_decoder_stage(text: str) -> int:
    """The virtual stage holding the last transformer layer t (with MTP Megatron builds the
    decoder's final norm there: TransformerBlock.has_final_layernorm_in_this_stage)."""
    stages = parse_layout(text)
    return max(k for k, stage in enumerate(stages) if "t" in stage)


def _check(condition: bool, reason: str) -> None:
    """One `error: parallel.pipeline_model_parallel_layout: <reason>` unless it holds."""
    if not condition:
        raise UserError(FIELD, reason)


def layout_layer_counts(text: str) -> tuple[int, ...]:
    """Transformer layers t of each virtual stage, in flat order k = chunk·p + stage."""
    return tuple(stage.count("t") for stage in parse_layout(text))
