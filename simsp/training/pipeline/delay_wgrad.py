"""Megatron-Core's --delay-wgrad-compute under the combined 1F1B step
(--overlap-moe-expert-parallel-comm): a backward's weight-gradient GEMMs of its transformer
layers are deferred past their input gradients and run as separate pieces, each beside the
backward's next expert all-to-all (model/blocks/moe/comm_stream.py); what they read stays in the
ledger until they run (model/base/wgrad_store.py).

NVIDIA/Megatron-LM commit d98e8a6:
- megatron/core/models/common/model_chunk_schedule_plan.py `TransformerLayerSchedulePlan.run`:
  `b_layer.mlp.backward_dw()` (the experts', or a dense layer's MLP) is issued after the
  experts' input gradients and just before `moe_dispatch.backward`; a layer's
  `pre_dispatch_computation.backward_dw()` (attention's linear_qkv and linear_proj, the shared
  experts: megatron/core/models/common/utils.py `_BackwardDWWrapper`) after its input
  gradients, except the chunk's last backward layer (`is_last_layer_in_bwd`), whose attention
  weight gradients `TransformerModelChunkSchedulePlan.run` runs after `post_backward` (the
  p2p send of the input gradient) and before the embedding's backward;
- megatron/core/models/gpt/fine_grained_callables.py `build_transformer_layer_callables`:
  backward_dw = {"pre_dispatch_computation": the layer's wrapper, "mlp": layer.mlp};
- a parameter's gradient is complete, and its DDP bucket may launch, once its weight gradient
  has run (megatron/core/pipeline_parallel/utils.py `TransformerLayerNode.backward_dw` calls the
  post-wgrad gradient-accumulation hooks).

Here a backward's deferred GEMMs run at its next all-to-all (the dispatch's backward for the
experts' own, the next layer's combine backward for a layer's attention), after a layer
without expert all-to-alls (dense MLP) at its end, and the chunk's last ones after the step's
p2p call (the embedding's backward first on the first virtual stage). Head, embedding and MTP
weight gradients are not deferred (they are not in the layers' backward_dw).
"""

from simsp.model.base.wgrad_store import WeightGradStore


class DelayedWgrad:
    """One backward step's delayed weight gradients, and the layers whose gradients are
    complete once those waiting now have run."""

    def __init__(self, owner, buckets, plan, chunk: int, mb: int):
        """Nothing deferred yet; `owner`: the simpy process running the backward step;
        `buckets`: the rank's DDP buckets or FSDP units (grads_ready)."""
        self.owner = owner
        self.store = WeightGradStore()
        self.buckets, self.plan, self.chunk, self.mb = buckets, plan, chunk, mb
        self.complete = []  # layer lists whose gradients are complete after the next run

    def waiting(self) -> bool:
        """Whether weight-gradient GEMMs wait to run."""
        return bool(self.store.work)

    def layers_done(self, layers: list) -> None:
        """Layers whose backward ended: their gradients are complete after the next run."""
        self.complete.append(layers)

    def run(self, r):
        """The waiting GEMMs in the order the backward met them, their held inputs freed; then
        the completed layers' gradients to the data-parallel buckets."""
        yield from self.store.run(r)
        complete, self.complete = self.complete, []
        for layers in complete:
            yield from self.buckets.grads_ready(r, self.plan, self.chunk, self.mb, layers)


def layers_backward(r, parallel, state, step: tuple, backward):
    """Run `backward` (a generator: the chunk's layers backwards) with their weight gradients
    delayed under --delay-wgrad-compute (the rank's deferral store r.wgrad, known to its paired
    streams), else as it is; `step`: (plan, chunk, micro-batch). Returns its value."""
    if not parallel.delay_wgrad_compute:
        return (yield from backward)
    plan, chunk, mb = step
    delayed = state.delayed = DelayedWgrad(r.env.active_process, state.ddp_buckets, plan,
                                           chunk, mb)
    r.wgrad, r.ep_streams.delayed = delayed.store, delayed
    dx = yield from backward
    r.wgrad = None  # the head's and embedding's weight gradients are not delayed
    return dx


def after_layers(r, state, layers: list, with_all_to_all: bool, last: bool):
    """A segment's backward ended: its layers complete at the next run; a segment without
    expert all-to-alls runs them now, unless it is the chunk's last in the backward."""
    if state.delayed is None:
        return
    state.delayed.layers_done(layers)
    if not with_all_to_all and not last:
        yield from state.delayed.run(r)


def finish(r, state):
    """Run what is still deferred (the chunk's last attention weight gradients) and end the
    step's deferral."""
    delayed, state.delayed = state.delayed, None
    if delayed is None:
        return
    if r.ep_streams.delayed is delayed:
        r.ep_streams.delayed = None
    yield from delayed.run(r)
