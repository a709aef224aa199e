"""Transformer Engine's TP communication overlap per GEMM (userbuffers; docs/tp-overlap.md): TE's
defaults and a user's `--tp-comm-overlap-cfg` file read as TE's `ub_cfgs`.

The GEMM names, the AG / RS split, the default method of each and the default knobs are
NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py initialize_ub
(layers_all_gather_overlap, layers_reduce_scatter_overlap, methods, get_default_config: num_sm
1 for ring_exchange else 16, num_splits tp_size for ring_exchange else 4, set_sm_margin off for
ring_exchange only, use_ce on, fp8_buf for the all-gather layers). Megatron-LM reads the file with yaml.safe_load and hands it to
initialize_ub (megatron/training/initialize.py _initialize_tp_communicators).

A method other than bulk on qkv_dgrad or fc1_dgrad (initialize_ub's dgrad_reduce_scatter_overlap)
turns that GEMM into a reduce-scatter overlap of the dgrad GEMM's output: initialize_ub moves it
from the all-gather layers to the reduce-scatter ones, so its defaults are the new method's and its
buffer holds FP8 only when pipelined with the user's fp8_buf; the file may then not set the
paired wgrad GEMM (TE raises a ValueError). At NVIDIA/TransformerEngine d0067d0d.
"""

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from simsp.errors import UserError

RING_EXCHANGE, PIPELINE, BULK = "ring_exchange", "pipeline", "bulk"
ALL_GATHER_GEMMS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "fc1_fprop", "fc1_dgrad",
                    "fc2_dgrad")  # layers_all_gather_overlap
REDUCE_SCATTER_GEMMS = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")
DEFAULT_METHODS = {RING_EXCHANGE: ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"),
                   PIPELINE: ("proj_fprop", "fc2_fprop"),
                   BULK: ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")}
GEMMS = sum(DEFAULT_METHODS.values(), ())  # the ten userbuffers, in initialize_ub's order
DGRAD_RS_GEMMS = ("qkv_dgrad", "fc1_dgrad")  # dgrad_reduce_scatter_overlap
# the methods simsp runs for each kind of GEMM (TE refuses pipeline for an all-gather; a dgrad
# GEMM other than bulk reduce-scatters its output, replacing the bulk pair)
ALLOWED = {"fprop_ag": (RING_EXCHANGE,), "rs": (PIPELINE, RING_EXCHANGE), "bulk": (BULK,),
           "dgrad": (BULK, PIPELINE, RING_EXCHANGE)}
MODELLED_KEYS = ("method", "num_sm", "num_splits", "set_sm_margin", "use_ce", "fp8_buf",
                 "aggregate")
BUNDLED = Path(__file__).parent / "data" / "tp_overlap"  # NeMo's files restated, by name
IGNORED_KEYS = ("cga_size", "atomic_gemm", "comm_priority",
                "gemm_priority", "pipeline_rs_overlap_first_gemm", "is_reduce_scatter")


@dataclass(frozen=True)
class UbGemm:
    """One GEMM's overlap: its method, communication SMs, splits, SM margin, copy engines,
    whether its buffer holds FP8 (under FP8), and whether a ring-exchange all-gather passes
    chunks two at a time (`aggregate`)."""

    name: str
    method: str
    num_sm: int
    num_splits: int
    set_sm_margin: bool
    use_ce: bool
    fp8_buf: bool = False
    aggregate: bool = False

    @property
    def comm_sms(self) -> int:
        """SMs its communication kernels hold: none for ring exchange over copy engines
        (userbuffers_send with use_ce), else num_sm."""
        return 0 if self.method == RING_EXCHANGE and self.use_ce else self.num_sm


def default_gemm(name: str, tp: int, method: str | None = None) -> UbGemm:
    """TE's get_default_config for `name` at TP size `tp` (fp8_buf: the all-gather layers);
    `method`: a dgrad GEMM moved to a reduce-scatter method (no longer an all-gather layer)."""
    moved = method not in (None, BULK)
    method = method or next(m for m, names in DEFAULT_METHODS.items() if name in names)
    ring = method == RING_EXCHANGE
    return UbGemm(name, method, 1 if ring else 16, tp if ring else 4, not ring, True,
                  name in ALL_GATHER_GEMMS and not moved)


def is_dgrad_rs(gemm: UbGemm) -> bool:
    """A dgrad GEMM whose output is reduce-scattered beside it (TE's ub_overlap_rs_dgrad)."""
    return gemm.name in DGRAD_RS_GEMMS and gemm.method != BULK


def dgrad_rs_on(p) -> bool:
    """Does parallel section `p` run some dgrad GEMM's reduce-scatter overlap?"""
    return p.tp_comm_overlap and any(
        is_dgrad_rs(gemm) for gemm in ub_gemms(p.tp, p.tp_comm_overlap_cfg).values())


def _kind(name: str) -> str:
    """Which methods a GEMM may take: ALLOWED's key."""
    if name in DGRAD_RS_GEMMS:
        return "dgrad"
    if name in DEFAULT_METHODS[BULK]:
        return "bulk"
    return "rs" if name in REDUCE_SCATTER_GEMMS else "fprop_ag"


def _entry(name: str, body, tp: int, source: str) -> UbGemm:
    """One GEMM's table of the file over TE's default, checked."""
    field = f"parallel.tp_comm_overlap_cfg ({source}: {name})"
    if not isinstance(body, dict):
        raise UserError(field, f"must be a table of settings, got {body!r}")
    unknown = sorted(set(body) - set(MODELLED_KEYS) - set(IGNORED_KEYS))
    if unknown:
        raise UserError(field, f"unknown setting {unknown[0]!r} (TE's ub_cfgs keys: "
                               f"{', '.join(MODELLED_KEYS + IGNORED_KEYS)})")
    if body.get("atomic_gemm") in (1, True):
        raise UserError(field, "atomic_gemm is not modelled: a beta cuBLAS kernel whose chunks "
                               "signal a counter, timing not sourced (docs/tp-overlap.md)")
    gemm = default_gemm(name, tp)
    allowed = ALLOWED[_kind(name)]
    if body.get("method", gemm.method) not in allowed:
        raise UserError(field, f"method {body['method']!r} is not modelled for {name} (simsp "
                               f"runs {' or '.join(allowed)})")
    if name in DGRAD_RS_GEMMS:  # initialize_ub moved it to its method's list: those defaults
        gemm = default_gemm(name, tp, body.get("method", BULK))
    gemm = replace(gemm, method=body.get("method", gemm.method))  # over the default's knobs
    for key, kind in (("num_sm", int), ("num_splits", int), ("set_sm_margin", bool),
                      ("use_ce", bool), ("fp8_buf", bool), ("aggregate", bool)):
        if key in body:
            gemm = replace(gemm, **{key: _typed(field, key, body[key], kind)})
    gemm = _as_te_reads(gemm, "fp8_buf" in body)
    if gemm.aggregate and tp % 2:
        raise UserError(field, f"aggregate needs an even tensor_model_parallel_size, got {tp}")
    return gemm


def _as_te_reads(gemm: UbGemm, fp8_buf_set: bool) -> UbGemm:
    """`gemm` with fp8_buf and aggregate as initialize_ub and split_overlap_ag read them: a
    user's fp8_buf counts on the layers in methods["pipeline"] (the all-gather layers' buffers
    are FP8 anyway); aggregate on a ring-exchange all-gather alone."""
    all_gather = gemm.name in ALL_GATHER_GEMMS and not is_dgrad_rs(gemm)
    pipelined = gemm.name in DEFAULT_METHODS[PIPELINE] or (
        is_dgrad_rs(gemm) and gemm.method == PIPELINE)
    if fp8_buf_set:
        gemm = replace(gemm, fp8_buf=all_gather or (gemm.fp8_buf and pipelined))
    return replace(gemm, aggregate=gemm.aggregate and gemm.method == RING_EXCHANGE
                   and all_gather)


def _typed(field: str, key: str, value, kind: type):
    """A setting as `kind` (ints for booleans as YAML writes 0/1), range-checked."""
    if kind is bool and value in (0, 1):
        return bool(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise UserError(field, f"{key} must be {'a boolean' if kind is bool else 'an integer ≥ 1'}"
                           f", got {value!r}")


def bundled_cfgs() -> list[str]:
    """The names of the bundled per-GEMM files (NeMo's layouts), sorted."""
    return sorted(p.stem for p in BUNDLED.glob("*.toml"))


def cfg_path(value: str) -> str:
    """A bundled file's path for its bare name (no folder, no suffix), else `value` itself."""
    if value in bundled_cfgs():
        return str(BUNDLED / f"{value}.toml")
    return value


def read_cfg(path: str) -> dict:
    """The file's mapping of GEMM name to settings: YAML (as Megatron reads it) or TOML; a bare
    name is a bundled file (`bundled_cfgs`)."""
    field = "parallel.tp_comm_overlap_cfg"
    path = cfg_path(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(field, f"cannot read {path}: {err.strerror}") from None
    try:
        if path.endswith(".toml"):
            body = tomllib.loads(text)
        else:
            import yaml  # Megatron-LM's reader (PyYAML comes with dask)
            body = yaml.safe_load(text) or {}
    except Exception as err:  # noqa: BLE001 - a parse error of either format, named
        raise UserError(field, f"{path} does not parse: {str(err).splitlines()[0]}") from None
    if not isinstance(body, dict):
        raise UserError(field, f"{path} must map GEMM names to settings")
    unknown = sorted(set(body) - set(GEMMS))
    if unknown:
        raise UserError(field, f"{path}: unknown GEMM {unknown[0]!r} (TE's: {', '.join(GEMMS)})")
    return body


def _no_wgrad_beside_dgrad_rs(body: dict, path: str) -> None:
    """TE's initialize_ub refuses a file that sets a wgrad GEMM whose dgrad GEMM it moves to a
    reduce-scatter method ("Cannot specify user UB config for '<wgrad>' when its corresponding
    dgrad '<dgrad>' uses a non-bulk overlap method")."""
    for name in DGRAD_RS_GEMMS:
        settings = body.get(name)
        wgrad = name.replace("dgrad", "wgrad")
        if isinstance(settings, dict) and settings.get("method", BULK) != BULK and wgrad in body:
            raise UserError(f"parallel.tp_comm_overlap_cfg ({path}: {wgrad})",
                            f"may not be set when {name} uses method {settings['method']!r}: "
                            f"its reduce-scatter replaces the bulk pair (TE's initialize_ub "
                            "refuses it)")


def ub_gemms(tp: int, path: str | None = None) -> dict[str, UbGemm]:
    """Every GEMM's overlap: TE's defaults, updated by the file at `path` if given."""
    body = read_cfg(path) if path else {}
    _no_wgrad_beside_dgrad_rs(body, path)
    return {name: (_entry(name, body[name], tp, path) if name in body
                   else default_gemm(name, tp)) for name in GEMMS}


def userbuffers_bytes(gemms: dict[str, UbGemm], tokens: int, hidden: int, fp8: bool,
                      tp: int) -> int:
    """Bytes of the userbuffers one rank registers: one (tokens, hidden) buffer per GEMM
    (Megatron-LM megatron/training/initialize.py _initialize_tp_communicators: seq_length ×
    micro_batch_size / context_parallel_size rows of hidden_size), 1 B per element where FP8
    runs and the GEMM's fp8_buf is set, else 2 (BF16) (TE's initialize_ub add_ub); a
    ring-exchange reduce-scatter's holds 2t − 1 chunks of tokens/t rows, its t GEMM output
    chunks and the t − 1 it receives (CommOverlapP2PBase::initialize)."""
    total = 0
    for gemm in gemms.values():
        elem = 1 if fp8 and gemm.fp8_buf else 2
        rows = tokens // tp * (2 * tp - 1) if is_rs_p2p(gemm) else tokens
        total += rows * hidden * elem
    return total


def is_rs_p2p(gemm: UbGemm) -> bool:
    """A GEMM+RS overlapped by ring exchange (TE's CommOverlapP2P with CommOverlapType.RS)."""
    return gemm.method == RING_EXCHANGE and (gemm.name in REDUCE_SCATTER_GEMMS
                                             or is_dgrad_rs(gemm))
