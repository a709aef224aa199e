"""Fuzzing the surfaces round 3 added (MoE, MLA, MTP, CP, FSDP and offload, FP8) through the real
command line, in-process: random values of each surface's flags, good and bad, on a small
Llama-style model in meta mode. Whatever the input: no traceback; exit 0 with strict JSON, or
exit 2 with exactly one `error:` line; nothing written anywhere (`--json` alone writes no
files). A hang would stop the suite here; the work estimate refuses what would take long."""

import os
from pathlib import Path
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from inprocess import cli
from test_fuzz_cli import check_outcome

BASE = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--vocab-size", "96", "--swiglu", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--disable-bias-linear", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--mode", "meta", "--micro-batch-size", "1"]
BAD_INTS = st.sampled_from(["0", "3", "16", "31", "32", "-1", "4097", "1e3", "nan", "",
                            "10000000000000000000000"])
INTS = st.one_of(st.sampled_from(["1", "2", "2", "4"]), st.sampled_from(["1", "2", "4", "8"]),
                 BAD_INTS)  # two draws in three valid-looking
FLOATS = st.sampled_from(["0", "0.01", "0.5", "1", "1.5", "-0.1", "nan", "inf", "1e-300", "x"])
PATTERNS = st.sampled_from(["1", "2", "[1,0,1,0]", "([1]*2+[0]*2)", "([1]*3+[0]*1)*3",
                            "[1]*999999999999", "(" * 200 + "[1]" + ")" * 200, "[2,0]", "[1",
                            "__import__('os')", "[1]*4", "([0]*1+[1]*1)*2"])
SURFACES = {
    "moe": [("--num-experts", INTS), ("--moe-router-topk", INTS), ("--moe-ffn-hidden-size", INTS),
            ("--moe-layer-freq", PATTERNS), ("--expert-model-parallel-size", INTS),
            ("--expert-tensor-parallel-size", INTS), ("--moe-expert-capacity-factor", FLOATS),
            ("--moe-token-dispatcher-type", st.sampled_from(["alltoall", "allgather", "flex"])),
            ("--moe-shared-expert-intermediate-size", INTS), ("--moe-routing-imbalance", FLOATS),
            ("--moe-aux-loss-coeff", FLOATS), ("--data-parallel-size", INTS)],
    "mla": [("--multi-latent-attention", None), ("--q-lora-rank", INTS),
            ("--kv-lora-rank", INTS), ("--qk-head-dim", INTS), ("--qk-pos-emb-head-dim", INTS),
            ("--v-head-dim", INTS), ("--tensor-model-parallel-size", INTS),
            ("--sequence-parallel", None)],
    "mtp": [("--mtp-num-layers", INTS), ("--mtp-loss-scaling-factor", FLOATS),
            ("--pipeline-model-parallel-size", INTS), ("--global-batch-size", INTS)],
    "cp": [("--context-parallel-size", INTS),
           ("--cp-comm-type", st.sampled_from(["p2p", "a2a", "allgather", "a2a+p2p", "ring"])),
           ("--hierarchical-context-parallel-sizes", st.sampled_from(["2 2", "1 2", "3", "",
                                                                       "2 x"])),
           ("--tensor-model-parallel-size", INTS), ("--nodes", INTS)],
    "fsdp": [("--use-torch-fsdp2", None), ("--use-megatron-fsdp", None),
             ("--data-parallel-sharding-strategy",
              st.sampled_from(["no_shard", "optim", "optim_grads", "optim_grads_params", "x"])),
             ("--data-parallel-size", INTS), ("--cpu-offloading", None),
             ("--cpu-offloading-num-layers", INTS), ("--use-distributed-optimizer", None)],
    "fp8": [("--fp8-format", st.sampled_from(["e4m3", "hybrid", "e5m2", ""])),
            ("--fp8-recipe", st.sampled_from(["delayed", "tensorwise", "blockwise", "mxfp8", "x"])),
            ("--fp8-param-gather", None), ("--gpu", st.sampled_from(["h100-sxm-80gb", "b200",
                                                                    "a100-sxm-80gb"]))],
}


# the flag that turns each surface on, given in most examples so the others are not refused
ANCHORS = {"moe": ["--num-experts", "4"], "mla": ["--multi-latent-attention"],
           "mtp": ["--mtp-num-layers", "2"], "cp": ["--context-parallel-size", "2"],
           "fsdp": ["--use-torch-fsdp2", "--data-parallel-size", "2"],
           "fp8": ["--fp8-format", "hybrid", "--gpu", "h100-sxm-80gb"]}


@st.composite
def surface_flags(draw, surface: str) -> list[str]:
    """Mostly the surface's anchor, then up to five other flags of the surface, each once with
    a drawn value (switches alone; a repeated flag is its own error, tested elsewhere)."""
    argv = list(ANCHORS[surface]) if draw(st.integers(0, 3)) else []
    others = [row for row in SURFACES[surface] if row[0] not in argv]
    for flag, values in draw(st.lists(st.sampled_from(others), max_size=5,
                                      unique_by=lambda row: row[0])):
        argv += [flag] if values is None else [flag, *draw(values).split(" ")]
    return argv


FUZZ = settings(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_random_surface_flags_never_crash_or_write(surface):
    @FUZZ
    @given(surface_flags(surface))
    def one(argv):
        with tempfile.TemporaryDirectory() as work:
            cwd = os.getcwd()
            os.chdir(work)
            try:
                full = ["run", *BASE, *argv, "--json"]
                rc, out, err = cli(full)
            finally:
                os.chdir(cwd)
            check_outcome(full, True, rc, out, err)
            assert list(Path(work).iterdir()) == [], full
    one()
