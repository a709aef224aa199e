"""A pipelined GEMM+RS from an FP8 userbuffer moves FP8 (model/base/tp_overlap.py
rs_wire_bytes): TE 1.8 allocates the buffer uint8 under FP8 with the GEMM's fp8_buf
(module/base.py initialize_ub) and reduces it with reducescatter2_userbuff_stridedoutput_fp8
(csrc/comm_gemm_overlap.h split_overlap_rs), which reads the peers' 1-byte chunks."""

import pytest

from simsp.scenario.loading import load_scenario
from simsp.scenario.precision import precision_of
from tests.test_tp_overlap import run_pipelined_rs

H100_FP8 = {("cluster", "gpu"): "h100-sxm-80gb", ("parallel", "fp8_format"): "hybrid",
            ("run", "mode"): "meta"}


def _pipelined_rs(fp8: bool, fp8_buf: bool):
    """(bytes of each RS piece, reduce-scatter bytes counted) of a t 2 proj_fprop in 4 splits."""
    recipe = precision_of(load_scenario("scenarios/tiny.toml", H100_FP8)).fp8 if fp8 else None
    _end, r, comm = run_pipelined_rs(1e-6, fp8=recipe, fp8_buf=fp8_buf)
    counted = sum(v for (_, kind), v in r.comm_bytes.items() if kind == "reduce_scatter")
    return {call[2] for call in comm.calls}, counted


@pytest.mark.parametrize("fp8, fp8_buf, elem", [(True, True, 1), (True, False, 2),
                                                (False, True, 2)])
def test_rs_pieces_by_hand(fp8, fp8_buf, elem):
    # (4096 x 6144) partial sums in 4 column pieces, each reduce-scattered at `elem` bytes per
    # element: FP8 only when the buffer is (FP8 training and fp8_buf); the rank sends
    # (t - 1)/t = 1/2 of the whole
    pieces, counted = _pipelined_rs(fp8, fp8_buf)
    assert pieces == {4096 * 6144 * elem // 4}
    assert counted == 4096 * 6144 * elem // 2
