"""Numeric results of a simulated iteration, reassembled on one device and compared to the oracle."""

import numpy as np

from simsp.model.context_split import local_positions
from simsp.model.blocks.moe.placement import etp_split_axis, is_expert_param
from simsp.model.params import param_shapes
from simsp.model.reference import reference_forward_backward, relative_error
from simsp.model.sharding import unshard
from simsp.training.data_parallel.grad_scaling import loss_gradient_factor


def _holder_stage(name: str, plans: dict, states: dict) -> int:
    """The pipeline stage whose copy of `name` we read (the embedding's for the tied table)."""
    for plan in plans.values():
        if plan.tp == 0 and plan.dp == 0 and name in states[plan.rank].grads:
            return plan.pp
    raise KeyError(name)


def gathered_grads(run, dp: int = 0, cp: int = 0) -> dict:
    """Full canonical gradients of DP replica `dp`, CP rank `cp`, from the ranks' states after
    the iteration's reductions (`run`: training/driver/run.py Run)."""
    inputs, states = run.inputs, run.states
    grads = {}
    t = inputs.sc.parallel.tp
    local = _fsdp_local_grads(inputs, states, dp)
    for name in param_shapes(inputs.sc.padded_model):
        pp = _holder_stage(name, inputs.plans, states)
        shards = [local[(tp, pp)][name] if local else
                  states[inputs.rank_of(tp, dp, pp, cp)].grads[name].data for tp in range(t)]
        grads[name] = (_expert_grad(inputs, states, name, dp, pp) if is_expert_param(name)
                       else unshard(name, shards))
    return grads


def _fsdp_local_grads(inputs, states: dict, dp: int) -> dict | None:
    """Under sharded DP: {(tp, pp): TP-local gradients} rebuilt from every DP rank's reduced
    shard (training/data_parallel/fsdp.py), the same for every replica `dp`; None otherwise."""
    p = inputs.sc.parallel
    if p.fsdp in (None, "no_shard"):
        return None
    from simsp.training.data_parallel.fsdp_reductions import full_grads  # FSDP code: only FSDP runs
    group = inputs.world.grid.dp_cp_group  # the ranks a unit is sharded over, in shard order
    return {(tp, pp): full_grads([states[k].fsdp for k in group(inputs.rank_of(tp, 0, pp))])
            for tp in range(p.tp) for pp in range(p.pp)}


def _expert_grad(inputs, states: dict, name: str, dp: int, pp: int) -> np.ndarray:
    """An expert weight's full gradient: every EP member's experts, in expert order, each
    joined from its ETP members' f slices."""
    axis = etp_split_axis(name)
    ranks = inputs.world.ranks
    group = ranks[inputs.rank_of(0, dp, pp)].moe.ep_group
    return np.concatenate([np.concatenate([states[peer].grads[name].data
                                           for peer in ranks[rank].moe.etp_group],
                                          axis=axis) for rank in group])


def moe_token_rows(sc):
    """The rows each rank routes, for the reference's MoE (each drops and pads its own): t
    (s/t chunks) without context parallelism, else every (cp, tp) rank's positions (s/(t·cp),)
    — its CP share (model/context_split.py), split over TP by sequence parallelism."""
    p, s = sc.parallel, sc.model.seq_length
    if p.cp == 1:
        return p.tp
    return [part for j in range(p.cp)
            for part in np.array_split(local_positions(s, p.cp, j), p.tp)]


def compare_with_reference(run) -> dict:
    """Loss and every gradient of a numeric `run` vs the single-device reference over the same
    global batch."""
    sc, data = run.inputs.sc, run.inputs.data
    ref_loss, ref = reference_forward_backward(data.params, data.tokens, data.targets, sc.model,
                                               sc.run.seed,
                                               moe_group=sc.parallel.micro_batch_size,
                                               moe_chunks=moe_token_rows(sc))
    errors = {"loss": abs(run.loss - ref_loss) / abs(ref_loss)}
    for dp in range(sc.parallel.dp):
        for cp in range(sc.parallel.cp):
            for name, grad in gathered_grads(run, dp, cp).items():
                errors[name] = max(errors.get(name, 0.0), relative_error(grad, ref[name]))
    errors["embedding_output"] = relative_error(embedding_output_grad(sc, run.results),
                                                ref["embedding_output"])
    return errors


def embedding_output_grad(sc, results) -> np.ndarray:
    """The gradient at the embedding output for the whole global batch, (s, B, h), from the
    run's results, as the gradient of the global-mean loss: a replica's activation gradients
    are of its own mean loss (d·cp times larger) under --ddp-average-in-collective
    (training/data_parallel/grad_scaling.py)."""
    s, B, h = sc.model.seq_length, sc.parallel.global_batch, sc.model.hidden_size
    full = np.zeros((s, B, h))
    b, t, cp = sc.parallel.micro_batch_size, sc.parallel.tp, sc.parallel.cp
    per_replica = B // sc.parallel.dp
    for (tp, dp, mb, cp_rank), grad in results.embedding_grads.items():
        if sc.parallel.sequence_parallel or tp == 0:
            positions = local_positions(s, cp, cp_rank) if cp > 1 else np.arange(s)  # (s/cp,)
            rows = len(positions) // t if sc.parallel.sequence_parallel else len(positions)
            start = tp * rows if sc.parallel.sequence_parallel else 0
            col = dp * per_replica + mb * b
            full[positions[start:start + rows], col:col + b] = grad
    return full / loss_gradient_factor(sc.parallel)
