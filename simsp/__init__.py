"""simsp: a discrete-event simulator of GPT training on emulated A100 clusters."""

__version__ = "0.1.0"
