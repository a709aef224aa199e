"""Overrides from outside simsp: a Hugging Face config.json (`--hf-config`) and a pasted
Megatron-LM launch line (`--megatron-args`, `--megatron-args-file`); the flags given directly
on simsp's command line override both (`scenario_from_args`, the scenario every command that
takes scenario flags simulates)."""

from pathlib import Path
import sys
from typing import NamedTuple

from simsp.errors import UserError
from simsp.scenario.config import Scenario
from simsp.scenario.flags import overrides_from_args
from simsp.scenario.loading import load_scenario, read_toml
from simsp.scenario.launch_line import parse_launch_line, read_launch_text

_NODES, _GPUS = ("cluster", "nodes"), ("cluster", "gpus_per_node")


class Pasted(NamedTuple):
    """The outside overrides ({(section, key): value}) and whether a launcher set the GPUs."""

    overrides: dict
    launcher_world: bool
    fallback: dict = {}  # {(section, key): value} used only where nothing else gives it

    def world(self, merged: dict) -> int | None:
        """Megatron's world size, nodes x GPUs per node of the merged overrides, when the pasted
        launcher gave the GPUs (d is then derived as Megatron does); else None."""
        if not self.launcher_world or _NODES not in merged or _GPUS not in merged:
            return None
        return merged[_NODES] * merged[_GPUS]

    def completed(self, path, merged: dict) -> dict:
        """`merged` with each fallback value whose key neither it nor the scenario file sets."""
        if not self.fallback:
            return merged
        in_file = read_toml(path) if path else {}
        return {**{(section, key): value for (section, key), value in self.fallback.items()
                   if key not in in_file.get(section, {})}, **merged}

    def load(self, path, merged: dict, world: int):
        """load_scenario with the launcher's world; a world that does not fit names it."""
        try:
            return load_scenario(path, merged, world)
        except UserError as exc:
            if exc.field != "--world-size":
                raise
            raise UserError("--megatron-args", f"--nnodes {merged[_NODES]} x --nproc_per_node "
                            f"{merged[_GPUS]} = {exc.reason} (give --nodes or --world-size on "
                            "simsp's command line to change the GPUs)") from None


def outside_overrides(args) -> Pasted:
    """The Hugging Face config's [model] overrides, then the launch line's (which win); the
    launch line's ignored flags are named in one note line on stderr."""
    overrides, fallback = {}, {}
    path = getattr(args, "hf_config", None)
    if path is not None:
        from simsp.scenario.hf_config import hf_overrides
        overrides, fallback = hf_overrides(path)
    text = read_launch_text(args)
    if text is None:
        return Pasted(overrides, False, fallback)
    named_by = getattr(args, "megatron_args_file", None)
    if named_by is not None and getattr(args, "scenario", None) is None:
        fallback[("run", "name")] = Path(named_by).stem  # the report names the launch file
    line = parse_launch_line(text)
    note = line.note()
    if note:
        sys.stderr.write(note + "\n")
    overrides.update(line.overrides)
    return Pasted(overrides, _NODES in line.overrides or _GPUS in line.overrides, fallback)


def scenario_from_args(args) -> Scenario:
    """Load the scenario file (if any) and apply, in this order, the Hugging Face config, the
    pasted launch line and the command-line overrides (each later one wins)."""
    given = overrides_from_args(args)
    pasted = outside_overrides(args)
    overrides = pasted.completed(getattr(args, "scenario", None), {**pasted.overrides, **given})
    world = getattr(args, "world_size", None)
    if world is None and ("parallel", "data_parallel_size") not in given:
        world = pasted.world(overrides)
        if world is not None:
            return pasted.load(getattr(args, "scenario", None), overrides, world)
    return load_scenario(getattr(args, "scenario", None), overrides, world)
