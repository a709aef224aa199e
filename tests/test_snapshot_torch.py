"""simsp's snapshot file read by PyTorch's own reader, `torch.cuda._memory_viz` (it needs no GPU):
its statistics, trace listing, flame-graph input and HTML plots, and its command line, on a
replay worked by hand (tests/test_allocator.py's fragmentation case). Skipped where torch is not
installed."""

import base64
import json
import pickle
import re
import subprocess
import sys

import pytest

from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.replay import Alloc, Free, replay
from simsp.engine.allocator.snapshot import Site, build_snapshot, write_snapshot

memory_viz = pytest.importorskip("torch.cuda._memory_viz")

MiB, GiB = 1 << 20, 1 << 30
A = Site(("decoder", "layers.0", "mlp", "linear_fc1"), "activations")
EVENTS = [Alloc("a1", 6 * MiB, context=A), Alloc("a2", 6 * MiB, context=A), Alloc("a3", 6 * MiB),
          Free("a2"), Alloc("b", 7 * MiB, context=A)]


@pytest.fixture(params=[False, True], ids=["segments", "expandable"])
def dumped(request, tmp_path):
    """The fragmentation case written to a file, and the dict PyTorch's pickle.load reads."""
    config = AllocatorConfig(80 * GiB, expandable_segments=request.param)
    path = tmp_path / "snapshot.pickle"
    write_snapshot(path, build_snapshot(replay(EVENTS, config, record_trace=True).allocator))
    with open(path, "rb") as source:
        return path, pickle.load(source)


def test_segsum_accounts_for_every_byte(dumped):
    # 40 MiB reserved either way (two 20 MiB segments, or one segment of two 20 MiB pages);
    # 19 MiB requested by the live a1, a3, b; 21 MiB free, none of it rounding.
    _, data = dumped
    summary = memory_viz.segsum(data)
    assert "total_reserved: 40.0MiB" in summary
    assert "total_allocated: 19.0MiB" in summary
    assert "total_free: 21.0MiB (0.0% internal)" in summary


def test_trace_lists_the_allocator_actions(dumped):
    # 8 entries: a segment, a1 a2 a3 at offsets 0, 6 and 12 MiB, a2's free (requested, completed),
    # a second segment (or page) and b, at the start of the new segment or 18 MiB into the one
    # expandable segment. trace() names segment_alloc only; a segment_map it prints as a dict.
    _, data = dumped
    listing = memory_viz.trace(data).splitlines()
    assert listing[1] == "8 entries"
    if data["allocator_settings"]["expandable_segments"]:
        assert listing[2].startswith("{'action': 'segment_map'")
        assert listing[-2] == "d = seg_0[18874368:7.0MiB]"
        return
    first, second = (s["address"] for s in data["segments"])
    assert listing[2:-1] == [f"a = cudaMalloc({first}, 20.0MiB)", "b = a[0:6.0MiB]",
                             "c = a[6291456:6.0MiB]", "d = a[12582912:6.0MiB]", "del c # 6.0MiB",
                             "# free completed for c 6.0MiB", f"e = cudaMalloc({second}, 20.0MiB)",
                             "f = e[0:7.0MiB]"]


def test_flamegraph_lines_cover_the_segments(dumped):
    # segments() writes one "stack size" line per block piece; its sizes add up to reserved.
    _, data = dumped
    lines = memory_viz.segments(data, format_flamegraph=lambda text: text).splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == 40 * MiB
    assert any("active_allocated" in line and "activations:0:linear_fc1" in line for line in lines)
    per_stack = memory_viz.memory(data, format_flamegraph=lambda text: text)
    assert sum(int(line.rsplit(" ", 1)[1]) for line in per_stack.splitlines()) == 40 * MiB


@pytest.mark.parametrize("plot", ["trace_plot", "segment_plot"])
def test_html_plots_embed_the_snapshot(dumped, plot):
    _, data = dumped
    html = getattr(memory_viz, plot)(data)
    files = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))
    assert pickle.loads(base64.b64decode(files[0]["base64"]).rstrip(b"\x00")) == data


def test_the_command_line_reads_the_file(dumped, tmp_path):
    path, _ = dumped
    stats = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
                           capture_output=True, text=True, check=True)
    assert "total_reserved: 40.0MiB" in stats.stdout
    html = tmp_path / "trace.html"
    subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o",
                    str(html)], capture_output=True, check=True)
    assert "Active Memory Timeline" in html.read_text()
