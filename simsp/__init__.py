"""simsp: a discrete-event simulator of GPT training on emulated A100 clusters."""

__version__ = "0.1.0"


def sweep(*args, **kwargs):
    """Sweep configurations and return a pandas DataFrame (see simsp.api.sweep)."""
    from simsp.api import sweep as run_sweep

    return run_sweep(*args, **kwargs)
