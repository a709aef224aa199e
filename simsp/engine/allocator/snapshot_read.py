"""Reading a memory snapshot pickle without trusting it (docs/allocator.md#snapshots-out-and-in).

A snapshot is plain data: dicts, lists, tuples, strings, numbers, booleans and None. The reader
refuses every global a pickle names (so no `__reduce__` payload can run: nothing is imported or
called), persistent ids, any other type, files over a size cap and anything after the pickle's
end; then it checks the fields simsp uses. Every refusal is one UserError line naming the file.
"""

import io
import os
import pickle
import stat

from simsp.errors import UserError, one_line

MAX_SNAPSHOT_BYTES = 4 << 30  # real snapshots "can easily be in the GB range" (torch/cuda/memory.py)
PLAIN_TYPES = frozenset((dict, list, tuple, str, int, float, bool, type(None)))
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot", "user_defined")


class _Refused(pickle.UnpicklingError):
    """A pickle asking for something a plain snapshot never needs."""


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that resolves no global and no persistent id: only plain data can come out."""

    def find_class(self, module, name):
        raise _Refused(f"it names {module}.{name}; a memory snapshot names no class or function")

    def persistent_load(self, pid):
        raise _Refused("it holds a persistent id; a memory snapshot holds none")


def _refuse(path, reason: str) -> UserError:
    return UserError(one_line(str(path)), one_line(reason))


def _read_capped(path, max_bytes: int) -> bytes:
    """The file's bytes, refused if it is not a regular file or larger than `max_bytes`."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, "not a regular file")
        if info.st_size > max_bytes:
            raise _refuse(path, f"{info.st_size} bytes, over the {max_bytes}-byte limit for a "
                                f"memory snapshot")
        with open(path, "rb") as source:
            data = source.read(max_bytes + 1)
    except OSError as exc:
        raise _refuse(path, f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise _refuse(path, f"over the {max_bytes}-byte limit for a memory snapshot")
    if not data:
        raise _refuse(path, "empty file, not a memory snapshot")
    return data


def _unpickle(path, data: bytes):
    """The pickled object, or a one-line refusal of a truncated, malformed or hostile pickle."""
    stream = io.BytesIO(data)
    try:
        value = _PlainUnpickler(stream).load()
    except _Refused as exc:
        raise _refuse(path, f"refused, not a plain memory snapshot: {exc}") from None
    except EOFError:
        raise _refuse(path, "truncated: the pickle ends before its end mark") from None
    except pickle.UnpicklingError as exc:
        raise _refuse(path, f"malformed or truncated pickle: {exc}") from None
    except Exception as exc:  # any malformed opcode stream: never a traceback
        raise _refuse(path, f"not a memory snapshot pickle ({type(exc).__name__}: {exc})") from None
    if stream.tell() != len(data):
        raise _refuse(path, f"{len(data) - stream.tell()} bytes follow the pickle's end mark")
    return value


def _check_plain(path, value) -> None:
    """Refuse any value whose type is not one a snapshot uses; each container is visited once
    (memo references can share one many times) and without recursion."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind not in PLAIN_TYPES:
            raise _refuse(path, f"holds a {kind.__name__} object; a memory snapshot holds only "
                                f"dict, list, tuple, str, int, float, bool and None")
        if kind in (dict, list, tuple) and id(item) not in seen:
            seen.add(id(item))  # a container of the snapshot: alive, so its id is its own
            if kind is dict:
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)


def read_snapshot(path, max_bytes: int = MAX_SNAPSHOT_BYTES) -> dict:
    """The snapshot dict in a file `torch.cuda.memory._dump_snapshot` (or simsp) wrote: a dict
    with "segments" and "device_traces" (a bare list of segments, the old format, is wrapped)."""
    value = _unpickle(path, _read_capped(path, max_bytes))
    _check_plain(path, value)
    if isinstance(value, list):
        value = {"segments": value, "device_traces": []}
    if not isinstance(value, dict) or "segments" not in value:
        raise _refuse(path, f"not a memory snapshot: expected a dict with 'segments', got a "
                            f"{type(value).__name__}")
    value.setdefault("device_traces", [])
    problem = _format_problem(value)
    if problem:
        raise _refuse(path, f"not a memory snapshot: {problem}")
    return value


def _field_problem(entry, where: str, fields: dict) -> str:
    """What is wrong with `entry`'s fields ({name: type}), or ""."""
    if type(entry) is not dict:
        return f"{where}: expected a dict, got {type(entry).__name__}"
    for name, kind in fields.items():
        if type(entry.get(name)) is not kind:
            got = type(entry[name]).__name__ if name in entry else "nothing"
            return f"{where}.{name}: expected {kind.__name__}, got {got}"
    return ""


def _segment_problem(segment, where: str) -> str:
    """What is wrong with one segment and its blocks, or ""."""
    problem = _field_problem(segment, where, {"address": int, "total_size": int, "stream": int,
                                              "blocks": list})
    if problem:
        return problem
    for j, block in enumerate(segment["blocks"]):
        problem = _field_problem(block, f"{where}.blocks[{j}]", {"size": int, "state": str})
        if problem:
            return problem
        if block["size"] < 0 or block["state"] not in BLOCK_STATES:
            return f"{where}.blocks[{j}]: size {block['size']}, state {block['state']!r}"
    covered = sum(block["size"] for block in segment["blocks"])
    if covered != segment["total_size"]:
        return f"{where}: its blocks add up to {covered} bytes, not its total_size {segment['total_size']}"
    return ""


def _trace_problem(entry, where: str) -> str:
    """What is wrong with one trace entry, or ""."""
    problem = _field_problem(entry, where, {"action": str, "size": int})
    if problem:
        return problem
    if entry["action"] not in ACTIONS:
        return f"{where}.action: unknown action {entry['action']!r}"
    place = "device_free" if entry["action"] == "oom" else "addr"
    if entry["action"] != "snapshot" and type(entry.get(place)) is not int:
        return f"{where}.{place}: expected int"
    return ""


def _format_problem(snapshot: dict) -> str:
    """The first field of the snapshot that is not as PyTorch writes it, or ""."""
    if type(snapshot["segments"]) is not list or type(snapshot["device_traces"]) is not list:
        return "segments and device_traces must be lists"
    for i, segment in enumerate(snapshot["segments"]):
        problem = _segment_problem(segment, f"segments[{i}]")
        if problem:
            return problem
    for d, trace in enumerate(snapshot["device_traces"]):
        if type(trace) is not list:
            return f"device_traces[{d}]: expected a list, got {type(trace).__name__}"
        for k, entry in enumerate(trace):
            problem = _trace_problem(entry, f"device_traces[{d}][{k}]")
            if problem:
                return problem
    return ""
