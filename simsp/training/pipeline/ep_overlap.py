"""One MoE layer's forward of one micro-batch overlapped with the backward of another, on a
compute and a communication stream, as Megatron-Core runs its EP all-to-all overlap.

NVIDIA/Megatron-LM (commit d98e8a6) megatron/core/models/common/model_chunk_schedule_plan.py
`TransformerLayerSchedulePlan.run` splits a layer into pre_dispatch (attention, layernorm,
router, dispatch preprocess; compute), dispatch (all-to-all; communication), mlp (the experts;
compute) and combine (all-to-all; communication), and issues one forward layer f and one backward
layer b in the order of `ISSUE`, which gives the streams

    comm:    combine_bwd      | dispatch_fwd -> dispatch_bwd   | combine_fwd
    compute: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd (-> _dw)

Each node waits for and records its micro-batch's CUDA event (megatron/core/pipeline_parallel/
utils.py `ScheduleNode.stream_acquire_context`), so a micro-batch's pieces run in order while
the two micro-batches' pieces share the streams in issue order; a stream waiting on an event
holds the work queued behind it (CUDA stream semantics). With --delay-wgrad-compute the weight
gradients are nodes of their own (megatron/core/models/common/utils.py `backward_dw`: on the
compute stream, no event), so dispatch_bwd starts once mlp_bwd's input gradients exist; without
it they are part of mlp_bwd and pre_dispatch_bwd. The last layer of a backward keeps its
pre_dispatch weight gradients for later (`is_last_layer_in_bwd`). Communication kernels hold
SMs while they run (engine/sm_share.py) when an `SmShare` is given. These timelines take each
piece's duration up front: the hand-worked reference that the event-by-event combined 1F1B step
(model/blocks/moe/comm_stream.py) is tested against, and the time of a DualPipe F&B pair
(`dualpipe_pair_seconds`), which the DualPipe run executes event by event with the same streams
(comm_stream.py `beside_weights`; docs/dualpipe.md).
"""

from dataclasses import dataclass

import simpy

from simsp.engine.sm_share import SmShare

COMM_PIECES = frozenset(("dispatch", "combine", "pp"))  # "pp": a DualPipe pair's p2p sends
# (micro-batch, piece) in Megatron's issue order; *_dw only with --delay-wgrad-compute
ISSUE = (("b", "combine"), ("f", "pre_dispatch"), ("b", "mlp"), ("f", "dispatch"),
         ("b", "mlp_dw"), ("b", "dispatch"), ("f", "mlp"), ("f", "combine"),
         ("b", "pre_dispatch"), ("b", "pre_dispatch_dw"))


@dataclass(frozen=True)
class LayerPieces:
    """One layer's pieces in seconds at full rate (a backward's *_dw: its weight gradients)."""

    pre_dispatch: float
    dispatch: float
    mlp: float
    combine: float
    mlp_dw: float = 0.0
    pre_dispatch_dw: float = 0.0


@dataclass(frozen=True)
class PairTimeline:
    """What one layer pair ran: spans (micro-batch, piece, stream, start s, end s), its end, and
    its communication seconds hidden behind compute and left exposed."""

    spans: tuple
    end_s: float
    comm_hidden_s: float
    comm_exposed_s: float


def pair_seconds(f: LayerPieces | None, b: LayerPieces | None, delay_wgrad: bool,
                 last_in_backward: bool = False, order: tuple = ISSUE) -> list:
    """[(micro-batch, piece, seconds)] in issue `order` (Megatron's by default; a DualPipe F&B
    pair passes its own): without delayed weight gradients each backward node carries its own;
    the last backward layer keeps pre_dispatch's for later."""
    layers = {"f": f, "b": b}
    issued = []
    for who, piece in order:
        layer = layers[who]
        if layer is None:
            continue
        seconds = getattr(layer, piece)
        if who == "b" and not delay_wgrad and piece in ("mlp", "pre_dispatch"):
            seconds += getattr(layer, piece + "_dw")
        if piece.endswith("_dw") and (not delay_wgrad or
                                      (piece == "pre_dispatch_dw" and last_in_backward)):
            continue
        issued.append((who, piece, seconds))
    return issued


def run_pair(env: simpy.Environment, rank: int, issued: list, sm: SmShare | None = None,
             comm_sms: int = 0):
    """Run the issued pieces on `rank`'s two streams from now (use with `yield from`); returns
    the spans, in issue order."""
    streams = {"compute": simpy.Resource(env, 1), "comm": simpy.Resource(env, 1)}
    recorded = {"f": None, "b": None}  # micro-batch -> its event's last recorded node
    spans, done = [None] * len(issued), []
    for i, (who, piece, seconds) in enumerate(issued):
        waits = None if piece.endswith("_dw") else recorded[who]
        proc = env.process(_piece(env, rank, streams, (who, piece, seconds), waits, sm,
                                  comm_sms, spans, i))
        if not piece.endswith("_dw"):
            recorded[who] = proc
        done.append(proc)
    yield env.all_of(done)
    return spans


def _piece(env, rank, streams, issued, waits, sm, comm_sms, spans, i):
    """One node: queued on its stream in issue order, then its event's wait, then its kernel."""
    who, piece, seconds = issued
    stream = "comm" if piece in COMM_PIECES else "compute"
    with streams[stream].request() as slot:
        yield slot
        if waits is not None:
            yield waits
        start = env.now
        if stream == "comm" and sm is not None:
            sm.take(rank, comm_sms)
            yield env.timeout(seconds)
            sm.give_back(rank, comm_sms)
        elif sm is not None:
            yield from sm.run(rank, seconds)
        else:
            yield env.timeout(seconds)
        spans[i] = (who, piece, stream, start, env.now)


def pair_timeline(f: LayerPieces | None, b: LayerPieces | None, delay_wgrad: bool,
                  sm_count: int | None = None, comm_sms: int = 0,
                  last_in_backward: bool = False) -> PairTimeline:
    """One layer pair alone on a GPU from time 0 (SM contention when `sm_count` is given)."""
    return issued_timeline(pair_seconds(f, b, delay_wgrad, last_in_backward), sm_count,
                           comm_sms)


def issued_timeline(issued: list, sm_count: int | None = None,
                    comm_sms: int = 0) -> PairTimeline:
    """Issued pieces [(micro-batch, piece, seconds)] alone on a GPU from time 0."""
    env = simpy.Environment()
    sm = SmShare(env, sm_count) if sm_count else None
    proc = env.process(run_pair(env, 0, issued, sm, comm_sms))
    env.run()
    spans = tuple(proc.value)
    hidden, exposed = comm_exposure(spans)
    return PairTimeline(spans, max((s[4] for s in spans), default=0.0), hidden, exposed)


def comm_exposure(spans) -> tuple[float, float]:
    """(seconds of communication under some compute, seconds under none)."""
    busy = [(s[3], s[4]) for s in spans if s[2] == "compute"]
    hidden = exposed = 0.0
    for _, _, stream, start, end in spans:
        if stream != "comm":
            continue
        under = sum(max(0.0, min(end, b_end) - max(start, b_start)) for b_start, b_end in busy)
        hidden += under
        exposed += (end - start) - under
    return hidden, exposed


def dualpipe_pair_seconds(f_layers: list, b_layers: list, pp_f: float = 0.0,
                          pp_b: float = 0.0) -> list:
    """A DualPipe F&B pair of two chunks (DeepSeek-V3 report, arXiv:2412.19437 §3.2.1 and
    Figure 4): forward layer i issued with the backward's i-th layer (b_layers in the order the
    backward runs them, last layer first) in `ISSUE` order, whose streams are Figure 4's
    (compute ATTN(F), MLP(B), MLP(W), MLP(F), ATTN(B), ATTN(W); communication COMBINE(B),
    DISPATCH(F), DISPATCH(B), COMBINE(F)); the pair's backward is full, so every layer's W
    pieces run inside it; then the two PP sends on the communication stream (Figure 4's "PP"):
    the forward's output, the backward's input gradient. A chunk with fewer layers leaves the
    other's pieces alone."""
    issued = []
    for i in range(max(len(f_layers), len(b_layers))):
        issued += pair_seconds(f_layers[i] if i < len(f_layers) else None,
                               b_layers[i] if i < len(b_layers) else None, delay_wgrad=True)
    return issued + [(who, "pp", seconds) for who, seconds in (("f", pp_f), ("b", pp_b))
                     if seconds > 0]
