"""The single-device reference every parallel layout is compared with (`simsp verify`, the
tests), written apart from the simulated model: it imports none of simsp's kernels or ops.

textbook.py holds the forward math of each piece from its source (norms, GeLU/SwiGLU, RoPE as
Megatron-LM applies it, MLA's de-interleave included, causal attention with K/V groups, cross
entropy); attention.py, moe.py and layer.py build the blocks from it; model.py the whole model
with multi-token prediction. Gradients come from autodiff.py's reverse mode over the forward,
so no backward formula is shared with (or copied from) the simulated kernels. Dropout masks
come from simsp/model/base/dropout_sites.py, the random-number definition every layout draws from.
"""

from simsp.model.reference.model import (reference_forward_backward, reference_layer,
                                         relative_error)

__all__ = ["reference_forward_backward", "reference_layer", "relative_error"]
