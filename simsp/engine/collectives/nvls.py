"""NCCL's NVLS all-reduce (NVLink SHARP): the NVSwitch reduces and multicasts, timed in closed form.

On NVSwitch-3 and later systems (DGX H100/H200, DGX B200, GB200 NVL72) NCCL can run an
all-reduce inside one NVLink domain as NVLS (NVIDIA/nccl src/device/all_reduce.h,
RunWorkColl<ncclFuncAllReduce, ..., NCCL_ALGO_NVLS, ...>): each GPU heads 1/n of the buffer, pulls
that slice reduced by the switch (multimem ld_reduce: the switch reads it from all n GPUs) and
stores the result once to the multicast address (the switch writes it to all n GPUs). Each
GPU's NVLink therefore carries S (its slices, read by the switch) + S/n (its stored result) out
and S/n + S in: S(1 + 1/n) each way, against the ring's 2(n - 1)/n S. The switch's reduction
runs below link speed: NCCL's own model scales NVLS bandwidth by nvlsEfficiency (0.85 Hopper,
0.74 Blackwell) and charges 25 us of NVLink latency (NVIDIA/nccl src/graph/tuning.cc,
nvlsEfficiency and hwLatencies[NVLINK][NVLS][SIMPLE]). Single NVLink domain only: across
nodes NCCL uses NVLS_TREE or CollNet, which simsp does not model.
"""

from simsp.hardware.constants import NVLS_NVSWITCH_GENERATION
from simsp.units import GB

# NVIDIA/nccl src/graph/tuning.cc nvlsEfficiency per compute capability, keyed here by the GPU's
# NVLink generation (4: Hopper, 5: Blackwell); NVLink 3 (Ampere) has no NVLS (0 in tuning.cc).
NVLS_EFFICIENCY = {4: 0.85, 5: 0.74}
NVLS_LATENCY_S = 25e-6  # tuning.cc hwLatencies[NCCL_HW_NVLINK][NCCL_ALGO_NVLS][NCCL_PROTO_SIMPLE]
MIN_NVSWITCH_GENERATION = NVLS_NVSWITCH_GENERATION
NVLS = "nvls"


def nvls_available(nvswitch_generation: int, nvlink_generation: int, nodes: int) -> str | None:
    """Why NVLS cannot run here, or None: it needs NVSwitch 3+ and one NVLink domain."""
    if nvswitch_generation < MIN_NVSWITCH_GENERATION or nvlink_generation not in NVLS_EFFICIENCY:
        return (f"NVLS (NVLink SHARP) needs an NVSwitch-3 or later system (H100 and later); "
                f"this one has NVSwitch {nvswitch_generation}")
    if nodes != 1:
        return (f"NVLS runs inside one NVLink domain; {nodes} nodes need NVLS_TREE or CollNet, "
                f"which simsp does not model")
    return None


def nvls_bytes_per_direction(nbytes: int, ranks: int) -> float:
    """Bytes each GPU moves over its NVLink each way: S (its slices, read by the switch's
    reduction) + S/n (its reduced slice, multicast once)."""
    return nbytes * (1 + 1 / ranks)


def nvls_all_reduce_time(nbytes: int, ranks: int, nvlink_GBps: float, link_efficiency: float,
                         nvlink_generation: int) -> float:
    """Seconds for an NVLS all-reduce of `nbytes` over `ranks` GPUs of one NVLink domain: NCCL's
    NVLS latency plus S(1 + 1/n) at the achieved link rate times NCCL's nvlsEfficiency."""
    rate_Bps = nvlink_GBps * GB * link_efficiency * NVLS_EFFICIENCY[nvlink_generation]
    return NVLS_LATENCY_S + nvls_bytes_per_direction(nbytes, ranks) / rate_Bps


def nvls_in_group(gpus: tuple[int, ...], nbytes: int, gpus_per_node: int, nvlink_GBps: float,
                  calibration, other_time_s: float) -> float | None:
    """NVLS's seconds for this all-reduce where NCCL would run it as NVLS, else None: the
    system can (calibration.nvls_nvlink_generation, set from its NVSwitch), NCCL_ALGO and
    NCCL_PROTO leave the choice open (NVLS runs Simple), the group is one NVLink domain, and
    NVLS beats the ring or tree NCCL would otherwise run (`other_time_s`): NCCL takes the
    lowest predicted time (NVIDIA/nccl src/enqueue.cc topoGetAlgoInfo)."""
    generation = calibration.nvls_nvlink_generation
    if (generation not in NVLS_EFFICIENCY or calibration.nccl_algo is not None
            or calibration.nccl_proto not in (None, "Simple") or len(gpus) < 2
            or len({gpu // gpus_per_node for gpu in gpus}) != 1):
        return None
    seconds = nvls_all_reduce_time(nbytes, len(gpus), nvlink_GBps,
                                   calibration.nvlink_efficiency, generation)
    return seconds if seconds < other_time_s else None
