"""FP8 delayed scaling's amax reduction: one MAX all-reduce per model-chunk forward and backward.

As Transformer Engine runs it (NVIDIA/TransformerEngine d0067d0, transformer_engine/pytorch/):
- quantization.py FP8GlobalStateManager.add_fp8_tensors_to_global_buffer: every FP8 module
  adds its newest amax row (`amax_history[0]`, one fp32 per quantizer) to one global buffer per
  (recipe, fp8_group) and direction, once for good: after the first iteration the buffer holds
  every FP8 module of the rank, all model chunks;
- module/base.py set_meta_tensor: 3 quantizers per GEMM forward (input, weight, output), 2
  backward (grad output, grad input);
- reduce_and_update_fp8_tensors: the buffer concatenated and reduced by one
  `torch.distributed.all_reduce(op=MAX, async_op=False)` over the fp8_group (skipped where the
  group has one rank), then the fused amax-and-scale update; forward at the exit of the
  outermost fp8_autocast (autocast_exit), backward in the backward of the autocast's first FP8
  module (module/linear.py, layernorm_linear.py `reduce_and_update_bwd_fp8_tensors`), i.e.
  after the chunk's layers' backward. Blocking: it holds this rank's compute stream.
As Megatron-LM calls it (NVIDIA/Megatron-LM d98e8a6, megatron/core/):
- transformer/transformer_block.py: under `--fp8-recipe delayed` one fp8_autocast wraps the
  block's layers (the other recipes enter one per layer and hold no amax buffer);
- fp8_utils.py get_fp8_context: fp8_group = parallel_state.get_amax_reduction_group(
  with_context_parallel=True, tp_only_amax_red=config.tp_only_amax_red), the stage's TP x CP x
  DP ranks (_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP); `tp_only_amax_red` has no command-line
  flag (megatron/training/arguments.py lists it among the fields with none) and
  TEDelayedScaling (extensions/transformer_engine.py) leaves TE's `reduce_amax=True`: no flag
  turns the reduction off.
Only the linears simsp runs in FP8 (simsp/model/fp8.py is_fp8_param) hold amaxes.
docs/hardware.md#fp8-amax-reduction works one case by hand.
"""

from dataclasses import dataclass

from simsp.model.fp8 import is_fp8_param
from simsp.model.params import param_shapes
from simsp.training.pipeline.plan import stage_param_names

AMAX_BYTES = 4  # fp32 amax (module/base.py set_meta_tensor: amax_history dtype float32)
QUANTIZERS = {True: 3, False: 2}  # per GEMM: forward (input, weight, output), backward
TRACK = "fp8_amax"  # exposure key and trace track
# its own NCCL communicator (a process group of its own), even where its ranks are those of the
# TP or DP group (d = c = 1, or t = c = 1)
COMMUNICATOR = "amax_reduction"


def delayed_scaling(sc) -> bool:
    """The scenario runs FP8 under the delayed recipe (the one that reduces amaxes)."""
    return sc.parallel.fp8_format is not None and sc.parallel.fp8_recipe == "delayed"


def amax_group(grid, rank: int) -> tuple[int, ...]:
    """The stage's TP x CP x DP ranks in Megatron's order (tp fastest, then cp, then dp): the
    t*c*d consecutive ranks of `rank`'s pipeline stage (cluster/grid.py)."""
    size = grid.tp * grid.cp * grid.dp
    start = grid.coords(rank).pp * size
    return tuple(range(start, start + size))


def stage_fp8_gemms(sc, plan) -> int:
    """The FP8 GEMMs (TE linear modules, one GEMM each in Megatron's TE spec) among the
    parameters of a stage (training/pipeline/plan.py StagePlan), every chunk's."""
    shapes = param_shapes(sc.padded_model)
    return sum(1 for name in stage_param_names(shapes, plan) if is_fp8_param(name, shapes[name]))


def amax_bytes(gemms: int, forward: bool) -> int:
    """Bytes of one reduction: every GEMM's forward or backward quantizers, 4 B each."""
    return gemms * QUANTIZERS[forward] * AMAX_BYTES


@dataclass(frozen=True)
class AmaxReduction:
    """One rank's amax reductions: its group and the FP8 GEMMs whose amaxes it reduces."""

    group: tuple[int, ...]
    gemms: int

    @classmethod
    def of(cls, sc, grid, rank: int, plan) -> "AmaxReduction | None":
        """The rank's reduction under FP8 delayed scaling with a group of two ranks or more and
        some FP8 GEMM on its stage (`plan`); None otherwise (TE reduces nothing)."""
        if not delayed_scaling(sc):
            return None
        group = amax_group(grid, rank)
        gemms = stage_fp8_gemms(sc, plan) if len(group) > 1 else 0
        return cls(group, gemms) if gemms else None

    def reduce(self, r, forward: bool):
        """The MAX all-reduce of the forward or backward amaxes, blocking the compute stream:
        its time is exposed (track fp8_amax)."""
        nbytes = amax_bytes(self.gemms, forward)
        tag = f"fp8 amax {'forward' if forward else 'backward'}"
        n, start = len(self.group), r.env.now
        r.count_comm(TRACK, 2 * (n - 1) * nbytes // n)  # a ring all-reduce's bytes sent
        yield from r.tp.comm.all_reduce(self.group, r.rank, None, nbytes, tag,
                                        elem_bytes=AMAX_BYTES, name=COMMUNICATOR)
        r.count_exposed(TRACK, r.env.now - start)
        if r.trace is not None:
            r.trace.add_span(r.rank, TRACK, tag, start, r.env.now,
                             {"phase": r.phase, "bytes": nbytes})
