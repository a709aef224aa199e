"""The routed experts of a MoE layer: each expert a bias-free MLP (Megatron-LM
megatron/core/transformer/moe/experts.py SequentialMLP, or TEGroupedMLP with
--moe-grouped-gemm: fc1, GeLU or SwiGLU, fc2) on the rows routed to it, expert-major: numpy
math and the rank's ops. A rank runs its E/EP local experts, each on its f/ETP slice (expert
tensor parallelism, blocks/moe/placement.py). The whole routed MoE on one device (router,
experts, unpermute: the single-device reference's) is here too. Kept for backward:

| name                       | shape            | bytes              |
|----------------------------|------------------|--------------------|
| permuted_tokens            | (N_in, h)        | 2N_in·h            |
| expert_{gelu,swiglu}_input | (N_in, f | 2f)   | 2N_in·f (4N_in·f)  |
| expert_fc2_input           | (N_in, f)        | 2N_in·f            |
| expert_output              | (N, h)           | 2Nh                |
N_in the rows this rank's experts compute, f the expert width over ETP; `--recompute-modules
moe_act` drops expert_fc2_input (backward redoes the activation). The rows per local expert
(`tokens_per_expert`) are kept outside the ledger.
"""

import numpy as np

from simsp.model.base.stash import recomputing
from simsp.model.blocks.mlp.activation import GELU, SWIGLU, activation_of
from simsp.model.tensor import FP16

FC1, FC2 = "mlp.experts.fc1.weight", "mlp.experts.fc2.weight"
COUNTS = "tokens_per_expert"  # the (EP, E) count matrix, kept outside the ledger (8·EP·E bytes)


# ---------------------------------------------------------------------------------------------
# numpy


def _splits(counts):
    """(start, end) of each expert's rows in expert-major order."""
    ends = np.cumsum(counts)
    return [(int(e - c), int(e)) for c, e in zip(counts, ends)]


def experts_forward(xp, fc1, fc2, counts, swiglu: bool):
    """Each expert's MLP on its rows of xp (N, h): fc1 (E, h, f|2f), fc2 (E, f, h).
    Returns out (N, h) and the activation inputs (N, f|2f) and outputs (N, f)."""
    act = (SWIGLU if swiglu else GELU).forward
    h1 = np.concatenate([xp[a:b] @ fc1[e] for e, (a, b) in enumerate(_splits(counts))])
    g = act(h1)  # (N, f)
    out = np.concatenate([g[a:b] @ fc2[e] for e, (a, b) in enumerate(_splits(counts))])
    return out, h1, g


def experts_input_grads(dout, h1, fc1, fc2, counts, swiglu: bool):
    """The data gradients of experts_forward: d xp (N, h) and d h1 (N, f|2f), the
    activation input's gradient that fc1's weight gradient multiplies (d fc1 =
    expert_weight_grads(xp, d h1), d fc2 = expert_weight_grads(g, dout))."""
    back = (SWIGLU if swiglu else GELU).backward
    dxp = np.zeros((dout.shape[0], fc1.shape[1]), dtype=dout.dtype)  # (N, h)
    dh1 = np.zeros_like(h1)  # (N, f|2f)
    for e, (a, b) in enumerate(_splits(counts)):
        dh1[a:b] = back(dout[a:b] @ fc2[e].T, h1[a:b])  # (n_e, f|2f)
        dxp[a:b] = dh1[a:b] @ fc1[e].T
    return dxp, dh1


def expert_weight_grads(x, dy, counts):
    """Each expert's weight gradient x_e^T dy_e from its rows: x (N, k), dy (N, n) ->
    (E, k, n) (an expert without rows: zeros)."""
    return np.stack([x[a:b].T @ dy[a:b] for a, b in _splits(counts)])


# ---------------------------------------------------------------------------------------------
# ops on a rank


def _weights(w: dict) -> dict:
    """The kernels' view: fc1 (E_local, h, f | 2f), fc2 (E_local, f, h)."""
    fc1 = w[FC1].data
    return {"fc1": fc1.reshape(fc1.shape[0], fc1.shape[1], -1), "fc2": w[FC2].data}


def expert_gemm(r, name: str, counts: np.ndarray, k: int, n: int, passes: int = 1):
    """The experts' GEMMs of rows `counts` (E_local,) by (k, n): one grouped GEMM
    (--moe-grouped-gemm, TEGroupedMLP) or one GEMM per expert (SequentialMLP); `passes` 2 for
    a backward's data and weight gradients. An expert without rows launches nothing."""
    total = int(counts.sum())
    if r.moe is None or r.moe.grouped_gemm:
        if total:
            yield from r.compute(name, "gemm", passes * 2 * total * k * n, gemm=(total, k, n))
        return
    for e, rows in enumerate(counts):
        if rows:
            yield from r.compute(f"{name}.{e}", "gemm", passes * 2 * int(rows) * k * n,
                                 gemm=(int(rows), k, n))


def act_in_name(m) -> str:
    """The activation's kept input: expert_gelu_input, expert_swiglu_input."""
    return f"expert_{activation_of(m).name}_input"


def activation(r, m, act_in, name: str, f: int, site: str):
    """GeLU or SwiGLU of act_in (N, f | 2f) (a recompute), as a new (N, f) tensor."""
    fn = activation_of(m).forward
    out = r.alloc(act_in.shape[:-1] + (f,), FP16, name,
                  data=fn(act_in.data) if r.numeric else None)
    yield from r.compute(site, "elementwise", nbytes=act_in.nbytes + out.nbytes)
    return out


def forward(r, spec, w, x_in, local, stash):
    """fc1 -> activation -> fc2 on the experts' rows x_in (N_in, h), local (E_local,) rows per
    expert; returns (N_in, h). `--recompute-modules moe_act`: the activation's output is not
    kept (backward redoes it)."""
    m = spec.model
    n_in, h = x_in.shape
    f = m.moe_ffn // (r.moe.etp if r.moe is not None else 1)  # this rank's f/ETP
    width = activation_of(m).fc1_width(f)
    h1 = g = out = None
    if r.numeric:
        weights = _weights(w)
        out, h1, g = experts_forward(x_in.data, weights["fc1"], weights["fc2"], local,
                                     m.swiglu)
    act_in = r.alloc((n_in, width), FP16, act_in_name(m), data=h1)
    yield from expert_gemm(r, "experts_fc1", local, h, width)
    act_out = r.alloc((n_in, f), FP16, "expert_fc2_input", data=g)
    yield from r.compute("experts_act", "elementwise", nbytes=act_in.nbytes + act_out.nbytes)
    expert_out = r.alloc((n_in, h), FP16, "expert_output", data=out)
    yield from expert_gemm(r, "experts_fc2", local, f, h)
    stash.put(act_in_name(m), act_in)
    if spec.recomputes("moe_act"):
        r.free(act_out)
    else:
        stash.put("expert_fc2_input", act_out)
    return expert_out


def backward(r, m, w, g, saved, d_in, local, h: int):
    """d of fc2, the activation and fc1 on the experts' rows: d_in (N_in, h) -> (N_in, h);
    the local experts' weight gradients accumulate in g, or, in a split backward's B
    (`r.wgrad`, base/wgrad_store.py), wait with what they read for the W step."""
    x_in, act_in = saved.pop("permuted_tokens"), saved.pop(act_in_name(m))
    act_out = saved.pop("expert_fc2_input", None)
    if act_out is None:  # moe_act recomputed
        f = act_in.shape[1] // (2 if activation_of(m).gated else 1)
        with recomputing(r):
            act_out = yield from activation(r, m, act_in, "expert_fc2_input", f,
                                             "recompute_experts_act")
    n_in, width, f = x_in.shape[0], act_in.shape[1], act_out.shape[1]
    dx_data = dh1 = None
    if r.numeric:
        weights = _weights(w)
        dx_data, dh1 = experts_input_grads(d_in.data, act_in.data, weights["fc1"],
                                           weights["fc2"], local, m.swiglu)
    d_act = r.alloc((n_in, f), FP16, "d_expert_fc2")
    yield from _grads(r, g, FC2, (d_in, act_out), local, "d_expert_fc2", (f, h))
    r.free(d_in, act_out)
    d_act_in = r.alloc((n_in, width), FP16, "d_expert_act_input", data=dh1)
    yield from r.compute("d_expert_act_input", "elementwise", nbytes=3 * act_in.nbytes)
    r.free(d_act, act_in)
    dx_in = r.alloc((n_in, h), FP16, "d_expert_fc1", data=dx_data)
    yield from _grads(r, g, FC1, (d_act_in, x_in), local, "d_expert_fc1", (h, width))
    r.free(d_act_in, x_in)
    return dx_in


def _grads(r, g, w_name: str, read: tuple, local, name: str, kn: tuple):
    """One expert GEMM's backward, read = (its output gradient (N_in, n), its input (N_in, k)):
    the data and weight gradients as one kernel of two passes, or, in a split backward's B,
    the data gradient now and the weight gradient's grouped GEMM deferred to W with the two
    tensors it reads (Qi et al., arXiv:2401.10241 §2; DeepSeek-V3 report §3.2.1's "backward
    for weights" of the MLP)."""
    if r.wgrad is None:
        _accumulate(r, g, w_name, *read, local)
        yield from expert_gemm(r, name, local, *kn, passes=2)
        return
    yield from expert_gemm(r, name, local, *kn)
    r.wgrad.defer(r, read, lambda dy, x: _weight_grad(r, g, w_name, dy, x, local,
                                                       name + "_weight", kn))


def _weight_grad(r, g, w_name: str, dy, x, local, name: str, kn: tuple):
    """The deferred weight gradient of one expert GEMM, at the W step."""
    _accumulate(r, g, w_name, dy, x, local)
    yield from expert_gemm(r, name, local, *kn)


def _accumulate(r, g, w_name: str, dy, x, local) -> None:
    """g[w_name] (E_local, k, n·) += each local expert's x_e^T dy_e (numeric mode)."""
    if r.numeric:
        g[w_name].data += expert_weight_grads(x.data, dy.data, local).reshape(g[w_name].shape)
