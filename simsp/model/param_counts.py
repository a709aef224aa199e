"""Total and active parameters of the simulated model, counted from the shapes it allocates
(simsp/model/params.py `param_shapes`; docs/moe.md, docs/mla.md).

Active = what one token's forward touches: every tensor except the routed experts a token is
not sent to, i.e. per MoE layer k of the E experts (the router, shared experts, attention,
norms, the embedding and the output layer all count). The embedding table is counted whole,
as the model cards count it.
"""

import math

from simsp.scenario.config import Model
from simsp.model.params import param_shapes

ROUTED = (".mlp.experts.fc1.weight", ".mlp.experts.fc2.weight")  # (E, ...) per MoE layer


def parameter_counts(m: Model) -> dict:
    """{"total", "active", "embedding"} parameters of model m (its own vocabulary, unpadded);
    with multi-token prediction "mtp" {"total", "active"} apart (its depths' own tensors, the
    embedding and output layer shared), as DeepSeek-V3 states 671B + 14B of MTP."""
    counts = {"main": [0, 0], "mtp": [0, 0]}
    for name, shape in param_shapes(m).items():
        n = math.prod(shape)
        part = counts["mtp" if name.startswith("mtp.") else "main"]
        part[0] += n
        part[1] += n * m.moe_router_topk // shape[0] if name.endswith(ROUTED) else n
    embedding = m.vocab_size * m.hidden_size * (1 if m.tied else 2)
    out = {"total": counts["main"][0], "active": counts["main"][1], "embedding": embedding}
    if m.mtp_num_layers:
        out["mtp"] = dict(zip(("total", "active"), counts["mtp"]))
    return out


def describe(counts: dict) -> str:
    """One line for the reports: "671.03B total, 37.55B active (5.6%)"."""
    share = 100 * counts["active"] / counts["total"]
    return (f"{counts['total'] / 1e9:.2f}B total, {counts['active'] / 1e9:.2f}B active "
            f"({share:.1f}%)")
