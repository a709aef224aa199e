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
nodes NCCL uses NVLS_TREE (by default) or CollNet (a run's DP groups under --use-sharp):
engine/collectives/collnet.py; `simsp ring` does not run them.
"""

from simsp.engine.collectives import nccl_tuning as tuning
from simsp.hardware.constants import NVLS_NVSWITCH_GENERATION
from simsp.units import GB

# The GPU's NVLink generation -> NCCL's compute-capability row (tuning.cc compCapIndex):
# NVLink 4 is Hopper's, NVLink 5 Blackwell's; NVLink 3 (Ampere) has no NVLS (0 in tuning.cc).
COMPCAP = {4: tuning.HOPPER, 5: tuning.BLACKWELL}
NVLS_EFFICIENCY = {gen: tuning.NVLS_EFFICIENCY[cc] for gen, cc in COMPCAP.items()}
# tuning.cc hwLatencies[NCCL_HW_NVLINK][NCCL_ALGO_NVLS][NCCL_PROTO_SIMPLE]
NVLS_LATENCY_S = tuning.SHARP_HW_LATENCY_US[tuning.NVLINK][tuning.NVLS] * 1e-6
# One NVLink's bandwidth per direction: NVLink 4 25 GB/s (H100 datasheet: 18 links, 900 GB/s
# both ways), NVLink 5 50 GB/s (B200 datasheet: 18 links, 1.8 TB/s both ways)
NVLINK_LINK_GBPS = {4: 25.0, 5: 50.0}
MIN_NVSWITCH_GENERATION = NVLS_NVSWITCH_GENERATION
NVLS = "nvls"


def nvls_available(nvswitch_generation: int, nvlink_generation: int, nodes: int) -> str | None:
    """Why NVLS cannot run here, or None: it needs NVSwitch 3+ and one NVLink domain."""
    if nvswitch_generation < MIN_NVSWITCH_GENERATION or nvlink_generation not in NVLS_EFFICIENCY:
        return (f"NVLS (NVLink SHARP) needs an NVSwitch-3 or later system (H100 and later); "
                f"this one has NVSwitch {nvswitch_generation}")
    if nodes != 1:
        return (f"NVLS runs inside one NVLink domain; {nodes} nodes need NVLS_TREE or CollNet, "
                f"which simsp ring does not run (a run's all-reduces do)")
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
                  calibration, other_estimate_us: float) -> float | None:
    """NVLS's seconds for this all-reduce where NCCL would run it as NVLS, else None: the
    system can (calibration.nvls_nvlink_generation, set from its NVSwitch; NCCL_NVLS_ENABLE's
    default), NCCL_ALGO and NCCL_PROTO leave the choice open (NVLS runs Simple), the group is one
    NVLink domain (multi-node NVLS needs CollNet, off by default: tuning.cc), and NCCL's own
    estimate of NVLS (nccl_tuning.sharp_choice on its NVLS graph) beats its estimate of the ring
    or tree it would otherwise run (`other_estimate_us`): NCCL takes the lowest predicted time
    (NVIDIA/nccl src/enqueue.cc topoGetAlgoInfo). The time itself is simsp's, over its links."""
    generation = calibration.nvls_nvlink_generation
    nodes = len({gpu // gpus_per_node for gpu in gpus})
    if (generation not in NVLS_EFFICIENCY or calibration.nccl_algo is not None
            or calibration.nccl_proto not in (None, "Simple") or len(gpus) < 2
            or not tuning.sharp_enabled(tuning.NVLS, nodes, True, False, True)):
        return None
    compcap, n = COMPCAP[generation], len(gpus)
    graph = tuning.nvls_graph(n, round(nvlink_GBps / NVLINK_LINK_GBPS[generation]), compcap)
    if tuning.sharp_choice(tuning.ALL_REDUCE, nbytes, n, 1, {tuning.NVLS: graph}, compcap,
                           {tuning.NVLS: True}, other_estimate_us) != tuning.NVLS:
        return None
    return nvls_all_reduce_time(nbytes, n, nvlink_GBps, calibration.nvlink_efficiency,
                                generation)
