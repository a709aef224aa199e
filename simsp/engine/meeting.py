"""One pending collective of the communicator: who is expected, who has arrived with what."""

from dataclasses import dataclass, field

import simpy

ALL_TO_ALL = "all_to_all"
DEEPEP = ("deepep_dispatch", "deepep_combine")  # DeepEP's normal kernels (collectives/deepep.py)


@dataclass
class Meeting:
    """One pending collective: who is expected, who has arrived with what."""

    collective: str
    group: tuple[int, ...]
    nbytes: int
    tag: str
    expected: frozenset[int]
    done: simpy.Event
    elem_bytes: int
    buffers: dict[int, object] = field(default_factory=dict)
    name: str = ""  # the communicator's name ("": the group's default one)
