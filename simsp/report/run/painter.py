"""The report figures drawn on the other core, by processes started before the simulation.

`simsp run` starts the painter first: a worker forked while this process is still small
(multiprocessing's "fork" method) imports matplotlib and loads its fonts while the simulation
runs here, then forks a second worker (the team, below). Once the run ends, this process
sends them what each figure shows (plain numbers and numpy arrays, report/run/figures/),
writes trace.json and measures memory meanwhile, and receives the PNG bytes: each figure from
whichever worker was free first, so two are drawn at once when this process is done. Where fork
is missing (Windows), a second core is not ours, or this is a daemonic process (a Dask worker,
which may not have children), every job runs here when it is submitted; so it does while
another thread runs here (a threaded Dask worker, say). A job is a deterministic function of
its inputs: the same bytes either way.
"""

import gc
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import traceback
from multiprocessing.reduction import ForkingPickler


# ---------------------------------------------------------------------------------------------
# The team: two worker processes
# ---------------------------------------------------------------------------------------------
#
# The painter's side (report/run/painter.py): two worker processes that share the submitted jobs.
#
# The first worker is forked by the parent before the simulation; it loads matplotlib and its
# fonts (the warm-up), then forks the second, which starts warm. Every job goes to both; a byte
# per job in shared memory (Claims) says who runs it: the first worker free to take it, or the
# parent for a `shared` job it asked for first. So the figures are drawn two at a time when the
# parent's own work is done, and one at a time while it is not (the operating system shares the
# two cores between the three).

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


# ---------------------------------------------------------------------------------------------
# The painter: jobs in, results out
# ---------------------------------------------------------------------------------------------
#
# The report figures drawn on the other core, by processes started before the simulation.
#
# `simsp run` starts the painter first: a worker forked while this process is still small
# (multiprocessing's "fork" method) imports matplotlib and loads its fonts while the simulation
# runs here, then forks a second worker (the team, above). Once the run ends, this process
# sends them what each figure shows (plain numbers and numpy arrays, report/run/figures/),
# writes trace.json and measures memory meanwhile, and receives the PNG bytes: each figure from
# whichever worker was free first, so two are drawn at once when this process is done. Where fork
# is missing (Windows), a second core is not ours, or this is a daemonic process (a Dask worker,
# which may not have children), every job runs here when it is submitted; so it does while
# another thread runs here (a threaded Dask worker, say). A job is a deterministic function of
# its inputs: the same bytes either way.

def cores_available() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a painter process can be forked: fork exists, a second core is ours, this is not
    a daemonic process, and no other thread runs here (a fork copies only the calling thread,
    so a lock another thread holds would stay held in the child)."""
    return ("fork" in multiprocessing.get_all_start_methods() and cores_available() >= 2
            and not multiprocessing.current_process().daemon
            and threading.active_count() == 1)


class Painter:
    """Runs submitted jobs (a module-level function and its arguments) and hands back their
    results by name; here, or in the two forked workers when `forked` (the team, above),
    whichever is free first. A job submitted `shared` runs here instead if its result is asked
    for before a worker has begun it (this process has run out of its own work first)."""

    def __init__(self, forked: bool = False, warm_up=None):
        self.submitted: list[str] = []
        self._results: dict[str, tuple[bool, object]] = {}
        self._slots: dict[str, int] = {}  # name -> claim slot of a job sent to the workers
        self._shared: dict[str, tuple[object, tuple]] = {}  # name -> (job, args)
        self._links: dict[int, tuple] = {}  # worker -> (jobs_out, results_in), while it lives
        self._child = self._claims = None
        if forked:
            self._fork(warm_up)

    def _fork(self, warm_up) -> None:
        """Start the first worker (it forks the second) with a pipe for jobs and one for
        results per worker, and the jobs' claims."""
        context = multiprocessing.get_context("fork")
        pipes = [(context.Pipe(duplex=False), context.Pipe(duplex=False)) for _ in WORKERS]
        theirs = [(jobs_in, results_out) for (jobs_in, _), (_, results_out) in pipes]
        ours = [(jobs_out, results_in) for (_, jobs_out), (results_in, _) in pipes]
        claims = Claims(context)
        self._child = context.Process(target=serve_team, daemon=True,
                                      args=(theirs, [e for pair in ours for e in pair],
                                            warm_up, claims))
        self._child.start()
        for pair in theirs:
            for end in pair:
                end.close()
        self._links, self._claims = dict(zip(WORKERS, ours)), claims

    def submit(self, name: str, job, *args, shared: bool = False) -> None:
        """Start `job(*args)` (in a worker, or now); its result is `result(name)`."""
        self.submitted.append(name)
        if self._child is None or len(self._slots) == MAX_JOBS:
            self._results[name] = _attempt_here(job, args)
            return
        slot = self._slots[name] = len(self._slots)
        if shared:
            self._shared[name] = (job, args)
        message = ForkingPickler.dumps((name, job, args, slot))  # pickled once, sent to each
        for worker, (jobs_out, _) in list(self._links.items()):
            try:
                jobs_out.send_bytes(message)
            except (BrokenPipeError, OSError):  # that worker has gone (or never started)
                self._drop(worker)

    def result(self, name: str):
        """The job's return value; its exception is raised here (a worker's as RuntimeError
        with its traceback)."""
        if name in self._shared and name not in self._results \
                and self._claims.claim(self._slots[name], HERE):  # not begun there: run it here
            self._results[name] = _attempt_here(*self._shared[name])
        while name not in self._results:
            self._receive(name)
        ok, value = self._results.pop(name)
        if ok:
            return value
        if isinstance(value, BaseException):
            raise value
        raise RuntimeError(f"report figures in the painter process failed:\n{value}")

    def _receive(self, name: str) -> None:
        """Finished jobs from whichever worker has some; an error if the one running `name`
        (or every one) died without sending it."""
        by_end = {results_in: worker for worker, (_, results_in) in self._links.items()}
        for end in multiprocessing.connection.wait(list(by_end)) if by_end else ():
            try:
                got, ok, value = end.recv()
            except EOFError:
                self._drop(by_end[end])
                continue
            self._results[got] = (ok, value)
        owner = self._claims.owner(self._slots[name])
        if name not in self._results and (owner in WORKERS and owner not in self._links
                                          or not self._links):
            raise RuntimeError(f"the painter process exited{self._exit_code(owner)} without "
                               "its figures")

    def _exit_code(self, worker: int) -> str:
        """" with code N" when the first worker (this process's child) has exited, else ""."""
        if worker != FIRST:
            return ""
        self._child.join()
        return f" with code {self._child.exitcode}"

    def _drop(self, worker: int) -> None:
        """Forget a worker that has gone."""
        for end in self._links.pop(worker):
            end.close()

    def close(self) -> None:
        """Let the workers finish and reap them (at once when something failed here)."""
        if self._child is None:
            return
        for worker, (jobs_out, _) in list(self._links.items()):
            try:
                jobs_out.send(None)
            except (BrokenPipeError, OSError):
                pass  # it has gone already
            self._drop(worker)
        self._child.join(timeout=10)
        if self._child.exitcode is None:
            self._child.kill()
            self._child.join()
        self._child = None

    def __enter__(self) -> "Painter":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None and self._child is not None:
            self._child.kill()  # this process is failing: its figures are not wanted
        self.close()


def start_painter(wanted: bool = True, warm_up=None) -> Painter:
    """A painter in its own process where one can be forked and figures are `wanted`, else one
    that runs jobs here (also when the system refuses the pipes or the fork: out of processes
    or file descriptors). `warm_up`: run first in the child (imports, fonts)."""
    if wanted and can_fork():
        try:
            return Painter(forked=True, warm_up=warm_up)
        except OSError:
            pass  # no second process to be had: the jobs run here, to the same bytes
    return Painter()


def _attempt_here(job, args: tuple) -> tuple[bool, object]:
    """(True, job(*args)) or (False, the exception)."""
    try:
        return True, job(*args)
    except Exception as exc:  # handed to whoever asks for the result
        return False, exc
