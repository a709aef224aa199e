"""Which of simsp's memory categories a snapshot's allocation belongs to, read from its stack
frames (docs/allocator.md#comparing-a-real-snapshot-simsp-memory-diff).

A frame is `{"filename", "line", "name"}`, innermost first, as `torch.cuda.memory._snapshot()`
records Python stacks. The innermost frame that a rule recognises decides:

- simsp's own export: file `simsp/<category>` (engine/allocator/snapshot.py) is that category
  (held_for_wgrad only there: a real snapshot's stacks name where a tensor was made, not that
  a deferred W step keeps it, so a real one counts those bytes as activations or temporaries);
- workspaces (a category simsp's ledger does not hold): a function named `*workspace*`
  (Transformer Engine `transformer_engine/pytorch/module/base.py` `get_workspace`, the cuBLAS
  workspace), or a file or function naming cublas, cudnn, nccl or userbuffers;
- optimizer: `torch/optim/`, `megatron/core/optimizer/`, `apex/optimizers/`,
  `transformer_engine/pytorch/optimizers/` (Adam's state and fp32 main parameters);
- gradients: `megatron/core/distributed/` (the DDP grad buffers of `param_and_grad_buffer.py`);
- communication: `torch/distributed/` and `megatron/core/tensor_parallel/mappings.py` (the
  collectives' output buffers);
- temporaries: the autograd engine's backward (`torch/autograd/` `backward`,
  `_engine_run_backward`) and any `backward` of a Megatron-LM or Transformer Engine module;
- weights: a Megatron-LM, Transformer Engine or `torch/nn/modules/` frame building a module
  (`__init__`, `reset_parameters`, `_initialize_affine_weight_gpu` of
  `megatron/core/tensor_parallel/layers.py`, ...);
- activations: any other frame of those three (the forward pass: `forward`, the pipeline's
  `forward_step`).

What no rule recognises is `unknown`. A layer is read from a frame naming it: simsp's `layer N`,
or `layers.N` / `layers[N]` in a module path.
"""

import re

from simsp.engine.memory import CATEGORIES

WORKSPACES = "workspaces"
UNKNOWN = "unknown"
# every category a diff can show: simsp's ledger's, then those only a real snapshot has
DIFF_CATEGORIES = CATEGORIES + (WORKSPACES, UNKNOWN)

_SIMSP_FILE = re.compile(r"^simsp/([a-z_]+)$")
_WORKSPACE = re.compile(r"workspace|cublas|cudnn|nccl|userbuffers", re.IGNORECASE)
_LAYER = re.compile(r"(?:^layer |layers[.\[])(\d+)")
# (path piece, category) for the files whose frames decide whatever the function
_BY_FILE = (("torch/optim/", "optimizer"), ("megatron/core/optimizer/", "optimizer"),
            ("apex/optimizers/", "optimizer"), ("transformer_engine/pytorch/optimizers/",
                                                "optimizer"),
            ("megatron/core/distributed/", "gradients"),
            ("megatron/core/tensor_parallel/mappings.py", "communication"),
            ("torch/distributed/", "communication"))
_MODULE_FILES = ("megatron/core/", "megatron/training/", "transformer_engine/pytorch/",
                 "torch/nn/modules/")
_BUILDERS = frozenset(("__init__", "reset_parameters", "_initialize_affine_weight_gpu",
                       "_initialize_affine_weight_cpu", "initialize_affine_weight_gpu",
                       "init_method", "_init_weights", "build_module", "get_model",
                       "model_provider", "setup_model_and_optimizer"))
_BACKWARDS = frozenset(("backward", "_engine_run_backward", "backward_step"))


def frame_category(frame: dict) -> str | None:
    """The category one frame decides, or None when no rule recognises it."""
    filename = str(frame.get("filename", "")).replace("\\", "/")
    name = str(frame.get("name", ""))
    own = _SIMSP_FILE.match(filename)
    if own:
        return own.group(1) if own.group(1) in CATEGORIES else UNKNOWN
    if _WORKSPACE.search(name) or _WORKSPACE.search(filename.rsplit("/", 1)[-1]):
        return WORKSPACES
    for piece, category in _BY_FILE:
        if piece in filename:
            return category
    if "torch/autograd/" in filename and name in _BACKWARDS:
        return "temporaries"
    if any(piece in filename for piece in _MODULE_FILES):
        if name in _BACKWARDS:
            return "temporaries"
        return "weights" if name in _BUILDERS else "activations"
    return None


def category_of(frames: list) -> str:
    """The category of an allocation with these frames (innermost first): the innermost
    frame's that a rule recognises, else unknown."""
    for frame in frames:
        category = frame_category(frame) if isinstance(frame, dict) else None
        if category is not None:
            return category
    return UNKNOWN


def layer_of(frames: list) -> int | None:
    """The layer a frame names (innermost first), or None."""
    for frame in frames:
        if isinstance(frame, dict):
            found = _LAYER.search(str(frame.get("name", ""))) or \
                _LAYER.search(str(frame.get("filename", "")))
            if found:
                return int(found.group(1))
    return None


def site_text(frames: list) -> str:
    """The allocation's site in one line: its innermost frames, innermost first."""
    shown = [f"{f.get('filename', '?')}:{f.get('line', 0)}:{f.get('name', '?')}"
             for f in frames[:3] if isinstance(f, dict)]
    return " < ".join(shown) if shown else "(no frames)"
