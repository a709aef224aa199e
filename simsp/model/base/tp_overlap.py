"""Transformer Engine's TP communication overlap (userbuffers) on an emulated rank, the methods as
they run (docs/tp-overlap.md; NVIDIA/TransformerEngine transformer_engine/common/
comm_gemm_overlap/comm_gemm_overlap.cpp CommOverlapP2PBase::split_overlap_ag and
split_overlap_rs, CommOverlapBase::split_overlap_rs and bulk_overlap):

- ring exchange AG+GEMM: the t sequence chunks pass round the TP ring in t − 1 neighbour
  sends (each rank to the next), back to back; the GEMM runs in t row chunks, chunk i on the
  chunk received at step i − 1, so each step hides behind a GEMM chunk of 1/t (`aggregate`:
  a pair swap, then two chunks a step, the GEMM in t/2 chunks);
- ring exchange GEMM+RS: the GEMM runs in t row chunks, each chunk's output sent straight to
  the rank owning those rows while the next computes, then a reduce kernel sums the t chunks;
- pipelined GEMM+RS: the GEMM runs in num_splits column chunks; chunk i's reduce-scatter runs
  while chunk i + 1 computes;
- bulk: a whole GEMM beside a whole collective of the other direction (the dgrad GEMM beside
  the all-gather of the input the wgrad needs, the wgrad GEMM beside the dgrad's reduce-scatter).

Each is a GEMM `runner` for base/ops.py: the math is the unsplit op's (so the numbers are the
unsplit run's), only its time is split. The GEMM keeps (SMs − num_sm)/SMs of its rate for its
whole run under TE's set_sm_margin, else the communication kernels hold their SMs while they run
and the GEMM is re-timed around them (engine/sm_share.py). Communication runs over the links
through the TP communicator.
"""

import numpy as np

from simsp.model.base.ops import gemm_seconds
from simsp.model.tensor import FP16

RS_P2P = "ring_exchange_rs"  # the report's name for a ring-exchange GEMM+RS (AG: ring_exchange)


def ub_of(r, gemm: str):
    """The overlap of TE GEMM `gemm` (scenario/tp_overlap.py UbGemm), None when it is off."""
    return None if r.tp.overlap is None else r.tp.overlap[gemm]


def record(r, method: str, comm_s: float, exposed_s: float) -> None:
    """Count `comm_s` of `method`'s communication, `exposed_s` of it not hidden."""
    seen = r.tp_overlap_s
    seen[(method, "comm")] = seen.get((method, "comm"), 0.0) + comm_s
    seen[(method, "exposed")] = seen.get((method, "exposed"), 0.0) + exposed_s
    r.count_exposed("tp_comm", exposed_s)


def comm_sms(ub) -> int:
    """SMs `ub`'s communication kernels take from the GEMM beside them while they run: none
    under set_sm_margin (the GEMM was launched on the others, `chunk_gemm`)."""
    return 0 if ub.set_sm_margin else ub.comm_sms


def chunk_gemm(r, name: str, shape: tuple, in_fp8: bool, ub, pieces: int = 1,
               wgrad: bool = False):
    """One of `pieces` equal pieces of the GEMM of `shape` (m, k, n): under set_sm_margin on
    sm_count − num_sm SMs throughout, else on all SMs, re-timed while communication kernels hold
    some (engine/sm_share.py). A piece takes 1/pieces of the whole GEMM's time: TE launches the
    pieces round-robin on NVTE_COMM_OVERLAP_MAX_STREAMS = 3 compute streams
    (transformer_engine/common/include/transformer_engine/comm_gemm_overlap.h), so one piece's
    last partial wave of tiles fills with the next piece's (docs/tp-overlap.md)."""
    m, k, n = shape
    work_s = gemm_seconds(r, shape, in_fp8, wgrad) / pieces
    if ub.set_sm_margin:
        work_s /= r.sm_share.margin_rate(ub.num_sm)
    yield from r.hold(name, "gemm", 2 * m * k * n // pieces, work_s)


def _send_to(r, ub, peer: int, data, nbytes: int, tag: str):
    """One exchange of the TP group: this rank sends `nbytes` (`data`, numeric) to TP rank
    `peer`; what each rank sent this one, by TP index (None in meta)."""
    t = r.tp.size
    send = [nbytes if j == peer else 0 for j in range(t)]
    chunks = None if not r.numeric else [data if j == peer else None for j in range(t)]
    return (yield from r.tp.comm.all_to_all(r.tp.members, r.rank, chunks, send, tag,
                                            sms=comm_sms(ub)))


def _ring_steps(r, ub, local, gathered, tag: str, arrived: list):
    """The t − 1 neighbour sends of a ring exchange (each to the next TP rank), back to back;
    `arrived[i]` fires when step i's chunk is in; numeric: `gathered` gets the chunks in order."""
    t, me = r.tp.size, r.tp.index
    chunks = {me: local.data}  # TP index -> (s/t, ...) chunk
    held = local.data
    for step in range(t - 1):
        received = yield from _send_to(r, ub, (me + 1) % t, held, local.nbytes,
                                       f"{tag} ring {step}")
        held = None if received is None else received[(me - 1) % t]
        chunks[(me - 1 - step) % t] = held
        arrived[step].succeed(r.env.now)
    if r.numeric:
        gathered.data = np.concatenate([chunks[j] for j in range(t)], axis=0)  # (s, ...)


def _paired_steps(r, ub, local, gathered, tag: str, arrived: list):
    """TE's `aggregate` ring exchange (split_overlap_ag with _aggregate): the rank swaps its
    chunk with its pair partner (even with the next rank, odd with the one before), then passes
    its pair's two chunks round the ring of pairs (to rank me + 2, from me − 2) in t/2 − 1
    steps, back to back; `arrived[0]` fires with the partner's chunk, `arrived[i]` with step
    i's pair; numeric: `gathered` gets the chunks in order."""
    t, me = r.tp.size, r.tp.index
    partner, base = me + 1 - 2 * (me % 2), me - me % 2
    received = yield from _send_to(r, ub, partner, local.data, local.nbytes, f"{tag} pair")
    chunks = {me: local.data, partner: None if received is None else received[partner]}
    arrived[0].succeed(r.env.now)
    for step in range(1, t // 2):
        sent = (base - 2 * step + 2) % t
        pair = None if not r.numeric else np.concatenate([chunks[sent], chunks[sent + 1]])
        received = yield from _send_to(r, ub, (me + 2) % t, pair, 2 * local.nbytes,
                                       f"{tag} ring {step}")  # pair: (2 s/t, ...)
        got = (base - 2 * step) % t
        if r.numeric:
            chunks[got], chunks[got + 1] = np.split(received[(me - 2) % t], 2)
        arrived[step].succeed(r.env.now)
    if r.numeric:
        gathered.data = np.concatenate([chunks[j] for j in range(t)], axis=0)  # (s, ...)


def ring_exchange(ub, local, gathered, tag: str, label: str = "all_gather"):
    """A runner: `local` (s/t, ...) all-gathered into `gathered` (s, ...) by ring exchange
    while the GEMM on the gathered rows runs in t row chunks, each after its chunk's step;
    under `aggregate` in t/2 chunks of two, the first after the pair swap."""
    def run(r, name, shape, in_fp8, out, math):
        t = r.tp.size
        r.count_comm(label, (t - 1) * local.nbytes)
        steps = _paired_steps if ub.aggregate else _ring_steps
        arrived = [r.env.event() for _ in range(t // 2 if ub.aggregate else t - 1)]
        waits = arrived if ub.aggregate else [None] + arrived  # per GEMM piece
        start = r.env.now
        r.env.process(steps(r, ub, local, gathered, tag, arrived))
        exposed = 0.0
        for i, ready in enumerate(waits):
            if ready is not None:
                wait = r.env.now
                yield ready
                exposed += r.env.now - wait
            yield from chunk_gemm(r, f"{name}#{i}", shape, in_fp8, ub, len(waits))
        end = arrived[-1].value  # the last step's arrival
        record(r, ub.method, end - start, exposed)
        _span(r, f"ring_exchange {tag}", start, end, local.nbytes * t)
        if r.numeric:
            out.data = math()
    return run


def _span(r, name: str, start: float, end: float, nbytes: int) -> None:
    """The overlapped collective on the rank's tp_comm track."""
    if r.trace is not None:
        r.trace.add_span(r.rank, "tp_comm", name, start, end,
                         {"phase": r.phase, "bytes": nbytes})


def rs_wire_bytes(r, ub, partial) -> int:
    """Bytes per element a pipelined reduce-scatter moves: 1 from an FP8 userbuffer (FP8
    training with the GEMM's fp8_buf: TE 1.8 module/base.py initialize_ub allocates it uint8,
    the GEMM writes FP8 into it, and comm_gemm_overlap.h split_overlap_rs reduces it with
    reducescatter2_userbuff_stridedoutput_fp8, which reads the peers' FP8 chunks and writes the
    BF16 result), else the partial output's 2."""
    return 1 if r.fp8 is not None and ub.fp8_buf else partial.itemsize


def _rs_splits(r, ub, partial, reduced, tag: str, computed: list, busy: list):
    """Reduce-scatter each column chunk of `partial` (s, b, h) over TP once its GEMM piece is
    done (`computed[i]`), one after the other, into `reduced` (s/t, b, h), at rs_wire_bytes per
    element; `busy` sums their seconds."""
    splits = len(computed)
    width = partial.shape[-1] // splits
    wire = rs_wire_bytes(r, ub, partial)
    piece_bytes = partial.numel * wire // splits
    for i, done in enumerate(computed):
        yield done
        start = r.env.now
        cols = slice(i * width, (i + 1) * width)
        buffer = None if not r.numeric else np.ascontiguousarray(
            partial.data[..., cols]).reshape(-1)  # (s · b · h/splits,)
        result = yield from r.tp.comm.reduce_scatter(r.tp.members, r.rank, buffer, piece_bytes,
                                                     f"{tag} split {i}", elem_bytes=wire,
                                                     sms=comm_sms(ub))
        if r.numeric:
            reduced.data[..., cols] = result.reshape(reduced.shape[:-1] + (width,))
        busy.append(r.env.now - start)


def pipelined_rs(ub, reduced, tag: str):
    """A runner: the GEMM's output (s, b, h) partial sums reduce-scattered into `reduced`
    (s/t, b, h) in num_splits column chunks, chunk i's beside GEMM piece i + 1."""
    def run(r, name, shape, in_fp8, out, math):
        m, k, n = shape
        splits, t = ub.num_splits, r.tp.size
        r.count_comm("reduce_scatter", (t - 1) * out.numel * rs_wire_bytes(r, ub, out) // t)
        if r.numeric:
            out.data = math()
            reduced.data = np.empty(reduced.shape, dtype=out.data.dtype)  # (s/t, b, h)
        computed = [r.env.event() for _ in range(splits)]
        busy = []
        start = r.env.now
        comm = r.env.process(_rs_splits(r, ub, out, reduced, tag, computed, busy))
        for i in range(splits):
            yield from chunk_gemm(r, f"{name}#{i}", shape, in_fp8, ub, splits)
            computed[i].succeed()
        wait = r.env.now
        yield comm
        record(r, ub.method, sum(busy), r.env.now - wait)
        _span(r, f"pipelined reduce_scatter {tag}", start, r.env.now, out.nbytes)
    return run


SEND_STREAMS = 3  # NVTE_COMM_OVERLAP_MAX_STREAMS: TE's send streams, one per compute stream


def _rs_p2p_sends(r, ub, partial, tag: str, computed: list, received: list, spans: list):
    """The t − 1 sends of a ring-exchange GEMM+RS (CommOverlapP2PBase::split_overlap_rs): step
    i (1..t − 1) sends GEMM chunk i − 1's output, the rows (s/t, b, h) of TP rank me + i, to that
    rank once the chunk is done, on send stream (i − 1) mod 3 (so after step i − 3); the rank
    receives rank me − i's rows of its own chunk into `received[i − 1]` (numeric). Launched in
    step order, so every rank joins the steps' exchanges in the same order."""
    t, me, rows = r.tp.size, r.tp.index, partial.shape[0] // r.tp.size
    steps = []
    for i in range(1, t):
        yield computed[i - 1]
        if i > SEND_STREAMS:
            yield steps[i - 1 - SEND_STREAMS]
        peer = (me + i) % t
        data = None if not r.numeric else partial.data[peer * rows:(peer + 1) * rows]
        steps.append(r.env.process(_rs_p2p_step(r, ub, data, partial.nbytes // t,
                                                f"{tag} p2p {i}", i, received, spans)))
    yield r.env.all_of(steps)


def _rs_p2p_step(r, ub, data, nbytes: int, tag: str, step: int, received: list, spans: list):
    """One step of `_rs_p2p_sends`: this rank to rank me + step, rank me − step to it; its
    (start, end) appended to `spans`."""
    t, me = r.tp.size, r.tp.index
    start = r.env.now
    got = yield from _send_to(r, ub, (me + step) % t, data, nbytes, tag)  # data: (s/t, b, h)
    spans.append((start, r.env.now))
    if r.numeric:
        received[step - 1] = got[(me - step) % t]


def busy_seconds(spans: list) -> float:
    """The length of the union of (start, end) intervals: time with some send in flight."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _reduce_chunks(r, ub, name: str, partial, reduced, received: list):
    """TE's reduce kernel after the exchange: the rank's own chunk of `partial` (s, b, h) and
    the t − 1 received ones summed in buffer order (own, then from me − 1, me − 2, ...) into
    `reduced` (s/t, b, h); reads t chunks (1 B per element from an FP8 buffer, else 2), writes
    one in BF16 (comm_gemm_overlap.cpp reduce_bf16, reduce_fp8_in_bf16_out)."""
    t, me = r.tp.size, r.tp.index
    rows = partial.shape[0] // t
    if r.numeric:
        total = partial.data[me * rows:(me + 1) * rows].copy()  # (s/t, b, h)
        for chunk in received:
            total = total + chunk
        reduced.data = total.astype(partial.data.dtype)
    elements = partial.numel // t
    read = 1 if r.fp8 is not None and ub.fp8_buf else FP16
    yield from r.compute(f"{name}_ub_reduce", "elementwise", nbytes=elements * (t * read + FP16))


def ring_exchange_rs(ub, reduced, tag: str):
    """A runner: the GEMM in t row chunks, chunk i on the rows of TP rank me + i + 1 (the last
    on the rank's own), each chunk's output sent to its rank while the next computes; then TE's
    reduce kernel sums the t partial chunks into `reduced` (s/t, b, h)
    (CommOverlapP2PBase::split_overlap_rs)."""
    def run(r, name, shape, in_fp8, out, math):
        t = r.tp.size
        r.count_comm("reduce_scatter", (t - 1) * (out.nbytes // t))
        if r.numeric:
            out.data = math()
        computed = [r.env.event() for _ in range(t - 1)]
        received, spans = [None] * (t - 1), []
        start = r.env.now
        sends = r.env.process(_rs_p2p_sends(r, ub, out, tag, computed, received, spans))
        for i in range(t):
            yield from chunk_gemm(r, f"{name}#{i}", shape, in_fp8, ub, t)
            if i < t - 1:
                computed[i].succeed()
        wait = r.env.now
        yield sends
        record(r, RS_P2P, busy_seconds(spans), r.env.now - wait)
        _span(r, f"ring_exchange reduce_scatter {tag}", start, r.env.now, out.nbytes)
        yield from _reduce_chunks(r, ub, name, out, reduced, received)
    return run


def bulk(ub, wgrad: bool = False):
    """A runner: the whole GEMM beside a collective on the communication stream, as TE's bulk
    overlap (the collective launched with `comm_sms(ub)` SMs)."""
    def run(r, name, shape, in_fp8, out, math):
        if r.numeric and math is not None:
            out.data = math()
        yield from chunk_gemm(r, name, shape, in_fp8, ub, wgrad=wgrad)
    return run


def timed(r, body, box: list):
    """Run collective generator `body`, appending its seconds to `box`; return its value."""
    start = r.env.now
    result = yield from body
    box.append(r.env.now - start)
    return result


def finish_bulk(r, ub, process, box: list):
    """Wait for a bulk collective; its wait is exposed, the rest of its time hidden."""
    wait = r.env.now
    result = yield process
    record(r, ub.method, box[0], r.env.now - wait)
    return result
