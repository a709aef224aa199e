"""The Dask edge fails closed: the embedded cluster refuses clients without its credentials,
`--scheduler` is parsed and probed with stated timeouts, a lost scheduler or a killed worker
ends in one `error:` with the finished rows written, and Ctrl-C to the process group is clean."""

import os
from pathlib import Path
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from inprocess import cli
from simsp import api
from simsp.explore.evaluation import executor as executor_module
from simsp.explore.evaluation.executor import Executor, ExecutorLost

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "scenarios" / "tiny.toml")
SWEEP = ["sweep", TINY, "--mode", "meta", "--recompute-granularity", "none,full", "--quiet"]


def one_error(argv: list[str], start: str) -> str:
    rc, out, err = cli(argv)
    assert (rc, out) == (2, "") and err.count("\n") == 1, (rc, out, err)
    assert err.startswith(f"error: {start}"), err
    return err


@pytest.mark.parametrize("address", ["localhost:8786", "http://h:8786", "tcp://h", "tcp://:8786",
                                     "tcp://h:0", "tcp://h:99999", "tcp://h:8786/x",
                                     "tls://h:8786", "tcp://h:87 86", "tcp://-h:8786"])
def test_scheduler_address_is_parsed_by_simsp(tmp_path, address):
    err = one_error([*SWEEP, "--out", str(tmp_path), "--scheduler", address], "--scheduler")
    assert "tcp://HOST:PORT" in err


def serve(reply: bytes | None):
    """A loopback service that accepts and then sends `reply` (None: says nothing)."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if reply:
                conn.sendall(reply)
    threading.Thread(target=accept, daemon=True).start()
    return server, f"tcp://127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize("reply,words", [(None, "sent no Dask handshake within 0.5 s"),
                                         (b"SSH-2.0-OpenSSH_9.6\r\n", "is not a Dask scheduler"),
                                         (b"\xff" * 64, "is not a Dask scheduler")])
def test_service_that_is_not_a_scheduler(tmp_path, monkeypatch, reply, words):
    """The dashboard (HTTP: silent until asked) used to hang; a service speaking first made the
    client allocate exabytes. Both are one error within the stated timeout."""
    monkeypatch.setattr(executor_module, "HANDSHAKE_TIMEOUT_S", 0.5)
    server, address = serve(reply)
    start = time.perf_counter()
    with server:
        err = one_error([*SWEEP, "--out", str(tmp_path), "--scheduler", address], "--scheduler")
    assert words in err and time.perf_counter() - start < 5
    assert not (tmp_path / "results.csv").exists()


def test_scheduler_without_workers(tmp_path, monkeypatch):
    from distributed import LocalCluster
    monkeypatch.setattr(executor_module, "NO_WORKERS_TIMEOUT_S", 1.0)
    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        err = one_error([*SWEEP, "--out", str(tmp_path), "--scheduler",
                         cluster.scheduler_address], "--scheduler")
    assert "has no worker (none joined within 1 s)" in err


def test_embedded_cluster_refuses_clients_without_its_credentials():
    """Another local user knows the port (it is on loopback) but not the certificates: a plain
    TCP client and a TLS client with credentials of its own are both refused; simsp's own
    client, with the cluster's temporary credentials, runs work."""
    from distributed import Client
    from distributed.security import Security
    with Executor(workers=1) as executor:
        address = executor.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert executor.client.submit(sum, [1, 2]).result() == 3
        port = address.rsplit(":", 1)[1]
        for target, security in ((f"tcp://127.0.0.1:{port}", None),
                                 (address, Security.temporary())):
            with pytest.raises((OSError, TimeoutError)):
                Client(target, security=security, timeout="3s")


class FakeExecutor:
    """Rows for the first `finish` jobs, then what a dying cluster does."""

    def __init__(self, finish: int, failure: str):
        self.finish, self.failure, self.force = finish, failure, False
        self.lost, self.killed = None, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def results(self, jobs: dict):
        from simsp.explore.evaluation.evaluate import evaluate
        for number, (digest, values) in enumerate(jobs.items()):
            if number == self.finish and self.failure == "lost":
                self.lost = "the Dask scheduler was lost (CommClosedError)"
                raise ExecutorLost(self.lost)
            if number == self.finish and self.failure == "killed":
                self.killed.append("KilledWorker")
                yield digest, {"status": "error", "error": "internal error: KilledWorker"}
                continue
            yield digest, evaluate(values)


@pytest.mark.parametrize("failure,words", [("lost", "the Dask scheduler was lost"),
                                           ("killed", "1 worker(s) died (KilledWorker")])
def test_finished_rows_are_written_when_the_cluster_fails(tmp_path, monkeypatch, failure, words):
    monkeypatch.setattr(api, "Executor", lambda *args: FakeExecutor(2, failure))
    rc, out, err = cli([*SWEEP[:-1], "--seed", "1,2,3,4", "--out", str(tmp_path)])
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: dask: ")
    finished = 2 if failure == "lost" else 7
    # the rows done before the failure were printed as they finished (a killed row as its
    # error), and only those
    printed = 2 if failure == "lost" else 8
    assert [line.split()[0] for line in out.splitlines()] == [str(i) for i in range(printed)]
    assert words in err and f"; {finished} of 8 rows finished" in err
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == 9  # header and every row: finished ones and error rows
    assert sum(",ok," in line for line in lines) == 2 + (failure == "killed") * 5
    assert f"finished and saved in {tmp_path / 'results.csv'}" in err
    assert len(list((tmp_path / "cache").glob("*.json"))) == sum(",ok," in x for x in lines)


def default_sigint() -> None:
    """In the child before exec: SIGINT's default action, as at a terminal (a suite started in
    the background, e.g. `nohup ... &`, hands its children SIGINT ignored, and a command started
    so ignores Ctrl-C by design)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupt_to_the_process_group_is_one_line(tmp_path):
    """Ctrl-C reaches every process of the group: the workers ignore it, the command prints
    `interrupted`, shuts its cluster down and exits 130."""
    argv = [sys.executable, "-m", "simsp.cli", "sweep", str(REPO / "scenarios" / "paper-22b.toml"),
            "--seed", ",".join(map(str, range(60))), "--workers", "2", "--quiet", "--out",
            str(tmp_path)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=default_sigint)
    deadline = time.time() + 300  # a loaded machine starts the cluster slowly
    while not list((tmp_path / "cache").glob("*.json")) and time.time() < deadline:
        time.sleep(0.2)  # the cluster is up and rows are finishing
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert (process.returncode, err) == (130, "interrupted\n"), err



STARTING = """
import os, signal
from simsp.explore.evaluation import executor

class Started:
    def close(self):
        print("closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

def starting(workers, security):
    os.killpg(0, signal.SIGINT)  # Ctrl-C while the nannies start (SIGINT ignored here then)
    return Started()

executor._local_cluster = starting
try:
    with executor.embedded_client(1):
        print("ran on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupt_while_the_workers_start_is_not_lost():
    """The command ignores SIGINT while the nannies start (they inherit it); a Ctrl-C then
    still ends the command: a `sleep` witness in the process group dies of it."""
    process = subprocess.run([sys.executable, "-c", STARTING], capture_output=True, text=True,
                             start_new_session=True, cwd=REPO, timeout=60,
                             preexec_fn=default_sigint)
    assert process.stdout.split() == ["closed", "interrupted"], process.stderr


CLUSTER = """
import time
from distributed import LocalCluster
if __name__ == "__main__":
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", protocol="tcp://")
    print(cluster.scheduler_address, flush=True)
    time.sleep(300)
"""


def test_scheduler_killed_mid_sweep_keeps_the_finished_rows(tmp_path):
    """A real external cluster killed (SIGKILL, scheduler and worker) once rows are finishing:
    one `error:` line saying so and how many rows were saved; results.csv has every row."""
    script = tmp_path / "cluster.py"
    script.write_text(CLUSTER)
    cluster = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        address = cluster.stdout.readline().strip()
        out = tmp_path / "out"
        sweep = subprocess.Popen([sys.executable, "-m", "simsp.cli", "sweep",
                                  str(REPO / "scenarios" / "paper-22b.toml"), "--seed",
                                  ",".join(map(str, range(40))), "--scheduler", address,
                                  "--quiet", "--out", str(out)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300  # a loaded machine starts the cluster slowly
        while len(list((out / "cache").glob("*.json"))) < 2 and time.time() < deadline:
            time.sleep(0.1)
    finally:
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()
    stdout, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("error: dask: the Dask scheduler was lost"), err
    saved = int(err.split("; ")[1].split(" of ")[0])
    lines = (out / "results.csv").read_text().splitlines()
    assert len(lines) == 41 and sum(",ok," in line for line in lines) == saved >= 2
