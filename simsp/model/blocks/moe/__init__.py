"""The mixture-of-experts MLP block (layer.py) and its rooms: router, dispatchers, experts,
shared experts, the meta routing model, the experts' placement (docs/moe.md)."""
