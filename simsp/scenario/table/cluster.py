"""The [cluster] and [run] rows of the field table: the GPU and system profiles, the nodes, the
links and their calibration, NCCL's algorithm and protocol; how to execute the run.

The link defaults are the link calibration's (simsp.hardware.constants.LinkCalibration takes
them; `simsp calibrate` fits them; docs/MODEL.md#hardware).
"""

from simsp.scenario.table.parallel import SUPERPOD_SCALE
from simsp.scenario.table.row import Bound, Field, Switch

NCCL_ALGO_CHOICES = ("auto", "ring", "tree")  # NCCL_ALGO (engine/collectives/nccl_tuning.py)
NCCL_PROTO_CHOICES = ("auto", "LL", "LL128", "Simple")  # NCCL_PROTO
MODE_CHOICES = ("numeric", "meta")
DTYPE_CHOICES = ("float64", "float32")

CLUSTER = (
    Field("cluster", "gpu", str, "a100-sxm-80gb", "GPU profile: a100-sxm-40gb, a100-sxm-80gb, "
          "h100-sxm-80gb, h200-sxm-141gb, b200, gb200, or a .toml file (`simsp hardware` lists "
          "them)"),
    # a system profile fills gpu, gpus_per_node and the link speeds
    Field("cluster", "system", str, None, "system profile (sets gpu, GPUs per NVLink domain, link "
          "speeds): dgx-a100, dgx-h100, dgx-h200, dgx-b200, gb200-nvl72, or a .toml file "
          "(default: none, DGX A100-like nodes of the GPU)"),
    Field("cluster", "gpus_per_node", int, 8, "GPUs per node", "gpn", bound=Bound(
        1, 72, "GPUs", "a node is one NVLink domain: 8 in a DGX, 72 in a GB200 NVL72")),
    Field("cluster", "nodes", int, 1, "DGX A100 nodes", "n",
          bound=Bound(1, 4096, "nodes", "32768 GPUs: " + SUPERPOD_SCALE)),
    Field("cluster", "nvlink_bandwidth_GBps", float, 300.0, "NVLink bandwidth per GPU per "
          "direction (GB/s)", "nvbw", bound=Bound(0.1, 10000.0, "GB/s", "A100 NVLink is 300 GB/s")),
    Field("cluster", "ib_bandwidth_GBps", float, 25.0, "InfiniBand bandwidth per NIC per "
          "direction (GB/s)", "ib",  # 200 Gb/s HDR
          bound=Bound(0.01, 10000.0, "GB/s", "HDR InfiniBand is 25 GB/s")),
    # the leaves' oversubscription (downlinks / uplinks) over the system's [fabric] value
    # (hardware/fabric.py; DGX SuperPOD is 1:1)
    Field("cluster", "fabric_oversubscription", float, None, "leaf switches' downlink:uplink "
          "ratio, e.g. 2 for 2:1 (default: the system profile's [fabric], 1:1 as in a DGX "
          "SuperPOD)", "osub", bound=Bound(1.0, 64.0, ":1", "a leaf has at least one uplink "
                                                           "per 64 downlinks; 1 is non-blocking")),
    # Link latencies: point-to-point transfers pay them as they are; a collective's step pays
    # NCCL's own step latency times its route's latency over the route's at these defaults
    # (engine/collectives/nccl_group.py, docs/nccl.md), so `calibrate` fits them on top of NCCL's.
    Field("cluster", "nvlink_latency_us", float, 2.0, "latency per NVSwitch hop (us)", "nvlat",
          bound=Bound(0.0, 1e6, "us", "at most one second per hop")),
    # per InfiniBand link (GPU-NIC-leaf-spine: a cross-rail route has 4)
    Field("cluster", "ib_latency_us", float, 1.0, "latency per InfiniBand link (us)", "iblat",
          bound=Bound(0.0, 1e6, "us", "at most one second per link")),
    # Achieved fractions of link speed. nccl-tests all_reduce on one DGX A100 (8 GPUs, NVSwitch)
    # reports busbw ~230 GB/s for large messages against 300 GB/s of NVLink per GPU per
    # direction: 0.78 x 300 = 234 GB/s.
    Field("cluster", "nvlink_efficiency", float, 0.78, "achieved fraction of NVLink bandwidth, in "
          "(0, 1]", "nveff", bound=Bound(0.0, 1.0, "fraction", "a fraction of link speed")),
    # NCCL over HDR InfiniBand reaches ~22-23 GB/s of a NIC's 25 GB/s (200 Gb/s) per direction.
    Field("cluster", "ib_efficiency", float, 0.90, "achieved fraction of InfiniBand bandwidth, in "
          "(0, 1]", "ibeff", bound=Bound(0.0, 1.0, "fraction", "a fraction of link speed")),
    # Software cost added to every point-to-point transfer (NCCL step synchronisation) on top of
    # the per-hop link latencies. Zero: a collective's steps already pay NCCL's own per-step
    # latencies (tuning.cc), which the link latencies and this overhead scale (docs/nccl.md).
    Field("cluster", "transfer_overhead_us", float, 0.0, "software cost per transfer (us)", "xfer",
          bound=Bound(0.0, 1e6, "us", "at most one second per transfer")),
    # force every collective's algorithm / protocol (docs/nccl.md); auto: NCCL's own choice
    Field("cluster", "nccl_algo", str, "auto", "NCCL algorithm of every collective, as NCCL_ALGO "
          "(auto: NCCL's choice; tree: all-reduces only)", "algo-", choices=NCCL_ALGO_CHOICES),
    Field("cluster", "nccl_proto", str, "auto", "NCCL protocol of every collective, as NCCL_PROTO "
          "(auto: NCCL's choice)", "proto-", choices=NCCL_PROTO_CHOICES),
    # Megatron-LM --use-sharp (core/parallel_state.py: NCCL_COLLNET_ENABLE=1 for the DP-CP groups):
    # their multi-node all-reduces weigh NCCL's CollNet, NVLS and NVLS_TREE (collectives/collnet.py)
    Field("cluster", "use_sharp", bool, False, switches=(
        Switch("--use-sharp", True, "NCCL_COLLNET_ENABLE=1 on a system whose switches have "
               "SHARP: the DP groups' multi-node all-reduces as NCCL picks among ring, tree, "
               "CollNet, NVLS and NVLS_TREE (docs/nccl.md)", "sharp"),)),
    # SM contention (engine/sm_share.py, docs/MODEL.md): off by default; Megatron has no flag
    Field("cluster", "sm_contention", bool, False, switches=(
        Switch("--sm-contention", True, "slow a compute kernel by the SMs the communication "
               "kernels beside it hold (one per NCCL channel; docs/tp-overlap.md)", "smc"),)),
)

RUN = (  # numeric (numpy arrays) or meta (shapes only), seed, numeric dtype
    Field("run", "mode", str, "numeric", "numeric (numpy arrays, small models) or meta (shapes "
          "only, any size)", choices=MODE_CHOICES),
    Field("run", "seed", int, 1234, "random seed of weights, data and dropout", "seed",
          bound=Bound(0, 2**32 - 1, "", "numpy seeds are 32-bit")),
    Field("run", "numeric_dtype", str, "float64", "numpy dtype of numeric mode (accounting stays "
          "2-byte)", choices=DTYPE_CHOICES),
    Field("run", "name", str, "default", "the run's name: titles its reports and names its "
          "default report folder (default: the scenario file's name, else default)", None),
)
