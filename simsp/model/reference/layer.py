"""One transformer layer of the reference: pre-norm, attention, residual, norm, MLP, residual
(Megatron-LM transformer_layer.py; Radford et al. 2019 for GPT-2's pre-LN order):

  x -> norm1 -> attention -> projection (+ bias) -> dropout -> + x = x1
    -> norm2 -> MLP (GeLU or SwiGLU, or the MoE of reference/moe.py) -> dropout -> + x1

Dropout masks come from simsp/model/base/dropout_sites.py: that module is the random-number
definition every layout shares (which element of which site is dropped), not a kernel.
"""

from dataclasses import dataclass

from simsp.model.base.dropout_sites import attention_keep, hidden_keep
from simsp.model.reference import textbook as tb
from simsp.model.reference.attention import grouped_query_attention, latent_attention


@dataclass(frozen=True)
class Site:
    """Where a layer draws its dropout masks: the run's seed, the layer index (an MTP depth
    k's layer is L + k) and the global index of the first sample."""

    seed: int
    layer: int
    sample_offset: int = 0

    def hidden(self, p: float, name: str, shape: tuple):
        """Keep-mask (s, b, h) of hidden dropout site `name`, None when p = 0."""
        if p == 0:
            return None
        return hidden_keep(p, self.seed, self.layer, name, shape, sample_start=self.sample_offset)

    def attention(self, p: float, shape: tuple):
        """Keep-mask (b, a, s, s) of the attention probabilities, None when p = 0."""
        if p == 0:
            return None
        return attention_keep(p, self.seed, self.layer, shape, sample_start=self.sample_offset)


def norm(P: dict, x, prefix: str, model):
    """--normalization LayerNorm or RMSNorm of x with the weights under `prefix`."""
    if model.normalization == "RMSNorm":
        return tb.rms_norm(x, P[f"{prefix}.gamma"], model.norm_epsilon)
    return tb.layer_norm(x, P[f"{prefix}.gamma"], P[f"{prefix}.beta"], model.norm_epsilon)


def dense_mlp(P: dict, y, model):
    """fc1 -> GeLU (or squared ReLU) -> fc2, or SwiGLU with fc1 (h, 2, f) = [gate, up] (biases
    (2, f))."""
    fc1, bias = P["mlp.fc1.weight"], P.get("mlp.fc1.bias")
    if model.swiglu:
        gate = tb.linear(y, fc1[:, 0], None if bias is None else bias[0])  # (s, B, f)
        up = tb.linear(y, fc1[:, 1], None if bias is None else bias[1])  # (s, B, f)
        hidden = tb.swiglu(gate, up)
    elif model.squared_relu:
        hidden = tb.squared_relu(tb.linear(y, fc1, bias))  # (s, B, f)
    else:
        hidden = tb.gelu_tanh(tb.linear(y, fc1, bias))  # (s, B, f)
    return tb.linear(hidden, P["mlp.fc2.weight"], P.get("mlp.fc2.bias"))


def layer(P: dict, x, model, site: Site, moe_group: int | None = None, moe_chunks=1):
    """x (s, B, h) -> (output (s, B, h), the MoE aux loss term or None). A MoE layer routes
    each micro-batch of `moe_group` samples (all B when None) per row set of `moe_chunks`."""
    s, B, _ = x.shape
    ph, pa = model.hidden_dropout, model.attention_dropout
    keep = site.attention(pa, (B, model.num_attention_heads, s, s))
    attend = latent_attention if model.multi_latent_attention else grouped_query_attention
    context = attend(P, norm(P, x, "ln1", model), model, keep, pa)  # (s, B, a·d_v)
    proj = tb.linear(context, P["attn.proj.weight"], P.get("attn.proj.bias"))  # (s, B, h)
    x1 = x + tb.dropout(proj, site.hidden(ph, "attn_out", proj.shape), ph)
    y = norm(P, x1, "ln2", model)
    if "mlp.router.weight" in P:
        from simsp.model.reference.moe import moe_mlp  # MoE layers only
        mlp, aux = moe_mlp(P, y, model, moe_group or B, moe_chunks)
    else:
        mlp, aux = dense_mlp(P, y, model), None
    return x1 + tb.dropout(mlp, site.hidden(ph, "mlp_out", mlp.shape), ph), aux
