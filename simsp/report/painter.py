"""The report figures drawn on a second core, by a process started before the simulation.

`simsp run` starts the painter first: a child forked while this process is still small
(multiprocessing's "fork" method) imports matplotlib and loads its fonts while the simulation
runs here. Once the run ends, this process sends it what each figure shows (plain numbers and
numpy arrays, report/figure_inputs.py), writes trace.json and measures memory meanwhile, and
receives the PNG bytes. Where fork is missing (Windows), a second core is not ours, or this is a
daemonic process (a Dask worker, which may not have children), every job runs here when it is
submitted. A job is a deterministic function of its inputs: the same bytes either way.
"""

import multiprocessing
import os
import signal
import traceback


def cores_available() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a painter process can be forked: fork exists, a second core is ours, and this is
    not a daemonic process."""
    return ("fork" in multiprocessing.get_all_start_methods() and cores_available() >= 2
            and not multiprocessing.current_process().daemon)


class Painter:
    """Runs submitted jobs (a module-level function and its arguments) in submission order and
    hands back their results by name; here, or in the forked child when `forked`."""

    def __init__(self, forked: bool = False, warm_up=None):
        self.submitted: list[str] = []
        self._results: dict[str, tuple[bool, object]] = {}
        self._child = self._conn = None
        if forked:
            self._fork(warm_up)

    def _fork(self, warm_up) -> None:
        context = multiprocessing.get_context("fork")
        mine, theirs = context.Pipe()
        self._child = context.Process(target=_serve, args=(theirs, warm_up), daemon=True)
        self._child.start()
        theirs.close()
        self._conn = mine

    def submit(self, name: str, job, *args) -> None:
        """Start `job(*args)` (in the child, or now); its result is `result(name)`."""
        self.submitted.append(name)
        if self._conn is not None:
            self._conn.send((name, job, args))
        else:
            self._results[name] = _attempt(job, args)

    def result(self, name: str):
        """The job's return value; its exception is raised here (the child's as RuntimeError
        with its traceback)."""
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
            name, ok, value = self._conn.recv()
        except EOFError:
            self._child.join()
            raise RuntimeError(f"the painter process exited with code {self._child.exitcode} "
                               "without its figures") from None
        self._results[name] = (ok, value)

    def close(self) -> None:
        """Let the child finish and reap it (at once when something failed here)."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass  # it has gone already
        conn.close()
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
    that runs jobs here. `warm_up`: run first in the child (imports, fonts)."""
    return Painter(forked=wanted and can_fork(), warm_up=warm_up)


def _attempt(job, args: tuple) -> tuple[bool, object]:
    """(True, job(*args)) or (False, the exception)."""
    try:
        return True, job(*args)
    except Exception as exc:  # handed to whoever asks for the result
        return False, exc


def _serve(conn, warm_up) -> None:
    """The child's loop: run each job received and send (name, ok, result or traceback) back,
    until told to stop or the parent has gone. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if warm_up is not None:
            _attempt(warm_up, ())  # only a head start: a real failure shows in the jobs
        while (message := conn.recv()) is not None:
            name, job, args = message
            try:
                conn.send((name, True, job(*args)))
            except Exception:
                conn.send((name, False, traceback.format_exc()))
    except (EOFError, BrokenPipeError, OSError):
        pass  # the parent has gone: nothing left to draw for
    finally:
        conn.close()
