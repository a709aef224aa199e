"""The painter (report/run/painter.py): jobs in a process forked early, results by name, errors,
the one-process fallback, and the reports' bytes both ways."""

import multiprocessing
import os
import signal

import pytest

from simsp.report.run import painter as painting
from simsp.report.run.painter import Painter, start_painter

needs_fork = pytest.mark.skipif(not painting.can_fork(), reason="no fork or a single core")
WARMED = []  # what the warm-up left in the painter's process


def pid_and(value):
    return os.getpid(), value


def fails():
    raise ValueError("no figure for you")


def dies():
    os._exit(3)


def warm():
    WARMED.append("warm")


def warmed():
    return list(WARMED)


def sigint_handler():
    return signal.getsignal(signal.SIGINT)


@needs_fork
def test_jobs_run_in_another_process_and_come_back_by_name():
    with Painter(forked=True) as painter:
        painter.submit("small", pid_and, "a")
        painter.submit("large", pid_and, b"x" * 10**6)
        large, small = painter.result("large"), painter.result("small")  # any order
    assert os.getpid() not in (small[0], large[0])  # a worker each (maybe the same one)
    assert small[1] == "a" and large[1] == b"x" * 10**6


@needs_fork
def test_the_warm_up_runs_there_first_and_ctrl_c_is_left_to_this_process():
    with Painter(forked=True, warm_up=warm) as painter:
        painter.submit("warmed", warmed)
        painter.submit("sigint", sigint_handler)
        assert painter.result("warmed") == ["warm"] and WARMED == []
        assert painter.result("sigint") == signal.SIG_IGN


@needs_fork
def test_an_error_there_is_raised_here_with_its_traceback():
    with Painter(forked=True) as painter:
        painter.submit("bad", fails)
        painter.submit("good", pid_and, 1)
        with pytest.raises(RuntimeError, match="ValueError: no figure for you"):
            painter.result("bad")
        assert painter.result("good")[1] == 1  # the painter goes on after a failed job


@needs_fork
def test_a_painter_that_dies_without_a_result_is_an_error():
    with Painter(forked=True) as painter:
        painter.submit("gone", dies)
        with pytest.raises(RuntimeError, match="painter process exited.*without its figures"):
            painter.result("gone")  # "with code 3" when the first worker ran it


@needs_fork
def test_an_error_here_stops_and_reaps_the_painter():
    with pytest.raises(KeyError):
        with Painter(forked=True) as painter:
            painter.submit("slow", pid_and, 1)
            {}["missing"]
    assert multiprocessing.active_children() == []


@needs_fork
def test_closing_lets_the_painter_exit_cleanly():
    painter = Painter(forked=True)
    painter.submit("one", pid_and, 1)
    assert painter.result("one")[1] == 1
    child = painter._child
    painter.close()
    assert child.exitcode == 0 and multiprocessing.active_children() == []


def test_without_fork_each_job_runs_here_when_submitted(monkeypatch):
    monkeypatch.setattr(painting, "can_fork", lambda: False)
    with start_painter(warm_up=warm) as painter:
        painter.submit("mine", pid_and, "a")
        painter.submit("bad", fails)
        assert painter.result("mine") == (os.getpid(), "a")
        with pytest.raises(ValueError, match="no figure for you"):  # its own exception
            painter.result("bad")
    assert painter.submitted == ["mine", "bad"] and WARMED == []  # no warm-up: nothing ahead


def test_a_painter_that_is_not_wanted_runs_jobs_here():
    with start_painter(wanted=False) as painter:
        painter.submit("mine", pid_and, 1)
        assert painter.result("mine") == (os.getpid(), 1)


def _start_in_a_daemon(queue) -> None:
    """In a daemonic process (a Dask worker, say): the painter must not fork."""
    with start_painter() as painter:
        painter.submit("pid", pid_and, None)
        queue.put((os.getpid(), painter.result("pid")[0]))


@needs_fork
def test_a_daemonic_process_runs_the_jobs_itself():
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    daemon = context.Process(target=_start_in_a_daemon, args=(queue,), daemon=True)
    daemon.start()
    here, there = queue.get(timeout=30)
    daemon.join()
    assert here == there == daemon.pid


@needs_fork
def test_reports_are_the_same_bytes_painted_there_and_here(tmp_path, monkeypatch):
    from simsp.scenario.loading import load_scenario
    from simsp.metrics.collect import collect
    from simsp.report.run import write_reports
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    sc = load_scenario("scenarios/tiny.toml")
    run = simulate_iteration(sc, Shortcuts(), trace="steps")
    metrics = collect(run, Shortcuts())
    write_reports(run, metrics, tmp_path / "two", trace="steps")
    monkeypatch.setattr(painting, "can_fork", lambda: False)
    write_reports(run, metrics, tmp_path / "one", trace="steps")
    files = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "one").iterdir())
    assert {"trace.json", "memory.png", "exposed.png", "schedule.png"} <= set(files)
    for name in files:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


def test_the_label_drawn_before_the_metrics_is_the_metrics_label():
    from simsp.scenario.loading import load_scenario
    from simsp.metrics.collect import collect
    from simsp.report.run.summary_md import run_label, variant_label
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    sc = load_scenario("scenarios/tiny.toml")
    metrics = collect(simulate_iteration(sc, Shortcuts(), trace="none"), Shortcuts())
    assert run_label(sc) == variant_label(metrics) and "tiny" in run_label(sc)


def sized(nbytes: int) -> bytes:
    return b"r" * nbytes


@needs_fork
def test_large_jobs_and_large_results_cross_without_deadlock():
    """Jobs and results bigger than a pipe's buffer, sent before any result is read."""
    with Painter(forked=True) as painter:
        for i in range(4):
            painter.submit(f"job {i}", sized, 3_000_000 + len(b"j" * 3_000_000))
        assert [len(painter.result(f"job {i}")) for i in range(4)] == [6_000_000] * 4


@needs_fork
def test_the_painter_exits_when_this_process_is_gone(tmp_path):
    """A parent killed outright (no close): its painter sees the pipe close and exits."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    parent = context.Process(target=_start_and_report_child, args=(queue,))
    parent.start()
    child_pid = queue.get(timeout=30)
    parent.kill()
    parent.join()
    for _ in range(200):
        if not _alive(child_pid):
            break
        __import__("time").sleep(0.05)
    assert not _alive(child_pid)


def _start_and_report_child(queue) -> None:
    painter = Painter(forked=True)
    painter.submit("one", pid_and, b"j" * 3_000_000)
    queue.put(painter.result("one")[0])
    __import__("time").sleep(60)  # killed meanwhile


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_painter_made_memory_counters_are_the_trace_writer_own(tmp_path):
    """trace.json with the stages' counters encoded by the painter equals the one the trace
    writer makes alone, byte for byte (a two-stage run: every simulated rank is a stage's)."""
    from simsp.scenario.loading import load_scenario
    from simsp.metrics.collect import collect
    from simsp.report.run import write_reports
    from simsp.report.run.trace.writer import write_chrome_trace
    from simsp.training.driver.iteration import Shortcuts, simulate_iteration
    sc = load_scenario("scenarios/tiny.toml")
    run = simulate_iteration(sc, Shortcuts(), trace="steps")
    write_reports(run, collect(run, Shortcuts()), tmp_path / "painted", trace="steps")
    alone = write_chrome_trace(run, tmp_path / "alone.json", detail="steps")
    assert (tmp_path / "painted" / "trace.json").read_bytes() == alone.read_bytes()
    assert b'"name":"memory"' in alone.read_bytes()


def test_with_another_thread_running_the_jobs_run_here():
    """A fork copies only the calling thread: with another one alive, no painter is forked."""
    import threading
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert not painting.can_fork()
        with start_painter() as painter:
            painter.submit("pid", pid_and, None)
            assert painter.result("pid")[0] == os.getpid()
    finally:
        release.set()
        other.join()


def test_a_refused_fork_runs_the_jobs_here(monkeypatch):
    def refuse(self, warm_up):
        raise BlockingIOError(11, "Resource temporarily unavailable")  # fork's EAGAIN
    monkeypatch.setattr(Painter, "_fork", refuse)
    with start_painter() as painter:
        painter.submit("pid", pid_and, None)
        assert painter.result("pid")[0] == os.getpid()


def pid_after(seconds: float, value):
    __import__("time").sleep(seconds)
    return os.getpid(), value


@needs_fork
def test_a_shared_job_not_begun_there_runs_here_and_not_twice():
    with Painter(forked=True) as painter:
        painter.submit("slow", pid_after, 1.0, "slow")
        painter.submit("slow too", pid_after, 1.0, "slow")  # both workers are busy
        painter.submit("shared", pid_and, "s", shared=True)
        painter.submit("after", pid_and, "a")
        assert painter.result("shared") == (os.getpid(), "s")  # the workers were busy
        assert painter.result("slow")[0] != os.getpid()
        assert painter.result("slow too")[0] != os.getpid()
        assert painter.result("after")[0] != os.getpid()
        assert painter._results == {}  # the workers skipped the shared job: no second result


def mark_then_pid(marker: str, value):
    open(marker, "w").close()
    return pid_after(0.3, value)


@needs_fork
def test_a_shared_job_begun_there_is_waited_for(tmp_path):
    marker = tmp_path / "begun"
    with Painter(forked=True) as painter:
        painter.submit("shared", mark_then_pid, str(marker), "s", shared=True)
        for _ in range(600):  # until the painter has begun it
            if marker.exists():
                break
            __import__("time").sleep(0.05)
        pid, value = painter.result("shared")
        assert pid != os.getpid() and value == "s"


def test_without_fork_a_shared_job_runs_here_when_submitted(monkeypatch):
    monkeypatch.setattr(painting, "can_fork", lambda: False)
    with start_painter() as painter:
        painter.submit("shared", pid_and, 1, shared=True)
        assert painter.result("shared") == (os.getpid(), 1)


def meet(mine: str, other: str):
    """Leave a marker, then wait (up to 30 s) for the other job's: True only if both ran at
    once."""
    open(mine, "w").close()
    for _ in range(600):
        if os.path.exists(other):
            return os.getpid()
        __import__("time").sleep(0.05)
    return None


def count_run(path: str):
    with open(path, "a") as log:
        log.write("ran\n")
    return os.getpid()


@needs_fork
def test_two_workers_draw_at_once(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with Painter(forked=True) as painter:
        painter.submit("one", meet, a, b)
        painter.submit("two", meet, b, a)
        one, two = painter.result("one"), painter.result("two")
    assert None not in (one, two) and one != two and os.getpid() not in (one, two)


@needs_fork
def test_every_job_runs_once_though_each_worker_receives_it(tmp_path):
    log = tmp_path / "log"
    with Painter(forked=True) as painter:
        for i in range(6):
            painter.submit(f"job {i}", count_run, str(log))
        pids = {painter.result(f"job {i}") for i in range(6)}
    assert log.read_text() == "ran\n" * 6 and os.getpid() not in pids
