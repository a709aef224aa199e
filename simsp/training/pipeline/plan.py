"""What one rank does in an iteration: its coordinates, model chunks, layers and schedule."""

from dataclasses import dataclass
import functools

import numpy as np

from simsp.cluster.grid import RankGrid
from simsp.scenario.config import Scenario
from simsp.scenario.pipeline_layout import last_decoder_stage, standalone_mtp_stage
from simsp.scenario.pipeline_split import model_chunks, virtual_stage_layer_counts
from simsp.training.pipeline.combined_1f1b import combined_schedule
from simsp.training.pipeline.schedule_step import (DUAL, ROUND_ROBIN, route_ends, stage_of,
                                                   virtual_stage_of)
from simsp.training.pipeline.schedules import Step, build_schedule, placement_of


@dataclass(frozen=True)
class StagePlan:
    """Rank `rank` at (tp, dp, pp); its chunk c holds virtual stage k (c·p + pp round robin,
    pp / 2p−1−pp in the V: schedule_step.py), whose layers are k·Lc..(k+1)·Lc−1."""

    rank: int
    tp: int
    dp: int
    pp: int
    p: int
    v: int
    layers_per_chunk: int
    steps: tuple[Step, ...]
    chunk_ranges: tuple | None = None  # uneven pipelines: each chunk's layers (a range)
    cp: int = 0  # context-parallel coordinate (docs/context-parallel.md)
    placement: str = ROUND_ROBIN  # where the chunks sit (schedule_step.py; V for zbv)
    # Megatron's standalone MTP (docs/pipeline-layout.md): the virtual stage running the MTP
    # depths, and the one running the decoder's final norm (its last layer's); None otherwise
    mtp_stage: int | None = None
    norm_stage: int | None = None

    def virtual_stage(self, chunk: int) -> int:
        return virtual_stage_of(chunk, self.pp, self.p, self.placement)

    def stage_of(self, virtual_stage: int) -> int:
        """The pipeline stage holding `virtual_stage` under this plan's placement."""
        return stage_of(virtual_stage, self.p, self.placement)

    def layers(self, chunk: int) -> range:
        if self.chunk_ranges is not None:
            return self.chunk_ranges[chunk]
        first = self.model_stage(chunk) * self.layers_per_chunk
        return range(first, first + self.layers_per_chunk)

    def model_stage(self, chunk: int) -> int:
        """The model stage the chunk holds: its virtual stage, or that mod p in DualPipe."""
        k = self.virtual_stage(chunk)
        return k % self.p if self.placement == DUAL else k

    def all_layers(self) -> list[int]:
        return [i for chunk in range(self.v) for i in self.layers(chunk)]

    def is_first(self, chunk: int) -> bool:
        return route_ends(self.virtual_stage(chunk), self.p, self.v, self.placement)[0]

    def is_last(self, chunk: int) -> bool:
        return route_ends(self.virtual_stage(chunk), self.p, self.v, self.placement)[1]

    def is_mtp(self, chunk: int) -> bool:
        """The chunk is the standalone MTP stage (its output: the hidden states, concatenated)."""
        return self.mtp_stage is not None and self.virtual_stage(chunk) == self.mtp_stage

    def is_norm(self, chunk: int) -> bool:
        """Standalone MTP: the chunk ends with the decoder's final norm."""
        return self.norm_stage is not None and self.virtual_stage(chunk) == self.norm_stage

    def stage_holds(self, virtual_stage: int | None) -> bool:
        """This rank runs `virtual_stage` (False for None)."""
        return virtual_stage is not None and self.stage_of(virtual_stage) == self.pp

    @property
    def mirror_stage(self) -> int | None:
        """DualPipe: the stage holding this one's two model stages the other way round
        (p-1-pp), whose gradients this stage's are summed with; else None."""
        return self.p - 1 - self.pp if self.placement == DUAL else None

    @property
    def head_stage(self) -> int:
        """The pipeline stage holding the last virtual stage (the head): p−1, or 0 in the V
        (and in DualPipe, whose stage p−1 holds the down pipeline's head too)."""
        return self.stage_of(self.p * self.v - 1)

    @property
    def holds_embedding(self) -> bool:
        return self.pp == 0 or (self.placement == DUAL and self.pp == self.p - 1)

    @property
    def holds_head(self) -> bool:
        return self.pp == self.head_stage or (self.placement == DUAL and self.pp == self.p - 1)


@dataclass(frozen=True)
class Segment:
    """Consecutive layers of a model chunk run as one unit. A checkpointed segment keeps only
    its first layer's input and recomputes all its layers in backward (full recompute)."""

    layers: tuple[int, ...]
    checkpointed: bool


def recompute_segments(sc: Scenario, layers: range) -> tuple[Segment, ...]:
    """A model chunk's layers cut as Megatron-LM's TransformerBlock._checkpointed_forward does:
    uniform: groups of N layers, each checkpointed; block: the chunk's first N layers each
    checkpointed alone, the rest not (N = recompute_num_layers). Without full recompute every
    layer is its own, plain segment."""
    p = sc.parallel
    return _segments(p.recompute_granularity, p.recompute_method, p.recompute_num_layers,
                     layers.start, layers.stop)


@functools.lru_cache(maxsize=4096)
def _segments(granularity: str, method: str | None, num_layers: int | None, start: int,
              stop: int) -> tuple[Segment, ...]:
    """recompute_segments, worked out once per chunk (every step of the chunk asks again)."""
    layers = range(start, stop)
    if granularity != "full":
        return tuple(Segment((i,), False) for i in layers)
    n = num_layers or 1
    if method == "block":
        return tuple(Segment((i,), k < n) for k, i in enumerate(layers))
    return tuple(Segment(tuple(layers[k:k + n]), True) for k in range(0, len(layers), n))


def chunks_per_stage(sc: Scenario) -> int:
    """v: model chunks per pipeline stage (1 unless interleaved)."""
    return model_chunks(sc.model, sc.parallel)


def stage_plans(sc: Scenario, grid: RankGrid) -> dict[int, StagePlan]:
    """A plan for every rank of the grid."""
    p, v = sc.parallel.pp, chunks_per_stage(sc)
    m = sc.parallel.num_micro_batches
    schedule = combined_schedule(p, m, v) if sc.parallel.overlap_moe_expert_parallel_comm \
        else build_schedule(sc.parallel.schedule_name, p, m, v)
    placement = placement_of(sc.parallel.schedule_name)
    per_chunk = sc.model.num_layers // (p if placement == DUAL else p * v)
    ranges = _uneven_ranges(sc) if sc.parallel.uneven_pipeline else None
    layout = sc.parallel.pipeline_model_parallel_layout
    mtp_stage = standalone_mtp_stage(layout)
    norm_stage = None if mtp_stage is None else last_decoder_stage(layout)
    plans = {}
    for rank in range(grid.world_size):
        c = grid.coords(rank)
        chunks = None if ranges is None else tuple(
            ranges[_model_stage(virtual_stage_of(k, c.pp, p, placement), p, placement)]
            for k in range(v))
        plans[rank] = StagePlan(rank, c.tp, c.dp, c.pp, p, v, per_chunk,
                                tuple(schedule[c.pp]), chunks, c.cp, placement, mtp_stage,
                                norm_stage)
    return plans


def _model_stage(virtual_stage: int, p: int, placement: str) -> int:
    """The model stage whose layers a virtual stage runs: itself, or, in DualPipe, k mod p
    (both pipelines split the model as Megatron's p stages)."""
    return virtual_stage % p if placement == DUAL else virtual_stage


def _uneven_ranges(sc: Scenario) -> list[range]:
    """Each virtual stage's contiguous layers under Megatron's uneven split
    (config.virtual_stage_layer_counts; get_transformer_layer_offset)."""
    ranges, start = [], 0
    for count in virtual_stage_layer_counts(sc.model, sc.parallel):
        ranges.append(range(start, start + count))
        start += count
    return ranges


def stage_param_names(shapes: dict, plan: StagePlan) -> list[str]:
    """Canonical names of the parameters this stage holds (tied word table on first and last)."""
    wanted = {f"layers.{i}." for i in plan.all_layers()}
    mtp = "mtp.0.eh_proj.weight" in shapes  # multi-token prediction: the last stage embeds too
    names = []
    for name in shapes:
        if name.startswith("layers."):
            keep = name[:name.index(".", 7) + 1] in wanted
        elif plan.mtp_stage is not None:  # standalone MTP: each module where Megatron builds it
            keep = _standalone_holder(name, plan, "output.weight" in shapes)
        elif name == "embedding.word":  # tied: the output layer's weight too
            keep = plan.holds_embedding or (plan.holds_head and
                                            ("output.weight" not in shapes or mtp))
        elif name == "embedding.position":
            keep = plan.holds_embedding
        else:  # final_ln, output.weight (untied)
            keep = plan.holds_head
        if keep:
            names.append(name)
    return names


def _standalone_holder(name: str, plan: StagePlan, untied: bool) -> bool:
    """Standalone MTP (gpt_model.py): the MTP stage builds the depths and its own embedding
    (`pre_process or mtp_process`), the last decoder layer's stage the final norm
    (transformer_block.py has_final_layernorm_in_this_stage), the loss stage the output layer
    (a copy of the word table when tied)."""
    if name.startswith("mtp."):
        return plan.stage_holds(plan.mtp_stage)
    if name.startswith("final_ln."):
        return plan.stage_holds(plan.norm_stage)
    if name == "embedding.word":
        return plan.holds_embedding or plan.stage_holds(plan.mtp_stage) or (
            plan.holds_head and not untied)
    if name == "embedding.position":
        return plan.holds_embedding
    return plan.holds_head  # output.weight (untied)


def global_batch(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic token ids and next-token targets for the whole global batch, (s, B) each."""
    rng = np.random.default_rng(sc.run.seed + 7)
    s, B, v = sc.model.seq_length, sc.parallel.global_batch, sc.model.vocab_size
    tokens = rng.integers(0, v, size=(s + 1, B))
    return tokens[:-1], tokens[1:]


def sample_offset(sc: Scenario, dp: int, micro_batch: int) -> int:
    """Global index of the first sample of this replica's micro-batch."""
    per_replica = sc.parallel.global_batch // sc.parallel.dp
    return dp * per_replica + micro_batch * sc.parallel.micro_batch_size
