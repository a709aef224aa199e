"""Progress bars: on stderr only when it is a terminal (a real pty here), silenced by --quiet,
never changing stdout."""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import pytest

SMALL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
         "--seq-length", "8", "--vocab-size", "64"]
COMMANDS = {
    "run": ["run", *SMALL, "--pipeline-model-parallel-size", "2", "--global-batch-size", "4"],
    "verify": ["verify", "--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "2",
               "--seq-length", "4", "--vocab-size", "16"],
    "ring": ["ring", "--ranks", "4", "--min-size", "1K", "--max-size", "64K"],
}


def _read_all(fd: int, proc) -> bytes:
    """Everything written to the pty until the child exits and the pty drains."""
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks)


def run_cli(args: list[str], tmp_path, tty: bool) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of `python -m simsp.cli ARGS`, stderr a pty if `tty`."""
    if args[0] == "run":
        args = [*args, "--out", str(tmp_path / "out")]
    command = [sys.executable, "-m", "simsp.cli", *args]
    if not tty:
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
        return done.stdout, done.stderr, done.returncode
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # rows, columns
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave, cwd=tmp_path)
    os.close(slave)
    err = _read_all(master, proc)
    out = proc.stdout.read().decode()
    proc.wait()
    os.close(master)
    return out, err.decode(errors="replace"), proc.returncode


@pytest.fixture(autouse=True)
def _source_on_path(monkeypatch):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("PYTHONPATH", root)


@pytest.mark.parametrize("name,marker", [("run", "16/16"), ("verify", "param"),
                                         ("ring", "size")])
def test_progress_only_on_a_terminal_and_quiet_silences_it(name, marker, tmp_path):
    """Not a terminal: stderr empty. A terminal: a bar (run: 2 stages x 4 micro-batches x
    forward and backward = 16 steps, and the simulated time). --quiet: nothing. Same stdout."""
    plain_out, plain_err, status = run_cli(COMMANDS[name], tmp_path, tty=False)
    assert status == 0 and plain_out and plain_err == ""
    out, err, status = run_cli(COMMANDS[name], tmp_path, tty=True)
    assert status == 0 and marker in err and "%" in err
    if name == "run":
        assert re.search(r"simulated \d+\.\d ms", err)
    assert out == plain_out  # stdout unchanged by the bar
    quiet_out, quiet_err, _ = run_cli([*COMMANDS[name], "--quiet"], tmp_path, tty=True)
    assert quiet_err == "" and quiet_out == plain_out


def test_every_command_accepts_quiet():
    """--quiet is on every subcommand, also those that define their own (no argparse clash)."""
    from simsp.cli import COMMANDS, build_parser
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(COMMANDS) <= set(commands)
    for name in COMMANDS:
        assert "--quiet" in commands[name]._option_string_actions


def test_search_shows_its_phases_with_totals_and_quiet_silences_them(tmp_path):
    """search's bars on a terminal: the layouts checked (2 GPUs, 2 layers, global batch 2:
    t 1 p 1 d 2 b 1 gives 3 recompute x 2 distributed optimizer = 6; t 1 p 2 d 1 b 1 or 2, 3 each
    under 1F1B, ZB-H1 and ZB-H2 = 18 (ZB-V and DualPipeV need 2p | 2 layers, DualPipe m >= 2p);
    t 2 p 1 d 1 b 1 or 2, 2 SP x 3 each = 12; 36 in all), the layouts bounded and those simulated.
    --quiet: nothing on stderr (not a terminal: simsp.progress.wanted, the test above), the same
    stdout (but its folder). A bar that vanishes when done may never draw its last count: the
    total is what is checked."""
    search = ["search", *SMALL, "--gpus", "2", "--global-batch-size", "2", "--workers", "0"]
    outputs = []
    for name, extra in (("bar", []), ("quiet", ["--quiet"])):
        out, err, status = run_cli([*search, *extra, "--out", name], tmp_path, tty=True)
        assert status == 0
        outputs.append((out.replace(name, "DIR"), err))
    (bar_out, err), (quiet_out, quiet_err) = outputs
    assert re.search(r"simsp search: layouts checked: +\d+%\|[^|]*\| \d+/36 ", err)
    assert "simsp search: bounds" in err and "simsp search: simulated" in err
    assert quiet_err == "" and quiet_out == bar_out
