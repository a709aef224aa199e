"""Attention blocks (mha.py: MHA/GQA/MQA, mla.py: multi-latent) and what they share: the
core (core.py, flash.py), the head layout (heads.py) and RoPE (rope.py)."""
