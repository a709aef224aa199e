"""Two independent pieces of report work at once, on two cores.

The second piece runs in a forked child process (multiprocessing's "fork" start method: the
child sees the finished simulation as it is, nothing is copied or pickled but the piece's
result), the first in this process meanwhile. Where fork is missing (Windows) or this process
may use one core only, the two run one after the other. Each piece is a deterministic function
of the run, so the output is the same bytes either way.
"""

import multiprocessing
import os
import traceback


def cores_available() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether the second piece can run in a forked child: fork exists, a second core is ours,
    and this is not a daemonic process (a Dask worker, say), which may not have children."""
    return ("fork" in multiprocessing.get_all_start_methods() and cores_available() >= 2
            and not multiprocessing.current_process().daemon)


def both(first, second) -> tuple:
    """(first(), second()), the second in a forked child when possible; an exception in either
    is raised here (the child's as a RuntimeError carrying its traceback)."""
    if not can_fork():
        return first(), second()
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_run_child, args=(second, sender), daemon=True)
    child.start()
    sender.close()
    try:
        mine = first()
    finally:
        ok, theirs = _receive(receiver, child)
    if not ok:
        raise RuntimeError(f"report work in the child process failed:\n{theirs}")
    return mine, theirs


def _run_child(work, sender) -> None:
    """In the child: run the piece and send (True, result) or (False, traceback text)."""
    try:
        sender.send((True, work()))
    except BaseException:  # everything goes back to the parent, which raises it
        sender.send((False, traceback.format_exc()))
    finally:
        sender.close()


def _receive(receiver, child) -> tuple:
    """The child's (ok, result); (False, reason) if it died without sending."""
    try:
        return receiver.recv()
    except EOFError:
        child.join()
        return False, f"the child exited with code {child.exitcode} without a result"
    finally:
        receiver.close()
        child.join()
