"""A snapshot from an untrusted source: payloads that would run code (a `__reduce__` that
creates a file, GLOBAL/INST/STACK_GLOBAL opcodes, persistent ids) are refused without running,
as are types a snapshot never holds, huge, truncated, empty and wrong files; each refusal is one
line naming the file (docs/allocator.md#snapshots-out-and-in)."""

import pickle

import pytest

from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.replay import Alloc, replay
from simsp.engine.allocator.snapshot import build_snapshot
from simsp.engine.allocator.snapshot_read import read_snapshot
from simsp.errors import UserError


class CreatesAFile:
    """Unpickled by a plain pickle.load, this opens (creates) `target` for writing."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


def refusal(path, **kwargs) -> str:
    with pytest.raises(UserError) as error:
        read_snapshot(path, **kwargs)
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def good_snapshot() -> dict:
    run = replay([Alloc("a", 1 << 20), Alloc("b", 12 << 20)], AllocatorConfig(1 << 30), record_trace=True)
    return build_snapshot(run.allocator)


def test_the_payload_is_live_for_a_plain_unpickler(tmp_path):
    # the check that the payload below is real: pickle.loads does create the file
    target = tmp_path / "created-by-plain-pickle"
    pickle.loads(pickle.dumps(CreatesAFile(target))).close()
    assert target.exists()


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_reduce_payload_inside_a_snapshot_never_runs(tmp_path, protocol):
    target = tmp_path / "pwned"
    snapshot = good_snapshot()
    snapshot["segments"][0]["blocks"][0]["frames"] = [CreatesAFile(target)]
    path = tmp_path / "hostile.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    assert f"names {open.__module__}.open" in refusal(path)  # refused at the name, never called
    assert not target.exists()


@pytest.mark.parametrize("payload", [
    b"cbuiltins\nopen\n(V{target}\nVw\ntR.",  # GLOBAL + REDUCE, protocol 0
    b"(V{target}\nVw\nibuiltins\nopen\n.",  # INST
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x8c\x04open\x93"
    b"\x8c{n}{target}\x8c\x01w\x86R.",  # STACK_GLOBAL + TUPLE2 + REDUCE, protocol 4
])
def test_opcodes_that_import_are_refused(tmp_path, payload):
    target = tmp_path / "pwned"
    data = payload.replace(b"{n}", bytes([len(str(target))])).replace(b"{target}", str(target).encode())
    path = tmp_path / "hostile.pickle"
    path.write_bytes(data)
    assert "names builtins.open" in refusal(path)
    assert not target.exists()


@pytest.mark.parametrize("data, reason", [
    (b"Pid\n.", "persistent id"),
    (pickle.dumps({"segments": [b"bytes"]}), "holds a bytes object"),
    (pickle.dumps({"segments": [], "x": {1, 2}}), "holds a set object"),
    (pickle.dumps({"segments": [], "x": bytearray(b"1")}, protocol=5), "holds a bytearray object"),
    (b"\x80\x02\x82\x01.", "unregistered extension code"),  # EXT1
])
def test_what_a_snapshot_never_holds_is_refused(tmp_path, data, reason):
    path = tmp_path / "odd.pickle"
    path.write_bytes(data)
    assert reason in refusal(path)


def test_a_truncated_snapshot(tmp_path):
    data = pickle.dumps(good_snapshot(), protocol=4)
    path = tmp_path / "cut.pickle"
    for cut in (len(data) // 2, 5, len(data) - 1):
        path.write_bytes(data[:cut])
        assert "truncated" in refusal(path)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.pickle"
    path.write_bytes(pickle.dumps(good_snapshot()))
    assert "over the 100-byte limit" in refusal(path, max_bytes=100)


def test_a_declared_length_beyond_the_file(tmp_path):
    path = tmp_path / "long.pickle"
    path.write_bytes(b"\x80\x04\x8d" + (1 << 60).to_bytes(8, "little") + b"abc")  # BINUNICODE8
    assert "truncated" in refusal(path)


def test_shared_references_are_checked_once(tmp_path):
    nested: list = []
    for _ in range(200):  # 2**200 paths through 200 lists: a walk without memory never ends
        nested = [nested, nested]
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps(nested))
    assert "segments[0]: expected a dict, got list" in refusal(path)


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_text('{"segments": []}'), "malformed or truncated pickle"),
    (lambda p: p.write_bytes(pickle.dumps(3)), "expected a dict with 'segments', got a int"),
    (lambda p: p.write_bytes(pickle.dumps({"device_traces": []})), "expected a dict with 'segments'"),
    (lambda p: p.write_bytes(pickle.dumps(good_snapshot()) + b"more"), "4 bytes follow the pickle"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: None, "cannot read it: No such file"),
])
def test_wrong_files(tmp_path, make, reason):
    path = tmp_path / "wrong.pickle"
    make(path)
    assert reason in refusal(path)


@pytest.mark.parametrize("edit, reason", [
    (lambda s: s["segments"][0].pop("address"), "segments[0].address: expected int, got nothing"),
    (lambda s: s["segments"][0]["blocks"][0].update(state="lost"), "state 'lost'"),
    (lambda s: s["segments"][1].update(total_size=1), "its blocks add up to"),
    (lambda s: s["device_traces"][0][0].update(action="teleport"), "unknown action 'teleport'"),
    (lambda s: s["device_traces"][0][1].update(addr="0x0"), "device_traces[0][1].addr: expected int"),
    (lambda s: s.update(device_traces={}), "must be lists"),
])
def test_fields_not_as_pytorch_writes_them(tmp_path, edit, reason):
    snapshot = good_snapshot()
    edit(snapshot)
    path = tmp_path / "edited.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert reason in refusal(path)


def test_a_name_with_a_line_break_stays_one_line(tmp_path):
    path = tmp_path / "two\nlines.pickle"
    path.write_bytes(b"")
    with pytest.raises(UserError) as error:
        read_snapshot(path)
    assert "\n" not in str(error.value) and "two\\nlines" in str(error.value)
