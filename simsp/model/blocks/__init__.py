"""The transformer's blocks, one room each with its forward, backward, saved tensors,
parameter shapes and FLOPs; blocks/variants.py says which a model uses and what a block has."""
