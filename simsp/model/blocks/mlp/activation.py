"""The MLP's activation functions, numpy math and the rank's op: GeLU (tanh form, GPT-2 and
Megatron-LM's default), SwiGLU (--swiglu: silu(gate) · up, Megatron-LM
fusions/fused_bias_swiglu.py) and squared ReLU (--squared-relu: relu(x)², So et al. 2021
arXiv:2109.08668, Megatron-LM core/activations.py squared_relu; the dense MLP only). The dense MLP (mlp/dense.py), the routed and the shared experts
(blocks/moe/) all apply them.

A gated activation reads fc1's output (..., 2f) = [gate | up] and writes (..., f): its fc1 is
h -> 2f, so an MLP of width f runs three GEMMs of h·f per token where GeLU's runs two (the
ffn factor of Megatron-LM's num_floating_point_operations, megatron/training/training.py).
"""

from dataclasses import dataclass
import math
from typing import Callable

import numpy as np

from simsp.model.base import fusions
from simsp.model.base.ops import elementwise
from simsp.model.tensor import Tensor

# ---------------------------------------------------------------------------------------------
# GeLU, tanh approximation (GPT-2 / Megatron: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def gelu_forward(x):
    """GPT-2 tanh-approximated GeLU, elementwise."""
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + _GELU_A * x**3)))  # (...)


def gelu_backward(dy, x):
    """dx of the tanh-approximated GeLU (derivative of the formula above)."""
    t = np.tanh(_GELU_C * (x + _GELU_A * x**3))  # (...)
    dinner = _GELU_C * (1.0 + 3.0 * _GELU_A * x**2)  # (...)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)  # (...)


# ---------------------------------------------------------------------------------------------
# SwiGLU (Shazeer 2020, arXiv:2002.05202)


def swiglu_forward(x):
    """silu(gate) * up for x (..., 2f') = [gate | up] (Megatron-LM fusions/fused_bias_swiglu.py)."""
    gate, up = np.split(x, 2, axis=-1)  # (..., f') each
    return gate / (1.0 + np.exp(-gate)) * up  # (..., f')


def swiglu_backward(dy, x):
    """dx (..., 2f') = [d gate | d up] of silu(gate) * up."""
    gate, up = np.split(x, 2, axis=-1)  # (..., f') each
    sig = 1.0 / (1.0 + np.exp(-gate))  # (..., f')
    dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))  # (..., f')
    return np.concatenate([dgate, dy * gate * sig], axis=-1)  # (..., 2f')


# ---------------------------------------------------------------------------------------------
# squared ReLU (Primer, So et al. 2021, arXiv:2109.08668)


def squared_relu_forward(x):
    """relu(x)², elementwise."""
    return np.square(np.maximum(x, 0.0))  # (...)


def squared_relu_backward(dy, x):
    """dx of relu(x)²: 2·relu(x)·dy."""
    return dy * 2.0 * np.maximum(x, 0.0)  # (...)


# ---------------------------------------------------------------------------------------------
# the activation a model's MLPs use


@dataclass(frozen=True)
class Activation:
    """One activation function of the MLP: its numpy pair and its shape."""

    name: str  # names the saved input: "{name}_input" (gelu_input, swiglu_input)
    label: str  # as reports print it
    gated: bool  # reads [gate | up] (..., 2f): fc1 is h -> 2f
    forward: Callable  # numpy: x (..., f | 2f) -> (..., f)
    backward: Callable  # numpy: dy (..., f), x (..., f | 2f) -> dx (..., f | 2f)

    @property
    def gemms(self) -> int:
        """GEMMs of h·f per token in an MLP of width f: 3 gated (fc1's two halves, fc2), else 2."""
        return 3 if self.gated else 2

    def fc1_width(self, f: int) -> int:
        """fc1's output width for an MLP of width f: 2f gated, else f."""
        return 2 * f if self.gated else f


GELU = Activation("gelu", "GeLU", False, gelu_forward, gelu_backward)
SWIGLU = Activation("swiglu", "SwiGLU", True, swiglu_forward, swiglu_backward)
SQUARED_RELU = Activation("squared_relu", "squared ReLU", False, squared_relu_forward,
                          squared_relu_backward)


def activation_of(m) -> Activation:
    """The model's MLP activation: SwiGLU with --swiglu, squared ReLU with --squared-relu, else
    GeLU."""
    if m.swiglu:
        return SWIGLU
    return SQUARED_RELU if m.squared_relu else GELU


def fused_with_bias(m, act: Activation) -> bool:
    """Megatron's bias + activation fusion for the model: SwiGLU's with bias_swiglu_fusion,
    GeLU's with bias_gelu_fusion and a bias (megatron/training/arguments.py turns it off
    without one); squared ReLU is priced as one kernel (its two eager kernels not modelled)."""
    if act.gated:
        return m.bias_swiglu_fusion
    return act is SQUARED_RELU or (m.bias_gelu_fusion and m.add_bias_linear)


def activate(r, act: Activation, x: Tensor, name: str, fused: bool = True,
             biased: bool = False):
    """act(x): x (..., f | 2f) -> (..., f); fused one kernel reads x, writes the output
    (unfused: base/fusions.py bias_activation_forward's kernels)."""
    f = x.shape[-1] // 2 if act.gated else x.shape[-1]
    moved = fusions.bias_activation_forward(x.nbytes, act.gated, fused, biased)
    return (yield from elementwise(r, x.shape[:-1] + (f,), name, lambda: act.forward(x.data),
                                   moved))


def activate_grad(r, act: Activation, dy: Tensor, x: Tensor, name: str, fused: bool = True):
    """d act at the kept input x (..., f | 2f) from dy (..., f); fused one kernel reads dy and
    x, writes dx (unfused: base/fusions.py bias_activation_backward's kernels)."""
    moved = fusions.bias_activation_backward(x.nbytes, act.gated, fused)
    return (yield from elementwise(r, x.shape, name, lambda: act.backward(dy.data, x.data),
                                   moved))
