"""One schedule step on one rank: the forward or backward of a model chunk for a micro-batch.

A chunk is the embedding (first virtual stage), its layers, and the head and loss (last virtual
stage); activations and their gradients cross stages point-to-point in the calls Megatron makes
between steps (training/pipeline/stage_program.py runs them). A step reads the run's inputs
(training/driver/run.py RunInputs), changes its rank's RankState and records into RunResults.
"""

from dataclasses import dataclass, field

from simsp.model.blocks.embedding import embedding_backward, embedding_forward
from simsp.model.base.wgrad_store import WeightGradStore
from simsp.model.blocks.head import head_backward, head_forward
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.data_parallel.grad_scaling import loss_gradient_factor
from simsp.training.pipeline import delay_wgrad
from simsp.training.pipeline.layer_chain import chunk_backward, chunk_forward
from simsp.training.pipeline.plan import StagePlan, sample_offset


@dataclass
class RankState:
    """A rank's parameters (full canonical names), per-layer views, and pending stashes."""

    weights: dict
    grads: dict
    stashes: dict = field(default_factory=dict)  # (micro_batch, chunk) -> saved tensors
    split_backward: bool = False  # the schedule has W steps (training/pipeline/schedules.py)
    deferred: dict = field(default_factory=dict)  # (micro_batch, chunk) -> WeightGradStore
    inbox: dict = field(default_factory=dict)  # p2p key -> received tensor, not yet consumed
    outbox: dict = field(default_factory=dict)  # p2p key -> (destination, tensor) to send
    pending: dict = field(default_factory=dict)  # step kind -> posted p2p Handles (overlap)
    segments: dict = field(default_factory=dict)  # chunk -> its recompute segments
    # DP gradient buckets (training/data_parallel/grad_buckets.py), or the FSDP units
    ddp_buckets: DDPBuckets | None = None
    fsdp: object = None  # training/data_parallel/fsdp.py FsdpUnits under sharded data parallelism
    offload: object = None  # training/pipeline/offload.py ActivationOffload (--cpu-offloading)
    delayed: object = None  # training/pipeline/delay_wgrad.py DelayedWgrad of the last backward
    # under --delay-wgrad-compute, until its deferred weight gradients have all run
    p2p: object = None  # training/pipeline/stage_program.py P2PSetup, set when the schedule starts
    amax: object = None  # training/fp8_amax.py AmaxReduction under FP8 delayed scaling, else None
    _layers: dict = field(default_factory=dict)  # layer prefix -> (weights, grads) by suffix

    def layer(self, i: int) -> tuple[dict, dict]:
        """Layer i's weights and gradients keyed by suffix ("ln1.gamma", ...)."""
        return self.layer_tables(f"layers.{i}.")

    def layer_tables(self, prefix: str) -> tuple[dict, dict]:
        """The weights and gradients under `prefix` ("layers.3.", "mtp.0.layer."), keyed by
        suffix; every layer's tables are built in one pass over the names, on first use."""
        if not self._layers:
            for table_index, table in enumerate((self.weights, self.grads)):
                for name, tensor in table.items():
                    head = _layer_prefix(name)
                    if head is not None:
                        tables = self._layers.setdefault(head, ({}, {}))
                        tables[table_index][name.removeprefix(head)] = tensor
        return self._layers.get(prefix, ({}, {}))


def _layer_prefix(name: str) -> str | None:
    """The layer a parameter belongs to: "layers.3." for "layers.3.ln1.gamma", "mtp.0.layer."
    for "mtp.0.layer.ln1.gamma"; None for the embedding, head and MTP's own norms."""
    parts = name.split(".", 3)
    if parts[0] == "layers" and len(parts) > 2:
        return f"layers.{parts[1]}."
    if parts[0] == "mtp" and len(parts) > 3 and parts[2] == "layer":
        return f"mtp.{parts[1]}.layer."
    return None


def activation_shape(sc, r) -> tuple:
    """(s_l, b, h) of the activation a stage passes on: s split over CP, and over TP under SP."""
    m, b = sc.model, sc.parallel.micro_batch_size
    s = m.seq_length // sc.parallel.cp // (r.tp.size if r.tp.sequence_parallel else 1)
    return (s, b, m.hidden_size)


def _micro_batch_data(sc, data, r, plan: StagePlan, mb: int):
    """This replica's micro-batch of tokens and targets, (s, b) each (None in meta mode, where
    `data` is None); with context parallelism the rank's s/cp tokens
    (get_batch_on_this_cp_rank)."""
    if data is None:
        return None, None
    start = sample_offset(sc, plan.dp, mb)
    stop = start + sc.parallel.micro_batch_size
    rows = slice(None) if r.cp is None else r.cp.positions
    return data.tokens[rows, start:stop], data.targets[rows, start:stop]


def _local_block(sc, r, full, offset: int):
    """This rank's (s_l, b, h) block of a global (s, B, h) array."""
    b = sc.parallel.micro_batch_size
    block = full[:, offset:offset + b]  # (s, b, h)
    if r.cp is not None:
        block = block[r.cp.positions]  # (s/cp, b, h)
    if r.tp.sequence_parallel:
        block = block.reshape(r.tp.size, -1, *block.shape[1:])[r.tp.index]
    return block


def _word_grad_fold(sc, plan, chunk: int) -> tuple[bool, bool]:
    """(after_other, fold) for the main lookup's table gradient (embedding.word_grad_kernels):
    it meets the gradients that reached the table first on this rank (the tied output layer's
    placeholder, which also sets grad_added_to_main_grad so Megatron's hook adds nothing; MTP's
    lookups at PP 1), and is added into the main gradient unless the tied output layer did or
    torch's FSDP2 reduces the table itself (its reduce-scatter, training/data_parallel/fsdp.py).
    Under Apex's distributed Adam (--bucket-cap-mb) no parameter carries grad_added_to_main_grad
    (Megatron's DDP sets it; NeMo does not), so the tied output layer leaves no placeholder
    (megatron/core/tensor_parallel/layers.py: grad_weight None without the attribute) and Apex's
    hook adds the table into the main gradient whatever reached it (apex distributed_fused_adam.py
    _grad_copy: grad_out.add_(grad_in))."""
    tied_head = sc.model.tied and plan.is_last(chunk)
    mtp_here = bool(sc.model.mtp_num_layers) and plan.is_last(chunk)
    if sc.parallel.bucket_cap_mb is not None:
        return mtp_here, True
    return tied_head or mtp_here, not tied_head and sc.parallel.fsdp != "fsdp2"


def _multi_token_prediction():
    """training/mtp.py, imported only by a model that has multi-token prediction."""
    from simsp.training import mtp
    return mtp


def _standalone_mtp():
    """training/mtp_stage.py, imported only under a layout with Megatron's standalone MTP."""
    from simsp.training import mtp_stage
    return mtp_stage


def forward_step(r, inputs, plan: StagePlan, state: RankState, results, mb: int, chunk: int):
    """Embedding or receive, the chunk's layers, then the loss (into results) or a send
    downstream."""
    sc, data, k = inputs.sc, inputs.data, plan.virtual_stage(chunk)
    tokens, targets = _micro_batch_data(sc, data, r, plan, mb)
    offset = sample_offset(sc, plan.dp, mb)
    scope = f"mb{mb}.c{chunk}."
    r.phase, r.scope = "forward", scope
    stash = {"layers": []}
    if plan.is_first(chunk):
        yield from state.ddp_buckets.params_needed(r, chunk, ["embedding"])
        x, stash["embedding"] = yield from embedding_forward(
            r, sc.model, state.weights, tokens,
            (sc.model.seq_length // sc.parallel.cp, sc.parallel.micro_batch_size), offset)
        if data is not None and data.embedding_delta is not None:
            x.data = x.data + _local_block(sc, r, data.embedding_delta, offset)
    else:
        x = state.inbox.pop(("act", mb, k, plan.tp, plan.dp, plan.cp))
    begin = r.env.now
    x = yield from chunk_forward(r, inputs, plan, state, chunk, x, mb, offset, stash)
    r.scope = scope
    if state.amax is not None:  # the block's fp8_autocast exits (training/fp8_amax.py)
        yield from state.amax.reduce(r, forward=True)
    if plan.mtp_stage is not None:  # Megatron's standalone MTP (training/mtp_stage.py)
        x = yield from _standalone_forward(r, inputs, (plan, chunk, mb), state, x, results,
                                           stash)
    if plan.is_last(chunk) and plan.mtp_stage is not None:
        results.losses[(plan.dp, mb, plan.cp)] = x
    elif plan.is_last(chunk):
        yield from state.ddp_buckets.params_needed(r, chunk, ["head"])
        loss, stash["head"] = yield from head_forward(r, sc.model, state.weights, x, targets)
        results.losses[(plan.dp, mb, plan.cp)] = loss
        if sc.model.mtp_num_layers:  # multi-token prediction (training/mtp.py)
            stash["mtp"] = yield from _multi_token_prediction().mtp_forward(
                r, sc, state, stash["head"]["output_proj_input"], tokens, targets, offset,
                results.mtp_losses, (plan.dp, mb))
    else:
        _pass_on(plan, state, ("act", mb, k + 1, plan.tp, plan.dp, plan.cp), x)
    state.stashes[(mb, chunk)] = stash
    results.record_step(r, "F", mb, chunk, begin)


def _standalone_forward(r, inputs, step: tuple, state: RankState, x, results, stash: dict):
    """Standalone MTP's forward after the chunk's layers: the decoder's final norm, the
    depths (-> their concatenated hidden states), or the loss stage's losses (-> the summed
    LM token loss, MTP's into results)."""
    (plan, chunk, mb), sc, ms = step, inputs.sc, _standalone_mtp()
    tokens, targets = _micro_batch_data(sc, inputs.data, r, plan, mb)
    if plan.is_norm(chunk):
        yield from state.ddp_buckets.params_needed(r, chunk, ["final_norm"])
        x, stash["final_norm"] = yield from ms.final_norm_forward(r, sc.model, state.weights, x)
    if plan.is_mtp(chunk):
        yield from state.ddp_buckets.params_needed(r, chunk, ["mtp"])
        x, stash["mtp"] = yield from ms.depths_forward(r, sc, state, x, tokens,
                                                       sample_offset(sc, plan.dp, mb))
    if plan.is_last(chunk):
        yield from state.ddp_buckets.params_needed(r, chunk, ["head"])
        x, stash["loss"] = yield from ms.loss_forward(r, sc, state, x, targets,
                                                      results.mtp_losses, (plan.dp, mb))
    return x


def _standalone_backward(r, inputs, step: tuple, state: RankState, dx, stash: dict):
    """Standalone MTP's backward before the chunk's layers: the depths, then the final norm."""
    (plan, chunk, mb), sc, ms = step, inputs.sc, _standalone_mtp()
    tokens, _ = _micro_batch_data(sc, inputs.data, r, plan, mb)
    if plan.is_mtp(chunk):
        dx = yield from ms.depths_backward(r, sc, state, stash["mtp"], dx, tokens)
        yield from _grads_ready(r, plan, state, chunk, mb, ["mtp"])
    if plan.is_norm(chunk):
        dx = yield from ms.final_norm_backward(r, sc.model, state, dx, stash["final_norm"])
        yield from _grads_ready(r, plan, state, chunk, mb, ["final_norm"])
    return dx


def backward_step(r, inputs, plan: StagePlan, state: RankState, results, mb: int, chunk: int):
    """The loss gradient or a receive, the chunk's layers backwards, then embedding (its
    output's gradient into results, numeric mode) or a send."""
    sc, k = inputs.sc, plan.virtual_stage(chunk)
    tokens, targets = _micro_batch_data(sc, inputs.data, r, plan, mb)
    stash = state.stashes.pop((mb, chunk))
    scope = f"mb{mb}.c{chunk}."
    r.phase, r.scope = "backward", scope
    if state.split_backward:  # B only: the weight-gradient GEMMs wait for this W step
        r.wgrad = state.deferred[(mb, chunk)] = WeightGradStore()
    if plan.is_last(chunk):
        dx = yield from _loss_backward(r, sc, (plan, chunk, mb), state, stash, tokens, targets)
    else:
        dx = state.inbox.pop(("grad", mb, k, plan.tp, plan.dp, plan.cp))
    begin = r.env.now
    if plan.mtp_stage is not None:
        dx = yield from _standalone_backward(r, inputs, (plan, chunk, mb), state, dx, stash)
    offset = sample_offset(sc, plan.dp, mb)
    dx = yield from delay_wgrad.layers_backward(
        r, sc.parallel, state, (plan, chunk, mb),
        chunk_backward(r, inputs, plan, state, chunk, dx, mb, offset, stash))
    r.scope = scope
    if state.amax is not None:  # the chunk's first FP8 module's backward (training/fp8_amax.py)
        yield from state.amax.reduce(r, forward=False)
    if plan.is_first(chunk):
        yield from delay_wgrad.finish(r, state)  # before the embedding's backward (Megatron)
        if r.numeric:
            results.embedding_grads[(plan.tp, plan.dp, mb, plan.cp)] = dx.data.copy()  # (s_l, b, h)
        if state.fsdp is not None:
            yield from state.fsdp.before_backward(r, chunk, ["embedding"])
        yield from embedding_backward(r, sc.model, state.weights, state.grads, tokens,
                                      stash["embedding"], dx, *_word_grad_fold(sc, plan, chunk))
        yield from _grads_ready(r, plan, state, chunk, mb, ["embedding"])
    else:
        _pass_on(plan, state, ("grad", mb, k - 1, plan.tp, plan.dp, plan.cp), dx)
    r.wgrad = None
    results.record_step(r, "B", mb, chunk, begin)


def _loss_backward(r, sc, where: tuple, state: RankState, stash: dict, tokens, targets):
    """The last chunk's backward from the loss to its input's gradient: the head (with MTP's
    depths where they run there) or, under standalone MTP, the loss stage's split; then the
    head's gradients are ready. `where`: (plan, chunk, micro-batch)."""
    plan, chunk, mb = where
    if state.fsdp is not None:
        yield from state.fsdp.before_backward(r, chunk, ["head"])
    if plan.mtp_stage is not None:
        dx = yield from _standalone_mtp().loss_backward(r, sc, state, stash["loss"], targets)
    else:
        # mean over B·s tokens (the replica's B/d under --ddp-average-in-collective)
        dloss = loss_gradient_factor(sc.parallel) / (sc.model.seq_length * sc.parallel.global_batch)
        extra = None
        if "mtp" in stash:
            extra = yield from _multi_token_prediction().mtp_backward(
                r, sc, state, stash["mtp"], tokens, targets)
        dx = yield from head_backward(r, sc.model, state.weights, state.grads, targets,
                                      stash["head"], dloss, extra)
    yield from _grads_ready(r, plan, state, chunk, mb, ["head"])
    return dx


def weight_step(r, inputs, plan: StagePlan, state: RankState, results, mb: int, chunk: int):
    """W of a split backward: the weight-gradient GEMMs its B deferred, then the chunk's
    gradients are ready for the data-parallel buckets (head, layers last first, embedding)."""
    r.phase, r.scope = "backward", f"mb{mb}.c{chunk}."
    begin = r.env.now
    yield from state.deferred.pop((mb, chunk)).run(r)
    modules = (["head"] if plan.is_last(chunk) else []) + list(plan.layers(chunk))[::-1] \
        + (["embedding"] if plan.is_first(chunk) else [])
    yield from state.ddp_buckets.grads_ready(r, plan, chunk, mb, modules)
    results.record_step(r, "W", mb, chunk, begin)


def _pass_on(plan: StagePlan, state: RankState, key: tuple, tensor) -> None:
    """A step's output for virtual stage key[2]: into the outbox for its rank's p2p send, or
    straight into this rank's inbox at the V's turn (both chunks on this rank, no p2p)."""
    if plan.stage_of(key[2]) == plan.pp:
        state.inbox[key] = tensor
    else:
        state.outbox[key] = (state.p2p.peers[key[2]], tensor)


def _grads_ready(r, plan: StagePlan, state: RankState, chunk: int, mb: int, modules: list):
    """A module's gradients are complete, unless its W step is still to come."""
    if not state.split_backward:
        yield from state.ddp_buckets.grads_ready(r, plan, chunk, mb, modules)
