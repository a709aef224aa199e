"""trace.json colours each schedule step by its kind (F, B, W, F&B pair) with the trace viewer's
`cname`, in the order the schedule runs them; the timeline figure draws the pairs apart."""

import json
import os

import pytest

from simsp.report.run.figures.schedule import stage_intervals
from simsp.report.run.trace.writer import write_chrome_trace
from simsp.scenario.loading import load_scenario
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "scenarios", "tiny.toml")  # p 2, m 4, t 2 + SP, d 2
# The viewer's reserved colour names (catapult tracing/base/color_scheme.html), by kind.
COLOUR = {"F": "rail_response", "B": "rail_load", "W": "heap_dump_child_node_arrow",
          "F&B": "cq_build_failed"}


def schedule_events(schedule: str, tmp_path) -> tuple:
    """(the run, {rank: [(step name, cname)] of its schedule thread in time order})."""
    sc = load_scenario(TINY, {("parallel", "schedule"): schedule})
    run = simulate_iteration(sc, Shortcuts(), trace="steps")
    doc = json.loads(write_chrome_trace(run, tmp_path / "trace.json", "steps").read_text())
    events = doc["traceEvents"]
    thread = {(e["pid"], e["tid"]) for e in events
              if e.get("name") == "thread_name" and e["args"]["name"] == "schedule"}
    steps = {}
    for e in sorted((e for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) in thread),
                    key=lambda e: e["ts"]):
        steps.setdefault(e["pid"], []).append((e["name"], e.get("cname")))
    return run, steps


def test_zb_h1_steps_are_coloured_by_kind_in_the_schedules_order(tmp_path):
    """ZB-H1 on p = 2, m = 4 (ZB §2, docs/schedules.md): stage r runs p − r forwards, then each
    B followed by the next F, and W of micro-batch i right after B of i + r. Stage 0:
    F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3; stage 1: F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3."""
    run, steps = schedule_events("zb-h1", tmp_path)
    order = {0: "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3".split(),
             1: "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3".split()}
    grid = run.inputs.world.grid
    assert len(steps) == len(run.inputs.world.ranks)
    for rank, seen in steps.items():
        expected = order[grid.coords(rank).pp]
        assert [name for name, _ in seen] == [f"{step}.0" for step in expected]
        assert [cname for _, cname in seen] == [COLOUR[step[0]] for step in expected]


def test_dualpipev_pairs_get_their_own_colour(tmp_path):
    """DualPipeV on 2 ranks, m = 4 (docs/dualpipe.md's eight steps, (n, h, c) = (2, r, 4)):
    rank 0 runs step 4 once (c − 2n + h + 1 = 1: two F&B pairs) and step 5 once (one pair);
    rank 1, the middle rank, runs step 4 twice but its first F0 and B1 apart: three pairs on
    each, each pair an F, a B and a W (a pair's backward is a full one): 9 F&B steps of 24
    (2m F, 2m B, 2m W), so 5 of each other kind. A pair's W whose GEMMs all ran beside its
    B's TP collectives (comm_stream.py: DeepSeek-V3 Figure 4's MLP(W), ATTN(W)) is empty and
    not drawn."""
    run, steps = schedule_events("dualpipev", tmp_path)
    for rank, seen in steps.items():
        cnames = [cname for _, cname in seen]
        empty = sum(1 for kind, _, _, begin, end in run.results.steps[rank]
                    if kind == "W" and end == begin)
        assert len(cnames) == 24 - empty
        assert [cnames.count(COLOUR[k]) for k in ("F", "B", "W", "F&B")] == [5, 5, 5, 9 - empty]
        bars = stage_intervals(run, rank, [])
        assert [len(bars[kind]) for kind in ("forward", "backward", "weight gradient",
                                             "F&B pair")] == [5, 5, 5, 9]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_plain_schedules_have_f_and_b_only(schedule, tmp_path):
    """A backward not split is one B step: the trace has F and B colours only, m of each."""
    _, steps = schedule_events(schedule, tmp_path)
    for seen in steps.values():
        cnames = [cname for _, cname in seen]
        assert sorted(set(cnames)) == sorted({COLOUR["F"], COLOUR["B"]})
        assert cnames.count(COLOUR["F"]) == cnames.count(COLOUR["B"]) == 4
