"""The report figures drawn on a second core, by a process started before the simulation.

`simsp run` starts the painter first: a child forked while this process is still small
(multiprocessing's "fork" method) imports matplotlib and loads its fonts while the simulation
runs here. Once the run ends, this process sends it what each figure shows (plain numbers and
numpy arrays, report/figure_inputs.py), writes trace.json and measures memory meanwhile, and
receives the PNG bytes. Where fork is missing (Windows), a second core is not ours, or this is a
daemonic process (a Dask worker, which may not have children), every job runs here when it is
submitted; so it does while another thread runs here (a threaded Dask worker, say). A job is a
deterministic function of its inputs: the same bytes either way.
"""

import gc
import multiprocessing
import os
import queue
import signal
import threading
import traceback


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


MAX_SHARED = 64  # jobs that either process may run, per painter
PAINTER, HERE = 1, 2  # who claimed a shared job


class Painter:
    """Runs submitted jobs (a module-level function and its arguments) in submission order and
    hands back their results by name; here, or in the forked child when `forked`. A job
    submitted `shared` runs here instead if its result is asked for before the child has begun
    it (this process has run out of its own work first): whichever process is free first."""

    def __init__(self, forked: bool = False, warm_up=None):
        self.submitted: list[str] = []
        self._results: dict[str, tuple[bool, object]] = {}
        self._shared: dict[str, tuple[int, object, tuple]] = {}  # name -> (slot, job, args)
        self._child = self._jobs_out = self._results_in = self._claims = None
        if forked:
            self._fork(warm_up)

    def _fork(self, warm_up) -> None:
        """Start the child with a pipe for jobs, one for results, and the shared jobs' claims."""
        context = multiprocessing.get_context("fork")
        jobs_in, jobs_out = context.Pipe(duplex=False)  # (receiving end, sending end)
        results_in, results_out = context.Pipe(duplex=False)
        claims = _Claims(context)
        ends = (jobs_in, results_out, (jobs_out, results_in), warm_up, claims)
        self._child = context.Process(target=_serve, args=ends, daemon=True)
        self._child.start()
        jobs_in.close()
        results_out.close()
        self._jobs_out, self._results_in, self._claims = jobs_out, results_in, claims

    def submit(self, name: str, job, *args, shared: bool = False) -> None:
        """Start `job(*args)` (in the child, or now); its result is `result(name)`."""
        self.submitted.append(name)
        if self._jobs_out is None:
            self._results[name] = _attempt(job, args)
            return
        slot = len(self._shared) if shared and len(self._shared) < MAX_SHARED else -1
        if slot >= 0:
            self._shared[name] = (slot, job, args)
        self._jobs_out.send((name, job, args, slot))

    def result(self, name: str):
        """The job's return value; its exception is raised here (the child's as RuntimeError
        with its traceback)."""
        if name in self._shared and name not in self._results:
            slot, job, args = self._shared[name]
            if self._claims.claim(slot, HERE):  # not begun there: run it here
                self._results[name] = _attempt(job, args)
        while name not in self._results:
            self._receive()
        ok, value = self._results.pop(name)
        if ok:
            return value
        if isinstance(value, BaseException):
            raise value
        raise RuntimeError(f"report figures in the painter process failed:\n{value}")

    def _receive(self) -> None:
        """One finished job from the child; an error if it died without sending it."""
        try:
            name, ok, value = self._results_in.recv()
        except EOFError:
            self._child.join()
            raise RuntimeError(f"the painter process exited with code {self._child.exitcode} "
                               "without its figures") from None
        self._results[name] = (ok, value)

    def close(self) -> None:
        """Let the child finish and reap it (at once when something failed here)."""
        if self._jobs_out is None:
            return
        jobs_out, self._jobs_out = self._jobs_out, None
        try:
            jobs_out.send(None)
        except (BrokenPipeError, OSError):
            pass  # it has gone already
        jobs_out.close()
        self._results_in.close()
        self._child.join(timeout=10)
        if self._child.exitcode is None:
            self._child.kill()
            self._child.join()

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


def _attempt(job, args: tuple) -> tuple[bool, object]:
    """(True, job(*args)) or (False, the exception)."""
    try:
        return True, job(*args)
    except Exception as exc:  # handed to whoever asks for the result
        return False, exc


class _Claims:
    """Who runs each shared job: a byte per slot in memory both processes see, set once under
    a lock (0: nobody yet)."""

    def __init__(self, context):
        self._owners = context.RawArray("b", MAX_SHARED)
        self._lock = context.Lock()

    def claim(self, slot: int, who: int) -> bool:
        """Take slot `slot` for `who` unless it is taken; whether `who` has it."""
        with self._lock:
            if not self._owners[slot]:
                self._owners[slot] = who
            return self._owners[slot] == who


def _serve(jobs_in, results_out, parent_ends: tuple, warm_up, claims: _Claims) -> None:
    """The child: run each job received and hand (name, ok, result or traceback) to be sent
    back, until told to stop or the parent has gone. Threads move the jobs in and the results
    out meanwhile, so neither side blocks on a full pipe while the other is busy: the parent
    sending a large job, this loop drawing the next figure. The parent's ends of the pipes are
    closed here first, so its exit is seen. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()  # what the parent made stays out of collections: no copy-on-write of its pages
    for end in parent_ends:
        end.close()
    inbox, outbox = queue.SimpleQueue(), queue.SimpleQueue()
    threading.Thread(target=_read_jobs, args=(jobs_in, inbox), daemon=True).start()
    sender = threading.Thread(target=_send_results, args=(outbox, results_out), daemon=True)
    sender.start()
    if warm_up is not None:
        _attempt(warm_up, ())  # only a head start: a real failure shows in the jobs
    while (message := inbox.get()) is not None:
        name, job, args, slot = message
        if slot >= 0 and not claims.claim(slot, PAINTER):
            continue  # the parent ran it itself
        try:
            outbox.put((name, True, job(*args)))
        except Exception:
            outbox.put((name, False, traceback.format_exc()))
    outbox.put(None)
    sender.join()


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
