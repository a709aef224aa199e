"""Megatron-LM's sequence of compute steps and point-to-point calls on one pipeline stage.

Source: megatron/core/pipeline_parallel/schedules.py. Non-interleaved 1F1B (and GPipe, which is
1F1B with every forward a warm-up) calls `recv_forward`, `send_forward` around each warm-up
forward, `send_forward_recv_backward` / `send_backward_recv_forward` between the steady-state
steps, and `recv_backward`, `send_backward` around each cool-down backward. The interleaved
schedule makes one combined call after every compute phase (a warm-up forward, a steady-state
forward+backward pair, a cool-down backward) that sends the phase's outputs and receives the
next phase's inputs (`send_forward_recv_forward`, `send_forward_backward_recv_forward_backward`,
`send_backward_recv_backward`); when every step is warm-up the first backward's input is
received on its own (`recv_backward`).
"""

from dataclasses import dataclass
import functools

from simsp.training.pipeline.schedule_step import BACKWARD, FORWARD, Step


@dataclass(frozen=True)
class Exchange:
    """One `_communicate` call: sends the outputs of `sends`, receives the inputs of `recvs`.

    The executor drops the steps that have no peer (first/last virtual stage)."""

    sends: tuple[Step, ...] = ()
    recvs: tuple[Step, ...] = ()


def megatron_program(steps: list[Step], schedule: str, warmup: int,
                     overlap: bool = False) -> list:
    """Steps interleaved with Exchanges, in the order Megatron issues them."""
    if overlap:
        return _overlapped(steps, warmup)
    if schedule == "interleaved":
        phases = _interleaved_phases(steps, warmup)
        joined = [not (warmup == len(steps) // 2 and i == warmup - 1)
                  for i in range(len(phases) - 1)]
    else:
        phases = [[step] for step in steps]
        steady = range(warmup, len(steps) - warmup)
        joined = [i in steady and i + 1 in steady for i in range(len(phases) - 1)]
    return _with_exchanges(phases, joined)


def _interleaved_phases(steps: list[Step], warmup: int) -> list[list[Step]]:
    """Warm-up forwards alone, steady-state (forward, backward) pairs, cool-down backwards."""
    total = len(steps) // 2
    pairs = total - warmup
    phases = [[s] for s in steps[:warmup]]
    phases += [steps[warmup + 2 * i:warmup + 2 * i + 2] for i in range(pairs)]
    phases += [[s] for s in steps[warmup + 2 * pairs:]]
    return phases


def _with_exchanges(phases: list[list[Step]], joined: list[bool]) -> list:
    """Receive the first phase's inputs, then after each phase one call, or a send then a recv."""
    program = [Exchange(recvs=tuple(phases[0]))] if phases else []
    for i, phase in enumerate(phases):
        program += phase
        if i + 1 == len(phases):
            program.append(Exchange(sends=tuple(phase)))
        elif joined[i]:
            program.append(Exchange(tuple(phase), tuple(phases[i + 1])))
        else:
            program += [Exchange(sends=tuple(phase)), Exchange(recvs=tuple(phases[i + 1]))]
    return program


def _overlapped(steps: list[Step], warmup: int) -> list:
    """Interleaved with --overlap-p2p-communication: after each step, send its output and post
    the receive of the next step of its kind (send_forward_recv_forward or
    send_backward_recv_backward); the last warm-up step also posts the first backward's."""
    program = [Exchange(recvs=steps[:1])]
    for j, step in enumerate(steps):
        later = [s for s in steps[j + 1:] if s.kind == step.kind][:1]
        program += [step, Exchange((step,), tuple(later))]
        if j == warmup - 1 and warmup < len(steps):
            program.append(Exchange(recvs=tuple(s for s in steps if s.kind == BACKWARD)[:1]))
    return program


def split_backward_program(steps: list[Step]) -> list:
    """A zero-bubble schedule's calls, all non-blocking (its order is not 1F1B's, and blocking
    calls in an arbitrary order can deadlock): after each F or B, send its output and post the
    receive of the next step of its kind; the first B's receive is posted after the last F
    before it. W steps send and receive nothing."""
    program = [Exchange(recvs=steps[:1])]
    first_backward = next((j for j, s in enumerate(steps) if s.kind == BACKWARD), len(steps))
    last_warmup = max((j for j in range(first_backward) if steps[j].kind == FORWARD), default=-1)
    for j, step in enumerate(steps):
        program.append(step)
        if step.kind not in (FORWARD, BACKWARD):
            continue
        later = [s for s in steps[j + 1:] if s.kind == step.kind][:1]
        program.append(Exchange((step,), tuple(later)))
        if j == last_warmup and first_backward < len(steps):
            program.append(Exchange(recvs=(steps[first_backward],)))
    return program


def call_name(sends: list[Step], recvs: list[Step]) -> str:
    """Megatron's name for a call, e.g. send_forward_recv_backward."""
    return call_name_of_kinds(frozenset(s.kind for s in sends),
                              frozenset(s.kind for s in recvs))


@functools.cache
def call_name_of_kinds(send_kinds: frozenset, recv_kinds: frozenset) -> str:
    """call_name from the step kinds ("F", "B") sent and received (worked out once each)."""
    def part(verb, kinds_present):
        kinds = [name for kind, name in ((FORWARD, "forward"), (BACKWARD, "backward"))
                 if kind in kinds_present]
        return f"{verb}_{'_'.join(kinds)}" if kinds else ""
    return "_".join(p for p in (part("send", send_kinds), part("recv", recv_kinds)) if p) or "none"
