"""`simsp schedule`: the pipeline-schedule lesson's table, derivations, JSON, errors, and its page
in headless Chromium. Expected values worked by hand: F = B = W = 1 unit, 4 ranks, 8
micro-batches, so every rank computes 8 x 3 = 24 units and the iteration is 24 + its bubble."""
import json

import pytest
from browser import chromium, page_verdict, screenshot
from inprocess import cli


def test_the_table_sets_each_bubble_beside_its_published_form():
    code, out, _ = cli(["schedule"])
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("1F1B", "ZB-H1", "DualPipe", "DualPipeV")}
    # schedule: stages, iteration, bubble, published bubble, formula, activations, published
    assert rows["1F1B"] == ["1F1B", "4", "33", "9", "9", "(PP-1)(F+B)", "4", "4"]
    assert rows["ZB-H1"] == ["ZB-H1", "4", "27", "3", "3", "(PP-1)(F+B-2W)", "4", "4"]
    assert rows["DualPipe"] == ["DualPipe", "4", "26", "2", "2", "(PP/2-1)(F&B+B-3W)", "5", "5"]
    # 8 stages of half a stage each: F&B 1.5, B 1, W 0.5: (8/2-1)(1.5+1-1.5) = 3
    assert rows["DualPipeV"] == ["DualPipeV", "8", "27", "3", "3", "(PP/2-1)(F&B+B-3W)", "9",
                                 "9"]


def test_explain_derives_each_start():
    code, out, _ = cli(["schedule", "--schedules", "dualpipe", "--explain"])
    assert code == 0
    # rank 1's first forward waits for rank 0's (F = 1 unit)
    assert "F0.0 starts at 1 = max(rank 1 free at 0, F0.0 on rank 0 done at 1), ends at 2" in out
    # rank 0's first pair: F3.0 enters the pipeline, BW5.1 is micro-batch 5's last stage (the
    # reverse direction ends on rank 0) and needs its own F5.1, the op before (4 F, B, W, F)
    assert "F3.0&BW5.1 starts at 7 = max(rank 0 free at 7, F5.1 on this rank done at 7), " \
        "ends at 10" in out
    # rank 1's takes F3.0 and BW5.1's gradient from rank 0's pair, 3 units later
    assert "F3.0&BW5.1 starts at 11 = max(rank 1 free at 11, F3.0&BW5.1 on rank 0 done at 10)" \
        in out


def test_json_and_overlapped_time():
    code, out, _ = cli(["schedule", "--schedules", "dualpipe,1f1b", "--overlapped", "2.5",
                        "--json"])
    data = json.loads(out)
    assert code == 0 and [s["name"] for s in data["schedules"]] == ["dualpipe", "1f1b"]
    assert data["durations"] == {"F": 1.0, "B": 1.0, "W": 1.0, "F&B": 2.5}
    # Table 2 with F&B = 2.5, B = 2, W = 1 on PP 4: (4/2 - 1)(2.5 + 2 - 3) = 1.5
    assert data["schedules"][0]["bubble_published"] == pytest.approx(1.5, abs=1e-12)


@pytest.mark.parametrize("args, field", [
    (["--ranks", "3"], "--ranks"),
    (["--ranks", "40", "--schedules", "1f1b"], "--ranks"),
    (["--micro-batches", "6"], "--micro-batches"),
    (["--schedules", "1f1b,gpipe"], "--schedules"),
    (["--schedules", "1f1b,1f1b"], "--schedules"),
    (["--forward", "-1"], "--forward"),
    (["--overlapped", "nan"], "--overlapped"),
    (["--json", "--explain"], "--json"),
])
def test_flag_errors(args, field):
    code, _, err = cli(["schedule", *args])
    assert code == 2 and err.startswith(f"error: {field}:") and len(err.splitlines()) == 1


def test_schedule_page_steps_in_chromium(tmp_path):
    chromium()
    page = tmp_path / "schedules.html"
    code, _, err = cli(["schedule", "--schedules", "1f1b,zb-h1,dualpipe", "--html", str(page)])
    assert code == 0, err
    verdict, console = page_verdict(page, tmp_path)
    assert console == [] and verdict["errors"] == [] and verdict["svgs"] == 3
    stepping = verdict["stepping"]
    # ops drawn: 1F1B 4 x 16, ZB-H1 4 x 24; DualPipe 8 F + 8 backwards + its W passes (steps
    # 3, 7 and 8 of dualpipe.py: 2n - h - 1 = 3, 2, 2, 3 with n = 2) - 3 pairs per rank
    assert stepping["ops"] == 64 + 96 + (16 + 15 + 15 + 16) and stepping["all_done_at_end"]
    assert stepping["advanced"] and stepping["back"]
    assert stepping["keys_advanced"] and stepping["page_up"] and stepping["space_plays"]
    shot = screenshot(page, tmp_path / "schedules.png", tmp_path, "1400,1200")
    assert len(shot) > 10_000
