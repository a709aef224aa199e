"""Report work on two cores (report/two_cores.py): results, errors, and the one-core fallback."""

import os

import pytest

from simsp.report import two_cores

needs_fork = pytest.mark.skipif(not two_cores.can_fork(), reason="no fork or a single core")


@needs_fork
def test_the_second_piece_runs_in_another_process_and_comes_back():
    mine, theirs = two_cores.both(lambda: (os.getpid(), "a"), lambda: (os.getpid(), b"x" * 10**6))
    assert mine == (os.getpid(), "a")
    assert theirs[0] != os.getpid() and theirs[1] == b"x" * 10**6  # a large result too


@needs_fork
def test_an_error_in_the_child_is_raised_here_with_its_traceback():
    def fails():
        raise ValueError("no trace for you")
    with pytest.raises(RuntimeError, match="ValueError: no trace for you"):
        two_cores.both(lambda: 1, fails)


@needs_fork
def test_a_child_that_dies_without_a_result_is_an_error():
    with pytest.raises(RuntimeError, match="exited with code 3"):
        two_cores.both(lambda: 1, lambda: os._exit(3))


@needs_fork
def test_an_error_here_still_reaps_the_child():
    with pytest.raises(KeyError):
        two_cores.both(lambda: {}["missing"], lambda: 2)
    assert not [p for p in __import__("multiprocessing").active_children()]


def test_on_one_core_both_run_here_in_order(monkeypatch):
    monkeypatch.setattr(two_cores, "can_fork", lambda: False)
    order = []
    result = two_cores.both(lambda: order.append("first") or os.getpid(),
                            lambda: order.append("second") or os.getpid())
    assert result == (os.getpid(), os.getpid()) and order == ["first", "second"]


@needs_fork
def test_reports_are_the_same_bytes_on_two_cores_and_on_one(tmp_path, monkeypatch):
    from simsp.config import load_scenario
    from simsp.metrics import collect
    from simsp.report import write_reports
    from simsp.training.iteration import Shortcuts, simulate_iteration
    sc = load_scenario("scenarios/tiny.toml")
    run = simulate_iteration(sc, Shortcuts(), trace="steps")
    metrics = collect(run, Shortcuts())
    write_reports(run, metrics, tmp_path / "two", trace="steps")
    monkeypatch.setattr(two_cores, "can_fork", lambda: False)
    write_reports(run, metrics, tmp_path / "one", trace="steps")
    files = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "trace.json" in files and "memory.png" in files and "exposed.png" in files
    for name in files:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


def _both_in_a_daemon(queue) -> None:
    """In a daemonic process: both() must not try to fork."""
    queue.put(two_cores.both(lambda: os.getpid(), lambda: os.getpid()))


@needs_fork
def test_a_daemonic_process_runs_both_itself():
    import multiprocessing
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    daemon = context.Process(target=_both_in_a_daemon, args=(queue,), daemon=True)
    daemon.start()
    first, second = queue.get(timeout=30)
    daemon.join()
    assert first == second == daemon.pid
