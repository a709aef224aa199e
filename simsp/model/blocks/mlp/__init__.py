"""The dense MLP block (dense.py) and the activations every MLP applies (activation.py)."""
