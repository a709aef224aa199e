"""Tensors in two modes: numeric (a numpy array) or meta (shape only), sized in the training dtype."""

from dataclasses import dataclass
import math

import numpy as np

# Bytes per element as trained (mixed precision, K22 §4): activations fp16/bf16, masks 1 byte,
# logits for the loss, master weights, gradients and Adam state fp32.
FP16, MASK, FP32 = 2, 1, 4


@dataclass(eq=False, slots=True)
class Tensor:
    """A tensor on one emulated rank; `key` is its ledger entry while it is live."""

    shape: tuple[int, ...]
    itemsize: int  # training-dtype bytes per element, not the numpy dtype's
    data: np.ndarray | None = None
    key: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize  # numel * itemsize, one call less

    def __post_init__(self):
        self.shape = tuple(map(int, self.shape))
        if self.data is not None and tuple(self.data.shape) != self.shape:
            raise ValueError(f"data shape {self.data.shape} != tensor shape {self.shape}")

    @classmethod
    def meta(cls, shape: tuple, itemsize: int, key: str | None) -> "Tensor":
        """A shape-only tensor from an already-checked shape (fast: replayed layers make many)."""
        tensor = object.__new__(cls)
        tensor.shape, tensor.itemsize, tensor.data, tensor.key = shape, itemsize, None, key
        return tensor
