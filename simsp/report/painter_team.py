"""The painter's side (report/painter.py): two worker processes that share the submitted jobs.

The first worker is forked by the parent before the simulation; it loads matplotlib and its
fonts (the warm-up), then forks the second, which starts warm. Every job goes to both; a byte
per job in shared memory (Claims) says who runs it: the first worker free to take it, or the
parent for a `shared` job it asked for first. So the figures are drawn two at a time when the
parent's own work is done, and one at a time while it is not (the operating system shares the
two cores between the three).
"""

import gc
import os
import queue
import signal
import threading
import traceback

MAX_JOBS = 64  # jobs per painter with a claim; later ones run in the parent
HERE, FIRST, SECOND = 1, 2, 3  # who runs a job: the parent, or a worker
WORKERS = (FIRST, SECOND)


class Claims:
    """Who runs each job: a byte per job slot in memory all the processes see, set once under a
    lock (0: nobody yet)."""

    def __init__(self, context):
        self._owners = context.RawArray("b", MAX_JOBS)
        self._lock = context.Lock()

    def claim(self, slot: int, who: int) -> bool:
        """Take slot `slot` for `who` unless it is taken; whether `who` has it."""
        with self._lock:
            if not self._owners[slot]:
                self._owners[slot] = who
            return self._owners[slot] == who

    def owner(self, slot: int) -> int:
        """Who took slot `slot` (0: nobody yet)."""
        with self._lock:
            return self._owners[slot]


def serve_team(ends: list, parent_ends: list, warm_up, claims: Claims) -> None:
    """The first worker: warm up, fork the second, serve; then wait for the second to end.
    `ends`: each worker's (jobs_in, results_out); `parent_ends`: the parent's, closed here
    first so its exit is seen. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()  # what the parent made stays out of collections: no copy-on-write of its pages
    for end in parent_ends:
        end.close()
    if warm_up is not None:
        _attempt(warm_up)  # only a head start: a real failure shows in the jobs
    second = _fork_second(ends, claims)
    _serve(ends, FIRST, claims)
    if second is not None:
        os.waitpid(second, 0)


def _fork_second(ends: list, claims: Claims) -> int | None:
    """Fork the second worker (single-threaded here: nothing held is copied); its pid, or None
    when the system refuses (the first then serves alone: the parent sees the pipe close)."""
    try:
        pid = os.fork()
    except OSError:
        for end in ends[1]:
            end.close()
        return None
    if pid == 0:  # the second worker: serve, then leave without unwinding the first's stack
        try:
            _serve(ends, SECOND, claims)
        finally:
            os._exit(0)
    return pid


def _serve(ends: list, me: int, claims: Claims) -> None:
    """Run each job this worker claims and hand (name, ok, result or traceback) back, until
    told to stop or the parent has gone. Threads move jobs in and results out meanwhile, so no
    side blocks on a full pipe while the other is busy."""
    for worker, (jobs_in, results_out) in zip(WORKERS, ends):
        if worker != me:
            jobs_in.close()
            results_out.close()
    jobs_in, results_out = ends[WORKERS.index(me)]
    inbox, outbox = queue.SimpleQueue(), queue.SimpleQueue()
    threading.Thread(target=_read_jobs, args=(jobs_in, inbox), daemon=True).start()
    sender = threading.Thread(target=_send_results, args=(outbox, results_out), daemon=True)
    sender.start()
    while (message := inbox.get()) is not None:
        name, job, args, slot = message
        if claims.claim(slot, me):  # else another worker or the parent runs it
            outbox.put((name, *_attempt(job, *args)))
    outbox.put(None)
    sender.join()


def _attempt(job, *args) -> tuple[bool, object]:
    """(True, job(*args)) or (False, the traceback's text)."""
    try:
        return True, job(*args)
    except Exception:
        return False, traceback.format_exc()


def _send_results(outbox: queue.SimpleQueue, results_out) -> None:
    """Send each result from `outbox` to the parent until None; stop if the parent has gone."""
    try:
        while (result := outbox.get()) is not None:
            results_out.send(result)
    except (BrokenPipeError, OSError):
        pass  # the parent has gone: nothing left to draw for
    finally:
        results_out.close()


def _read_jobs(jobs_in, inbox: queue.SimpleQueue) -> None:
    """Move every job from the pipe to `inbox`, then None (stop, or the parent has gone)."""
    try:
        while (message := jobs_in.recv()) is not None:
            inbox.put(message)
    except (EOFError, OSError):
        pass
    inbox.put(None)
