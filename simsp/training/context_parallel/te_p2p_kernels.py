"""The memory-bound kernels Transformer Engine's p2p context-parallel attention runs around its
fused-attention calls (docs/context-parallel.md "TE's bookkeeping kernels").

NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py, class AttnFuncWithCPAndKVP2P (commit d0067d0da), BF16, causal, bshd/sbhd
(Megatron's layout), for one rank `rank` of `cp` and its n local tokens:

forward
- `p2p_comm_buffers[0] = torch.cat((k.view(-1), v.view(-1)))`: K and V packed into the first
  send buffer (read K, V; write both);
- per step the logsumexp merge: step 0 `torch.clone(softmax_lse_per_step[0])`, step i ≥ 1
  `flash_attn_fwd_softmax_lse_correction` (the whole lse when i ≤ rank, else
  `flash_attn_fwd_second_half_softmax_lse_correction` on its second half): fp32, b·h·n rows;
- after the loop the output merge: step 0 `flash_attn_fwd_out_correction_init` (read the step's
  output, write the merged one), step i ≥ 1 `flash_attn_fwd_out_correction` when i ≤ rank (read
  the step's output, read and write the merged one), else
  `flash_attn_fwd_second_half_out_correction` on the second half of the rows;

backward
- `p2p_comm_buffers[0][0].copy_(kv)`: the saved K/V copied into the first send buffer;
- per step i, after the step's fused backward, dQ and dK/dV accumulated into the buffers:
  dQ: i > cp−rank−1 add; i = cp−rank−1 copy (rank = cp−1) or copy first half + add second half;
  0 < i < cp−rank−1 add to the second half; i = 0 < cp−rank−1 copy to the second half;
  dK and dV (each): i = cp−1 add (rank > 0) or add first half + copy second half (rank 0);
  cp−rank−1 ≤ i < cp−1 copy (i = 0, rank = cp−1) or add to the first half;
  i < cp−rank−1 copy (i = 0) or add.

A copy reads and writes its bytes, an add reads two and writes one. The (unmodelled)
Transformer Engine 1.8 of NeMo 24.07 also copied the half K/V `.contiguous()` and concatenated
dK/dV per step (transformer_engine/pytorch/attention.py AttnFuncWithCP, v1.8).
"""

LSE_BYTES = 4  # fp32 logsumexp per (batch, head, row)


def _copy(nbytes: float) -> int:
    return int(2 * nbytes)


def _add(nbytes: float) -> int:
    return int(3 * nbytes)


def forward_prologue(kv_bytes: int) -> list:
    """[(kernel, bytes)] before the ring starts: K and V packed into the send buffer."""
    return [("cp_kv_pack", _copy(kv_bytes))]


def forward_step(step: int, rank: int, lse_bytes: int) -> list:
    """[(kernel, bytes)] of the logsumexp merge of `step` (a whole lse of lse_bytes)."""
    if step == 0:
        return [(f"cp_lse_{step}", _copy(lse_bytes))]
    return [(f"cp_lse_{step}", _add(lse_bytes if step <= rank else lse_bytes / 2))]


def forward_epilogue(cp: int, rank: int, out_bytes: int) -> list:
    """[(kernel, bytes)] of the output merge after the loop (out_bytes: the rank's whole output)."""
    kernels = [("cp_out_correction_0", _copy(out_bytes))]
    for step in range(1, cp):
        kernels.append((f"cp_out_correction_{step}",
                        _add(out_bytes if step <= rank else out_bytes / 2)))
    return kernels


def backward_prologue(kv_bytes: int) -> list:
    """[(kernel, bytes)] before the backward ring: the saved K/V into the send buffer."""
    return [("cp_kv_copy", _copy(kv_bytes))]


def backward_step(step: int, cp: int, rank: int, q_bytes: int, k_bytes: int,
                  v_bytes: int) -> list:
    """[(kernel, bytes)] accumulating step `step`'s dQ, dK and dV into the rank's buffers."""
    turn = cp - rank - 1  # the first step whose block covers all of the rank's queries
    if step > turn:
        dq = [_add(q_bytes)]
    elif step == turn:
        dq = [_copy(q_bytes)] if rank == cp - 1 else [_copy(q_bytes / 2), _add(q_bytes / 2)]
    elif step > 0:
        dq = [_add(q_bytes / 2)]
    else:
        dq = [_copy(q_bytes / 2)]
    kernels = [(f"cp_dq_{step}" + (f"_{i}" if i else ""), b) for i, b in enumerate(dq)]
    for name, t in (("dk", k_bytes), ("dv", v_bytes)):
        if step == cp - 1:
            parts = [_add(t / 2), _copy(t / 2)] if rank == 0 else [_add(t)]
        elif step >= turn:
            parts = [_copy(t / 2)] if step == 0 and rank == cp - 1 else [_add(t / 2)]
        else:
            parts = [_add(t)] if step > 0 else [_copy(t)]
        kernels += [(f"cp_{name}_{step}" + (f"_{i}" if i else ""), b) for i, b in enumerate(parts)]
    return kernels
