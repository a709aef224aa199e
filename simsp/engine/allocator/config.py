"""The allocator's settings: capacity, and the PYTORCH_CUDA_ALLOC_CONF options simsp models.

Options (pytorch/pytorch `c10/core/AllocatorConfig.cpp` at 0ac71663, `parseArgs`):
`expandable_segments:True|False`, `max_split_size_mb:N` (N >= 20, kLargeBuffer in MiB), and
`roundup_power2_divisions:N` or `roundup_power2_divisions:[256:1,512:2,>:8]` (boundaries in MiB,
divisions 0 or a power of two); docs/allocator.md#settings.
"""

from dataclasses import dataclass

from simsp.errors import UserError
from simsp.engine.allocator.sizes import LARGE_BUFFER, MB, NO_DIVISIONS, ROUNDUP_INTERVALS

_OPTIONS = ("expandable_segments", "max_split_size_mb", "roundup_power2_divisions")


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class AllocatorConfig:
    """One device's caching allocator: what it may reserve, and how it is configured.

    capacity_bytes: what cudaMalloc (or cuMemCreate) hands out in all, so reserved memory never
    exceeds it; device_total_bytes: the GPU's totalGlobalMem, which sizes an expandable segment's
    address space (defaults to capacity_bytes); max_split_size: bytes, None for unlimited (the
    default, SIZE_MAX); roundup_power2_divisions: one entry per interval of sizes.py.
    """

    capacity_bytes: int
    expandable_segments: bool = False
    max_split_size: int | None = None
    roundup_power2_divisions: tuple[int, ...] = NO_DIVISIONS
    device_total_bytes: int | None = None

    def __post_init__(self):
        if not isinstance(self.capacity_bytes, int) or self.capacity_bytes <= 0:
            raise UserError("capacity_bytes", f"must be a positive integer, got {self.capacity_bytes!r}")
        if self.max_split_size is not None and self.max_split_size < LARGE_BUFFER:
            raise UserError("max_split_size_mb", f"must be >= {LARGE_BUFFER // MB} (kLargeBuffer), "
                                                 f"got {self.max_split_size / MB:g}")
        divisions = self.roundup_power2_divisions
        if len(divisions) != ROUNDUP_INTERVALS or any(d != 0 and not _power_of_two(d) for d in divisions):
            raise UserError("roundup_power2_divisions",
                            f"needs {ROUNDUP_INTERVALS} entries, each 0 or a power of two, got {divisions!r}")
        if self.device_total_bytes is not None and self.device_total_bytes <= 0:
            raise UserError("device_total_bytes", f"must be positive, got {self.device_total_bytes!r}")

    @property
    def total_bytes(self) -> int:
        """totalGlobalMem: the device's memory, for the expandable address space."""
        return self.device_total_bytes if self.device_total_bytes is not None else self.capacity_bytes

    @property
    def split_limit(self) -> float:
        """max_split_size as a number (infinite when unlimited)."""
        return float("inf") if self.max_split_size is None else self.max_split_size

    def alloc_conf(self) -> str:
        """The PYTORCH_CUDA_ALLOC_CONF string that sets this configuration ("" for the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size // MB}")
        if self.roundup_power2_divisions != NO_DIVISIONS:
            steps = ",".join(f"{1 << i}:{d}" for i, d in enumerate(self.roundup_power2_divisions))
            parts.append(f"roundup_power2_divisions:[{steps}]")
        return ",".join(parts)


def _parse_bool(text: str) -> bool:
    if text not in ("True", "False", "true", "false"):
        raise UserError("expandable_segments", f"expected True or False, got {text!r}")
    return text in ("True", "true")


def _parse_int(field: str, text: str) -> int:
    if not text.isdigit():
        raise UserError(field, f"expected a non-negative integer, got {text!r}")
    return int(text)


def _parse_divisions(text: str) -> tuple[int, ...]:
    """roundup_power2_divisions: one value for every interval, or a [boundary:value, >:value] list
    (parseRoundUpPower2Divisions: the first value also fills the intervals below its boundary)."""
    field = "roundup_power2_divisions"
    if not text.startswith("["):
        return (_parse_int(field, text),) * ROUNDUP_INTERVALS
    if not text.endswith("]"):
        raise UserError(field, f"expected a closing ']' in {text!r}")
    table = [0] * ROUNDUP_INTERVALS
    first, last_index = True, 0
    for item in filter(None, text[1:-1].split(",")):
        boundary, _, value_text = item.partition(":")
        value = _parse_int(field, value_text)
        if boundary == ">":
            table[last_index + 1:] = [value] * (ROUNDUP_INTERVALS - last_index - 1)
            continue
        size_mb = _parse_int(field, boundary)
        if not _power_of_two(size_mb):
            raise UserError(field, f"interval boundaries must be powers of two, got {size_mb}")
        index = min(size_mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            table[:index] = [value] * index
            first = False
        table[index], last_index = value, index
    return tuple(table)


def parse_alloc_conf(text: str, capacity_bytes: int, device_total_bytes: int | None = None
                     ) -> AllocatorConfig:
    """An AllocatorConfig from a PYTORCH_CUDA_ALLOC_CONF string such as
    "expandable_segments:True,max_split_size_mb:512"; options simsp does not model are refused."""
    settings: dict = {}
    items = [] if not text.strip() else _split_options(text)
    for key, value in items:
        if key == "expandable_segments":
            settings["expandable_segments"] = _parse_bool(value)
        elif key == "max_split_size_mb":
            settings["max_split_size"] = _parse_int(key, value) * MB
        elif key == "roundup_power2_divisions":
            settings["roundup_power2_divisions"] = _parse_divisions(value)
        else:
            raise UserError("PYTORCH_CUDA_ALLOC_CONF", f"unknown or unmodelled option {key!r} "
                                                       f"(simsp models {', '.join(_OPTIONS)})")
    return AllocatorConfig(capacity_bytes, device_total_bytes=device_total_bytes, **settings)


def _split_options(text: str) -> list[tuple[str, str]]:
    """key:value pairs split at the commas outside brackets."""
    pairs, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            key, sep, value = text[start:i].strip().partition(":")
            if not sep or not value:
                raise UserError("PYTORCH_CUDA_ALLOC_CONF", f"expected key:value, got {text[start:i]!r}")
            pairs.append((key.strip(), value.strip()))
            start = i + 1
    return pairs
