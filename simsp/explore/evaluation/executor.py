"""Where configurations run: an embedded Dask LocalCluster (one worker process per core, one
thread each), an existing Dask scheduler by address, or this process (workers=0).

Workers are long-lived processes: each imports simsp once and then evaluates configuration after
configuration. Results come back in completion order; callers sort them by configuration order.

The edge fails closed. The embedded cluster speaks TLS with a certificate authority made for this
process alone (distributed.security.Security.temporary()), so another local user's client,
without those credentials, cannot connect to it, let alone submit work. An external scheduler is
parsed by simsp (tcp://HOST:PORT), probed before Dask connects (it must speak Dask's framing
within HANDSHAKE_TIMEOUT_S) and must have a worker within NO_WORKERS_TIMEOUT_S. A scheduler lost
mid-run or a worker killed (for memory) ends the command with an `error:` saying what happened
and how many rows were saved; finished rows are always kept. Worker processes ignore SIGINT, so
Ctrl-C to the process group reaches only this process, which shuts the cluster down.
"""

from contextlib import contextmanager
import logging
import re
import signal
import subprocess
import socket
import struct

from simsp.errors import UserError
from simsp.explore.evaluation.evaluate import evaluate
from simsp.explore.evaluation.limits import check_workers, max_workers

# The scheduler's HTTP endpoint (and the dashboard, when bokeh is installed) on a free loopback
# port: `dashboard_address=None` still binds port 8787, which another sweep may hold.
LOOPBACK_ANY_PORT = "127.0.0.1:0"
HANDSHAKE_TIMEOUT_S = 10.0  # a scheduler sends its handshake at once; 10 s covers a slow network
NO_WORKERS_TIMEOUT_S = 30.0  # how long a scheduler may have no worker before simsp gives up
MAX_FIRST_FRAME_BYTES = 1 << 20  # Dask's handshake is a few hundred bytes
ADDRESS = re.compile(r"^tcp://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?"
                     r"|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})$")


class ExecutorLost(Exception):
    """The cluster went away mid-run (scheduler lost): the rows finished so far are kept."""


def default_workers() -> int:
    """One worker per usable core."""
    return max_workers()


def parse_scheduler(address: str) -> tuple[str, int]:
    """(host, port) of `tcp://HOST:PORT`; anything else is one UserError."""
    match = ADDRESS.match(address or "")
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise UserError("--scheduler", f"{address!r} is not a Dask scheduler address "
                                       "tcp://HOST:PORT (port 1-65535), e.g. tcp://10.0.0.5:8786")
    return match.group("host").strip("[]"), int(match.group("port"))


def probe_scheduler(address: str, timeout: float | None = None) -> None:
    """Connect and read the first 8 bytes a Dask scheduler sends (its frame-length header);
    a service that says nothing in time, or something else, is one UserError."""
    host, port = parse_scheduler(address)
    timeout = HANDSHAKE_TIMEOUT_S if timeout is None else timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            header = _read_exactly(sock, 8)
    except socket.timeout:
        raise UserError("--scheduler", f"{address} accepted the connection but sent no Dask "
                                       f"handshake within {timeout:g} s (is it the dashboard, "
                                       "usually :8787? the scheduler is usually :8786)") from None
    except OSError as exc:
        raise UserError("--scheduler", f"cannot reach {address}: "
                                       f"{exc.strerror or type(exc).__name__}") from None
    if header is None or not 0 < struct.unpack("<Q", header)[0] <= MAX_FIRST_FRAME_BYTES:
        raise UserError("--scheduler", f"{address} is not a Dask scheduler (its first bytes are "
                                       "not Dask's handshake)")


def _read_exactly(sock, count: int) -> bytes | None:
    """`count` bytes, or None when the peer closes first."""
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@contextmanager
def external_client(address: str):
    """A distributed.Client on an existing scheduler: probed, connected, with a worker."""
    from distributed import Client
    probe_scheduler(address)
    try:
        client = Client(address, timeout=f"{HANDSHAKE_TIMEOUT_S}s")
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        raise UserError("--scheduler", f"cannot connect to {address}: {exc}") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=NO_WORKERS_TIMEOUT_S)
        except (TimeoutError, OSError):
            raise UserError("--scheduler", f"{address} has no worker (none joined within "
                                           f"{NO_WORKERS_TIMEOUT_S:g} s)") from None
        yield client


@contextmanager
def embedded_client(workers: int | None):
    """A Client on a LocalCluster bound to loopback, TLS with credentials only this process has."""
    import dask
    from distributed import Client
    from distributed.security import Security
    security = Security.temporary()
    witness = _interrupt_witness()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the nannies inherit "ignore"
    try:
        with dask.config.set(WORKER_CONFIG):  # the nannies hand it to their workers
            cluster = _local_cluster(workers, security)
    finally:
        signal.signal(signal.SIGINT, previous)
        witness.kill()  # a SIGINT sent before this already set its exit status (fatal signal)
        interrupted = witness.wait() == -signal.SIGINT  # a Ctrl-C this process ignored
    if interrupted:
        cluster.close()
        raise KeyboardInterrupt
    with cluster, Client(cluster, security=security) as client:
        yield client


def _interrupt_witness() -> subprocess.Popen:
    """A `sleep` in this process group that a Ctrl-C ends (SIGINT's default action), started
    before this process ignores SIGINT for the nannies' start, so a Ctrl-C meanwhile is seen."""
    return subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# The workers' statistical profiler samples the task thread's stack every 10 ms for the
# dashboard (distributed's worker.profile settings); simsp shows no dashboard and a simulation's
# stacks are deep (simpy generators): off, its CPU goes to the rows.
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}


def _local_cluster(workers: int | None, security):
    """The embedded LocalCluster: one single-threaded worker process per core, loopback, TLS."""
    from distributed import LocalCluster
    return LocalCluster(n_workers=workers or default_workers(), threads_per_worker=1,
                        processes=True, dashboard_address=LOOPBACK_ANY_PORT,
                        host="127.0.0.1", protocol="tls://", security=security,
                        silence_logs=logging.CRITICAL + 1)  # simsp reports failures


QUIET_LOGGERS = ("tornado.application", "distributed")


def _quiet_event_loop():
    """Silence this process's Dask and event-loop logs while a cluster is in use (Ctrl-C inside
    distributed's sync() logs a NameError from its cancel callback; a lost scheduler logs the
    client's reconnection tracebacks): simsp reports what happened in one `error:` line.
    Returns the function that restores the loggers."""
    import distributed  # noqa: F401  its import configures its loggers' levels: override them
    names = [name for name in logging.root.manager.loggerDict
             if name.split(".")[0] in QUIET_LOGGERS or name in QUIET_LOGGERS]
    loggers = [logging.getLogger(name) for name in {*QUIET_LOGGERS, *names}]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    return lambda: [logger.setLevel(level) for logger, level in zip(loggers, levels)]


def dask_client(workers: int | None, scheduler: str | None):
    """A distributed.Client on the given scheduler, or on an embedded loopback LocalCluster."""
    return external_client(scheduler) if scheduler else embedded_client(workers)


class Executor:
    """Evaluate batches of configurations; one Dask client kept for all batches (or none).
    `force`: rows above run's time limit are simulated anyway (never above its memory limit)."""

    def __init__(self, workers: int | None = None, scheduler: str | None = None,
                 force: bool = False):
        if scheduler:
            parse_scheduler(scheduler)
        check_workers(workers)
        self.workers, self.scheduler, self.force = workers, scheduler, force
        self._context = None
        self.client = None
        self.lost = None  # why the cluster went away, if it did
        self.killed = []  # rows whose worker died

    def __enter__(self):
        """Start (or connect to) the Dask cluster unless in-process."""
        if self.scheduler or self.workers != 0:
            self._quiet = _quiet_event_loop()
            self._context = dask_client(self.workers, self.scheduler)
            self.client = self._context.__enter__()
        return self

    def __exit__(self, *exc):
        """Close the client and, if embedded, the cluster (quietly if the scheduler is gone)."""
        if self._context is None:
            return False
        try:
            return self._context.__exit__(*exc)
        except Exception:  # noqa: BLE001  closing a cluster whose scheduler is already gone
            if self.lost is None:
                raise
            return False
        finally:
            self._quiet()

    def parallelism(self) -> int:
        """How many configurations run at once: the cluster's worker threads (1 in-process)."""
        if self.client is None:
            return 1
        return max(1, sum(w["nthreads"] for w in self.client.scheduler_info()["workers"].values()))

    def results(self, jobs: dict):
        """Yield (digest, row) for each {digest: values} job as it completes; a worker killed
        on a row makes it an error row; a lost scheduler raises ExecutorLost."""
        if self.client is None:
            for digest, values in jobs.items():
                yield digest, evaluate(values)
            return
        from distributed import as_completed

        futures = {self.client.submit(evaluate, values, key=f"simsp-{digest}", pure=False): digest
                   for digest, values in jobs.items()}
        try:
            for future in as_completed(futures):
                yield futures[future], self._row(future)
                future.release()
        finally:
            for future in futures:
                if not future.done():
                    future.cancel()

    def _row(self, future) -> dict:
        """The future's row; KilledWorker -> an error row; scheduler gone -> ExecutorLost."""
        from distributed import KilledWorker
        try:
            return future.result()
        except KilledWorker as exc:
            self.killed.append(str(exc))
            return {"status": "error", "error": "internal error: KilledWorker: the worker "
                    "process simulating this row died (out of memory, or killed)"}
        except Exception as exc:  # noqa: BLE001  CancelledError, CommClosedError, OSError ...
            self.lost = f"the Dask scheduler was lost ({type(exc).__name__})"
            raise ExecutorLost(self.lost) from None
