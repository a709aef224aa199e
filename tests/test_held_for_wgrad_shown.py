"""The held_for_wgrad category in the human run report (report/run/shown_categories.py): its
column, sentence, glossary term, legend entries and areas appear only where some rank holds
bytes in it, so a 1F1B report reads as before the category existed (the bundled reports stay
byte-identical); metrics.json keeps the key with 0.

Runs: the default dense test model, one layer a stage, PP 4, m 8, meta mode (as in
test_wgrad_held_memory.py, whose hand counts these reuse): under ZB-H1 stage r holds r + 1
pending Ws of 65536 B each; under 1F1B the backward is whole and nothing is held."""

import pytest
from test_wgrad_held_memory import PER_MICRO_BATCH, one_layer_stages

from simsp.metrics.collect import collect
from simsp.report.run.memory_summary import oom_categories
from simsp.report.run.report_html import glossary_html
from simsp.report.run.shown_categories import shown_categories
from simsp.report.run.summary_md import summary_document
from simsp.training.driver.iteration import Shortcuts, simulate_iteration

pytest.importorskip("matplotlib")
from simsp.report.run.figures.bars import memory_at_peak_columns, stage_memory_rows  # noqa: E402
from simsp.report.run.figures.inputs import memory_figures_of  # noqa: E402
from simsp.report.run.figures.memory import (plot_legend_handles, stage_polygons,  # noqa: E402
                                             stages_legend_handles)

BEFORE = ["weights", "gradients", "optimizer", "activations", "temporaries", "communication"]
WITH_HELD = BEFORE[:5] + ["held_for_wgrad"] + BEFORE[5:]
BEFORE_COLUMNS = ["stage", "rank", "weights (MiB)", "gradients (MiB)", "optimizer (MiB)",
                  "activations (peak) (MiB)", "temporaries (MiB)", "communication (MiB)",
                  "peak total (MiB)", "verdict"]  # summary.md's memory table before the category
TERM = "held for wgrad (held_for_wgrad)"


@pytest.fixture(scope="module", params=["1f1b", "zb-h1"])
def finished(request):
    """(schedule, run, metrics) of the one-layer-stage model, PP 4, m 8."""
    shortcuts = Shortcuts()
    run = simulate_iteration(one_layer_stages(4, request.param, 8), shortcuts, trace="none")
    return request.param, run, collect(run, shortcuts)


def memory_table(text: str) -> list[list[str]]:
    """summary.md's memory table as rows of cells (the header first, no alignment row)."""
    lines = text.split("\n")
    start = lines.index("## Memory per pipeline stage (rank tp 0, dp 0)")
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return [rows[0]] + rows[2:]


def test_metrics_keep_the_key_whatever_the_schedule(finished):
    """The JSON's key set is fixed: held_for_wgrad on every rank, 0 under 1F1B; under ZB-H1
    stage r < 3 holds r + 1 Ws' worth (the last stage's also holds its output layer's)."""
    schedule, _, metrics = finished
    held = [r["peak_by_category_bytes"]["held_for_wgrad"] for r in metrics["ranks"]]
    if schedule == "1f1b":
        assert held == [0] * 4
    else:
        assert held[:3] == [(r + 1) * PER_MICRO_BATCH for r in range(3)] and held[3] > 0


def test_summary_column_sentence_and_glossary(finished):
    """1F1B: the memory table's columns, its sentence and the glossary as before the category;
    ZB-H1: the column between temporaries and communication holding stage r's (r + 1) × 65536 B
    (0.125 MiB and 0.1875 MiB, two decimals, the exact half to even), sentence and term."""
    schedule, _, metrics = finished
    text = summary_document(metrics)
    header, *rows = memory_table(text)
    if schedule == "1f1b":
        assert header == BEFORE_COLUMNS
        assert "held for wgrad" not in text.lower() and TERM not in glossary_html(metrics)
        return
    assert header == BEFORE_COLUMNS[:7] + ["held for wgrad (MiB)"] + BEFORE_COLUMNS[7:]
    assert [row[7] for row in rows[1:3]] == ["0.12", "0.19"]
    assert "Held for wgrad: the linear inputs" in text
    assert f"**{TERM}**" in text and f"<dt>{TERM}</dt>" in glossary_html(metrics)


def test_figure_legends_and_areas(finished):
    """memory_stages.png, memory.png and memory_at_peak.png draw and name the categories the
    summary shows: six under 1F1B (the legend as before: six swatches and the capacity line),
    seven under ZB-H1."""
    schedule, run, metrics = finished
    expected = BEFORE if schedule == "1f1b" else WITH_HELD
    inputs = memory_figures_of(run, "")
    assert list(inputs.categories) == expected
    labels = [h.get_label() for h in stages_legend_handles(inputs.categories)]
    assert labels == expected + ["capacity"]
    assert [h.get_label() for h in plot_legend_handles(inputs.categories, [])] == expected
    polygons = stage_polygons(inputs.memory[1], inputs.end_s, 1.0, inputs.columns())
    assert polygons.shape[0] == len(expected)
    bars = memory_at_peak_columns(metrics, stage_memory_rows(metrics), 1)
    assert [name for name, _, _ in bars] == expected


def test_out_of_memory_table_leaves_out_a_category_not_shown():
    """The out-of-memory table's columns (largest first) are the shown categories: a held 0
    from an explanation whose run held nothing is left out; one that held some is kept."""
    in_use = {"activations": 3 << 30, "weights": 1 << 30, "communication": 0,
              "held_for_wgrad": 0, "temporaries": 0}
    failing = [{"pp": 0, "peak_bytes": 5 << 30,
                "oom_detail": {"op": "fc1", "tensor": "x", "bytes_asked": 1 << 30}}]
    explained = {0: {"stage": 0, "in_use_by_category_bytes": in_use}}
    for peaks, header in (({"held_for_wgrad": 0}, ["activations", "weights", "communication",
                                                   "temporaries"]),
                          ({"held_for_wgrad": 1}, ["activations", "weights", "communication",
                                                   "held_for_wgrad", "temporaries"])):
        lines = oom_categories(failing, explained, shown_categories([peaks]))
        columns = [c.strip() for c in lines[2].strip("|").split("|")][3:]
        assert columns == [f"{c} (GiB)" for c in header]
