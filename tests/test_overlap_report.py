"""Overlaps named in the trace and the report (report/run/trace/overlaps.py,
report/run/overlap_summary.py, docs/overlaps.md): hand-worked intervals, a brute-force oracle,
and one run's trace."""

import json

from hypothesis import given, settings, strategies as st
import pytest

from simsp.engine.trace import Span
from simsp.report.run.overlap_summary import overlap_lines
from simsp.report.run.trace.overlaps import annotate


def _compute(name, start, end, rank=0):
    return Span(rank, "compute", name, start, end, {})


def _comm(start, end, rank=0, track="tp_comm"):
    return Span(rank, track, "all_gather x", start, end, {"bytes": 8})


def test_hidden_seconds_and_kernels_by_hand():
    """Kernels [0,2) and [1,3) overlap (busy [0,3)), then [5,6): a transfer over [2.5, 5.5)
    ran 0.5 s beside the first pair and 0.5 s beside the last kernel."""
    kernels = [_compute("a", 0.0, 2.0), _compute("b", 1.0, 3.0), _compute("c", 5.0, 6.0)]
    spans = kernels + [_comm(2.5, 5.5), _comm(3.0, 5.0), _comm(-1.0, 0.5),
                       _comm(2.5, 5.5, rank=1)]
    out = annotate(spans)
    assert out[:3] == kernels  # compute spans unchanged
    assert out[3].args == {"bytes": 8, "hidden_s": pytest.approx(1.0, abs=1e-15),
                           "behind": "b … c"}
    assert out[4].args["hidden_s"] == 0.0 and out[4].args["behind"] == ""
    assert out[5].args["hidden_s"] == pytest.approx(0.5, abs=1e-15)
    assert out[5].args["behind"] == "a"
    assert out[6].args == {"bytes": 8}  # rank 1 has no compute spans: left as recorded


def _brute_hidden(kernels, start, end):
    """Length of [start, end) covered by the union of kernels, by sweeping sorted edges."""
    edges = sorted({start, end, *(t for k in kernels for t in (k.start_s, k.end_s))})
    covered = 0.0
    for lo, hi in zip(edges, edges[1:]):
        mid = (lo + hi) / 2
        if start <= mid < end and any(k.start_s <= mid < k.end_s for k in kernels):
            covered += hi - lo
    return covered


_interval = st.tuples(st.integers(0, 40), st.integers(1, 10)).map(
    lambda p: (p[0] / 4, (p[0] + p[1]) / 4))


@settings(max_examples=150, deadline=None)
@given(st.lists(_interval, min_size=1, max_size=12), st.lists(_interval, min_size=1, max_size=6))
def test_hidden_equals_brute_force(kernels, transfers):
    """For any kernels (overlapping or not) and transfers, hidden_s is the covered length."""
    compute = [_compute(f"k{i}", s, e) for i, (s, e) in enumerate(kernels)]
    comm = [_comm(s, e) for s, e in transfers]
    out = annotate(compute + comm)[len(compute):]
    for span, (s, e) in zip(out, transfers):
        assert span.args["hidden_s"] == pytest.approx(_brute_hidden(compute, s, e), abs=1e-12)
        assert (span.args["behind"] == "") == (span.args["hidden_s"] == 0)


def _metrics(**extra):
    return {"exposed_s_per_stage": [{}, {}], **extra}


def test_report_rows_from_the_overlap_metrics():
    """One row per overlapped kind and stage; hidden = comm − exposed; nothing overlapped: no
    section."""
    assert overlap_lines(_metrics()) == []
    dp = [{"reduce": {"comm_s": 2e-3, "exposed_s": 5e-4, "hidden_s": 1.5e-3}}, {}]
    tp = [{}, {"bulk": {"comm_s": 3e-3, "exposed_s": 1e-3, "hidden_s": 2e-3}}]
    unit = {"all_gather_s": 1e-3, "all_gather_exposed_s": 0.0, "reduce_s": 4e-3,
            "reduce_exposed_s": 1e-3}
    fsdp = {"units_per_stage": [{"u0": unit, "u1": unit}, {}]}
    text = "\n".join(overlap_lines(_metrics(dp_overlap_per_stage=dp,
                                            tp_overlap_per_stage=tp, fsdp=fsdp)))
    assert "| 0 | DP gradient reduction (--overlap-grad-reduce) | the backward of the layers " \
           "after the bucket's | 2.000 ms | 500.000 us | 1.500 ms |" in text
    assert "| 1 | TP bulk collective (--tp-comm-overlap) | the other backward GEMM (dgrad " \
           "beside wgrad) | 3.000 ms | 1.000 ms | 2.000 ms |" in text
    assert "| 0 | FSDP gradient reductions | the next unit's backward | 8.000 ms | 2.000 ms | " \
           "6.000 ms |" in text
    assert text.count("\n| 0 |") == 3 and text.count("\n| 1 |") == 1


def test_a_full_trace_names_what_hid_each_transfer(tmp_path):
    """tiny with the TP overlap: every communication span of the trace carries hidden_s within
    [0, its duration], and the ring exchange ran behind its GEMM's pieces."""
    from simsp.cli import main
    out = tmp_path / "run"
    assert main(["run", "scenarios/tiny.toml", "--mode", "meta", "--tp-comm-overlap",
                 "--trace", "full", "--out", str(out), "--quiet"]) in (0, None)
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    comm = [e for e in events if e.get("ph") == "X" and e["cat"].endswith("_comm")]
    assert comm and all(0 <= e["args"]["hidden_s"] * 1e6 <= e["dur"] + 1e-3 for e in comm)
    ring = [e for e in comm if e["name"] == "ring_exchange qkv_enter"]
    assert ring and all(e["args"]["behind"].startswith("qkv#") for e in ring)
    assert "## Overlaps" in (out / "summary.md").read_text()
