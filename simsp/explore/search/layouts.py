"""Every Megatron-LM layout of a model on N GPUs: t, p, d = N/(t·p), micro-batch size, the
schedule (1F1B, interleaved with each possible number of model chunks, and the split-backward
schedules ZB-H1, ZB-H2, ZB-V, DualPipeV and DualPipe where their shapes allow: docs/schedules.md,
docs/dualpipe.md), SP, recompute and the distributed optimizer. Layouts the config checks reject are counted by reason, not returned.

Every layout starts from the scenario's model, cluster and run sections and from the defaults
of the [parallel] fields the search does not vary; `fixed` holds the ones the user chose (flags,
or the scenario's own with --keep-scenario-parallel), each applied where Megatron allows it."""

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field, fields

from simsp.scenario.pipeline_layout import parse_layout
from simsp.scenario.config import Parallel
from simsp.scenario.loading import load_scenario
from simsp.errors import UserError
from simsp.explore.configs.grid import Config
from simsp.progress import track

# The expert layout a MoE model's layouts vary (Megatron-LM --expert-model-parallel-size,
# --expert-tensor-parallel-size, --moe-token-dispatcher-type, --moe-grouped-gemm; docs/moe.md).
EXPERT_FIELDS = ("expert_model_parallel_size", "expert_tensor_parallel_size",
                 "moe_token_dispatcher_type", "moe_grouped_gemm")
# The [parallel] fields every layout sets itself (global_batch_size comes from --global-batch-size).
VARIED = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
          "micro_batch_size", "num_layers_per_virtual_pipeline_stage", "schedule",
          "sequence_parallel", "recompute_granularity", "distributed_optimizer",
          "global_batch_size", *EXPERT_FIELDS)
# The layout fields a user may restrict to some values (global_batch_size is one value).
RESTRICTABLE = tuple(key for key in VARIED if key != "global_batch_size")


FSDP_FIELDS = ("use_megatron_fsdp", "data_parallel_sharding_strategy", "use_torch_fsdp2")


def held_fields() -> list[str]:
    """The [parallel] fields the search does not vary: defaults unless the user fixes them."""
    return [f.name for f in fields(Parallel) if f.name not in VARIED]


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending (pairs k, n/k up to sqrt(n): O(sqrt n) steps)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


# The schedules a search tries by default (gpipe only when asked for: 1F1B's time, more memory).
SEARCHED_SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe")
# Readable names (ZB paper arXiv:2401.10241; DeepSeek-V3 report arXiv:2412.19437 §3.2.1).
SCHEDULE_LABELS = {"gpipe": "GPipe", "zb-h1": "ZB-H1", "zb-h2": "ZB-H2", "zbv": "ZB-V",
                   "dualpipev": "DualPipeV", "dualpipe": "DualPipe"}


def _shape_allows(name: str, layers_per_stage: int, p: int, micro_batches: int) -> bool:
    """Whether p stages of `layers_per_stage` layers and m micro-batches have the shape the
    schedule needs (the V's two chunks: L divisible by 2p, DualPipeV m ≥ 2p; DualPipe p and m
    even, m ≥ 2p: deepseek-ai/DualPipe's asserts); the config checks still decide the rest."""
    if name == "dualpipe":
        return p % 2 == 0 and micro_batches % 2 == 0 and micro_batches >= 2 * p
    if name in ("zbv", "dualpipev"):
        return layers_per_stage % 2 == 0 and (name == "zbv" or micro_batches >= 2 * p)
    return True


def _schedules(layers_per_stage: int, p: int, micro_batches: int,
               names: tuple = SEARCHED_SCHEDULES) -> list[tuple[str | None, int | None]]:
    """(schedule, num_layers_per_virtual_pipeline_stage) options among `names`: (None, None)
    for 1F1B, (None, k) interleaved with 2 or more chunks, (name, None) for the others (more
    than one stage)."""
    options = [(None, None)] if "1f1b" in names else []
    if p > 1 and micro_batches % p == 0 and "interleaved" in names:
        options += [(None, k) for k in divisors(layers_per_stage) if layers_per_stage // k >= 2]
    return options + [(name, None) for name in names if p > 1 and name not in (
        "1f1b", "interleaved") and _shape_allows(name, layers_per_stage, p, micro_batches)]


def _parallel_options(t: int, p: int, d: int, b: int, schedule: tuple) -> list[dict]:
    """SP x recompute x distributed optimizer for one (t, p, d, b, schedule)."""
    name, virtual = schedule
    options = []
    for sp in ((False, True) if t > 1 else (False,)):
        for recompute in ("none", "selective", "full"):
            for dist_opt in ((False, True) if d > 1 else (False,)):
                options.append({"tensor_model_parallel_size": t, "pipeline_model_parallel_size": p,
                                "data_parallel_size": d, "micro_batch_size": b,
                                "num_layers_per_virtual_pipeline_stage": virtual,
                                "schedule": name, "sequence_parallel": sp,
                                "recompute_granularity": recompute,
                                "distributed_optimizer": dist_opt})
    return options


def expert_options(experts: int | None, t: int, allowed: dict) -> list[dict]:
    """The expert layouts of one (t, ...) layout: for a MoE model every EP dividing the experts,
    ETP at its default (t), both dispatchers (where tokens cross ranks) and both grouped-GEMM
    settings (where a rank holds more than one expert: with one, both run the same single GEMM,
    model/blocks/moe/experts.py), each field's values replaced by the user's restriction
    (`allowed`); for a dense model the defaults (or the restriction, which the checks reject)."""
    defaults = Parallel()
    plain = {key: (getattr(defaults, key),) for key in EXPERT_FIELDS}
    space = plain if experts is None else {
        **plain, "expert_model_parallel_size": tuple(divisors(experts)),
        "moe_grouped_gemm": (False, True)}
    space.update({key: tuple(values) for key, values in allowed.items() if key in EXPERT_FIELDS})
    options = []
    for ep in space["expert_model_parallel_size"]:
        for etp in space["expert_tensor_parallel_size"]:
            crossing = experts is not None and ep * (etp or t) > 1  # tokens leave the rank
            dispatchers = space["moe_token_dispatcher_type"]
            if crossing and "moe_token_dispatcher_type" not in allowed:
                dispatchers = ("alltoall", "allgather")
            groupings = space["moe_grouped_gemm"]  # one local expert: the same one GEMM
            if experts is not None and experts == ep and "moe_grouped_gemm" not in allowed:
                groupings = (False,)
            options += [dict(zip(EXPERT_FIELDS, (ep, etp, dispatcher, grouped)))
                        for dispatcher in dispatchers for grouped in groupings]
    return options


def _expert_label(parallel: dict) -> tuple[str, list[str]]:
    """(` ep8` or ` ep8 etp1` after d, [the dispatcher, grouped GEMM]) for a layout with
    experts off their defaults; ("", []) for a dense one."""
    defaults = Parallel()
    ep = parallel.get("expert_model_parallel_size", 1)
    etp = parallel.get("expert_tensor_parallel_size")
    dispatcher = parallel.get("moe_token_dispatcher_type", defaults.moe_token_dispatcher_type)
    grouped = parallel.get("moe_grouped_gemm", False)
    if ep == 1 and etp is None and dispatcher == defaults.moe_token_dispatcher_type \
            and not grouped:
        return "", []
    sizes = f" ep{ep}" + (f" etp{etp}" if etp is not None else "")
    return sizes, [dispatcher] + (["grouped GEMM"] if grouped else [])


def layout_label(parallel: dict, layers: int, shown: tuple = ()) -> str:
    """Readable name: `t8 p8 d1 b1, interleaved 3 chunks, SP, selective recompute, distributed
    optimizer` (t, p, d: tensor, pipeline and data-parallel sizes; b: micro-batch size; a MoE
    layout adds `ep8` after d and its dispatcher and grouped GEMM at the end; `shown`: held
    fields the search varies, named with their values where they matter, FSDP's as FSDP)."""
    t, p = parallel["tensor_model_parallel_size"], parallel["pipeline_model_parallel_size"]
    cp = parallel.get("context_parallel_size", 1)
    sizes, expert_parts = _expert_label(parallel)
    parts = [f"t{t}{f' cp{cp}' if cp > 1 else ''} p{p} d{parallel['data_parallel_size']}"
             f"{sizes} b{parallel['micro_batch_size']}"]
    virtual = parallel["num_layers_per_virtual_pipeline_stage"]
    schedule = SCHEDULE_LABELS.get(parallel.get("schedule"))
    if parallel.get("pipeline_model_parallel_layout") and not schedule:  # its chunks, checked
        chunks = len(parse_layout(parallel["pipeline_model_parallel_layout"])) // p
        schedule = f"interleaved {chunks} chunks" if chunks > 1 else None
    parts.append(schedule or (f"interleaved {layers // p // virtual} chunks" if virtual
                              else "1F1B"))
    parts.append("SP" if parallel["sequence_parallel"] else "no SP")
    recompute = parallel["recompute_granularity"]
    text = "no recompute" if recompute == "none" else f"{recompute} recompute"
    if recompute == "full" and parallel.get("recompute_method") == "block":
        count = parallel.get("recompute_num_layers") or 1
        text += f" (block, {count} layer{'s' if count > 1 else ''})"
    elif recompute == "full" and (parallel.get("recompute_num_layers") or 1) > 1:
        text += f" (groups of {parallel['recompute_num_layers']})"
    parts.append(text)
    if parallel["distributed_optimizer"]:
        parts.append("distributed optimizer")
    if parallel.get("use_torch_fsdp2"):
        parts.append("FSDP2")
    elif parallel.get("use_megatron_fsdp"):
        parts.append(f"Megatron-FSDP {parallel.get('data_parallel_sharding_strategy')}")
    varied = [f"{key} {parallel[key]}" for key in shown
              if key not in FSDP_FIELDS and _matters(key, parallel)]
    return ", ".join(parts + expert_parts + varied)


def raw_layouts(gpus: int, batch: int, layers: int, max_tp: int, cp: int = 1,
                schedules: tuple = SEARCHED_SCHEDULES) -> list[dict]:
    """Every (t, p, d, b, schedule, SP, recompute, dist-opt) with t·cp·p·d = gpus, before checks
    (cp: the context-parallel size the user fixed, 1 by default; Megatron's world = t·cp·p·d;
    `schedules`: the names tried)."""
    found = []
    if gpus % cp:
        return found
    ranks = gpus // cp  # t·p·d
    for t in divisors(min(ranks, max_tp)):
        for p in (p for p in divisors(ranks // t) if ranks % (t * p) == 0 and layers % p == 0):
            d = ranks // (t * p)
            if ranks % t or batch % d:
                continue
            for b in divisors(batch // d):
                for schedule in _schedules(layers // p, p, batch // (b * d), schedules):
                    found += _parallel_options(t, p, d, b, schedule)
    return found


def applies(key: str, parallel: dict) -> bool:
    """Whether Megatron lets a held field take a non-default value in this layout: recompute
    method and layer count under full recompute, p2p overlap under interleaving, the parameter
    all-gather overlap with the distributed optimizer (arguments.py's own checks)."""
    if key in ("recompute_method", "recompute_num_layers"):
        return parallel["recompute_granularity"] == "full"
    if key == "overlap_p2p_communication":
        return parallel["num_layers_per_virtual_pipeline_stage"] is not None
    if key == "overlap_param_gather":
        return parallel["distributed_optimizer"]
    if key == "overlap_param_gather_with_optimizer_step":
        return parallel["distributed_optimizer"] and \
            parallel["num_layers_per_virtual_pipeline_stage"] is not None
    if key in FSDP_FIELDS:  # FSDP shards by its own strategy: the other rows keep dist. opt.
        return not parallel["distributed_optimizer"]
    return True


CP_FIELDS = ("cp_comm_type", "hierarchical_context_parallel_sizes")  # used only when cp > 1


def held_choices(held: dict) -> tuple[dict, list[dict]]:
    """(the held fields given one value, [{field: value}] every combination of those given a
    list, in the order given): a held field given several values is varied like a layout's."""
    single = {k: v for k, v in held.items() if not isinstance(v, (tuple, list))}
    lists = {k: tuple(v) for k, v in held.items() if isinstance(v, (tuple, list))}
    return single, [dict(zip(lists, values)) for values in itertools.product(*lists.values())]


def _matters(key: str, parallel: dict) -> bool:
    """Whether a held field changes this layout (cp_comm_type only with cp > 1; applies)."""
    if key in CP_FIELDS:
        return parallel["context_parallel_size"] > 1
    return applies(key, parallel)


def held_variants(parallel: dict, combos: list[dict]) -> list[dict]:
    """The combinations of varied held fields that differ in this layout: a field that does
    not matter here takes its first value only (no two layouts run the same thing)."""
    seen, variants = set(), []
    for combo in combos:
        key = tuple((k, v if _matters(k, parallel) else None) for k, v in combo.items())
        if key not in seen:
            seen.add(key)
            variants.append(combo)
    return variants


def with_fixed(parallel: dict, fixed: dict) -> dict:
    """The layout with each fixed field applied where it applies (else left at its default)."""
    defaults = Parallel()
    merged = dict(parallel)
    for key, value in fixed.items():
        merged[key] = value if applies(key, parallel) else getattr(defaults, key)
    return merged


@dataclass
class Layouts:
    """The valid layouts, and how many the config checks rejected, by reason."""

    configs: list = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)  # `error:` text -> layouts

    @property
    def invalid(self) -> int:
        return sum(self.rejected.values())


def search_base(scenario: dict) -> dict:
    """A layout's starting values: the scenario's model, cluster and run, and every [parallel]
    field at its default but global_batch_size (the scenario's)."""
    defaults = Parallel()
    base = dict(scenario)
    for f in fields(Parallel):
        if f.name != "global_batch_size":
            base[("parallel", f.name)] = getattr(defaults, f.name)
    return base


def search_start(source, given: dict, keep_scenario_parallel: bool = False) -> tuple[dict, dict]:
    """(the layouts' starting values in meta mode, the held [parallel] fields the user fixed)
    for `simsp search` and simsp.search alike: the scenario file and the one-valued fields
    `given` {(section, key): value} resolved as `run` resolves them
    (simsp.explore.configs.grid.base_values: --gpu and --system fill the [cluster] keys they
    imply), the [parallel] fields at Megatron's defaults but those fixed (the scenario's own
    with `keep_scenario_parallel`, then the given) and the global batch."""
    from simsp.explore.configs.grid import base_values
    scenario = base_values(source, {path: value for path, value in given.items()
                                    if path[0] != "parallel"})
    held = held_fields()
    fixed = {key: scenario[("parallel", key)] for key in held} if keep_scenario_parallel else {}
    fixed.update({key: value for (section, key), value in given.items()
                  if section == "parallel" and key in held})
    base = search_base(scenario)
    if ("parallel", "global_batch_size") in given:
        base[("parallel", "global_batch_size")] = given[("parallel", "global_batch_size")]
    base[("run", "mode")] = "meta"
    return base, fixed


def allows(parallel: dict, allowed: dict) -> bool:
    """Whether a layout takes one of the allowed values of every restricted field (the
    schedule by its name: 1f1b or interleaved (virtual stages) where the field is unset)."""
    for key, values in allowed.items():
        if key not in parallel:  # an expert field: expert_options enumerates only its values
            continue
        value = parallel[key]
        if key == "schedule" and value is None:
            value = "interleaved" if parallel["num_layers_per_virtual_pipeline_stage"] else "1f1b"
        if value not in values:
            return False
    return True


def _searched(allowed: dict) -> tuple:
    """The schedules to enumerate: the restriction's (gpipe included when named), else the
    default SEARCHED_SCHEDULES."""
    return tuple(allowed["schedule"]) if "schedule" in allowed else SEARCHED_SCHEDULES


def enumerate_layouts(base: dict, gpus: int, batch: int, fixed: dict | None = None,
                      source: str | None = None, allowed: dict | None = None,
                      nodes: int | None = None, quiet: bool = True) -> Layouts:
    """Valid layouts as Configs (and rejections by reason) for `gpus` GPUs: `base` from
    search_base, `fixed` the held [parallel] fields the user chose, `source` the scenario file
    (each row's `simsp run` command starts from it), `allowed` the values a layout field may
    take (others are not enumerated), `nodes` the node count (default: enough for the GPUs);
    unless `quiet`, a bar on stderr counts the layouts checked against their total."""
    layers, per_node = base[("model", "num_layers")], base[("cluster", "gpus_per_node")]
    found = Layouts()
    held = dict(fixed or {})
    cps = held.pop("context_parallel_size", 1)  # one cp, or a tuple of them to vary
    held, combos = held_choices(held)
    experts = base[("model", "num_experts")]
    candidates = [(cp, {**parallel, **expert, "context_parallel_size": cp})
                  for cp in (tuple(cps) if isinstance(cps, (tuple, list)) else (cps,))
                  for parallel in raw_layouts(gpus, batch, layers, per_node, cp,
                                              _searched(allowed or {}))
                  if allows(parallel, allowed or {})
                  for expert in expert_options(experts, parallel["tensor_model_parallel_size"],
                                               allowed or {})]
    candidates = [(cp, parallel, combo) for cp, parallel in candidates
                  for combo in held_variants(parallel, combos)]
    for cp, parallel, combo in track(candidates, "simsp search: layouts checked", "layout",
                                     quiet):
        parallel = with_fixed(parallel, {**held, **combo})
        values = dict(base)
        values.update({("parallel", k): v for k, v in parallel.items()})
        values[("parallel", "global_batch_size")] = batch
        values[("cluster", "nodes")] = nodes or math.ceil(gpus / per_node)
        try:
            load_scenario(None, values)
        except UserError as exc:
            found.rejected[f"error: {exc}"] += 1
            continue
        label = layout_label(parallel, layers, shown=tuple(combo))
        found.configs.append(Config(label, tuple(values.items()), source=source))
    return found
