"""NCCL's per-platform tuning constants: the GPU architecture's and the host CPU's rows (pure).

NVIDIA/nccl v2.30.7 (tag v2.30.7-1, commit 73cf1122) picks these by the communicator's lowest
compute capability (src/graph/tuning.cc compCapIndex: SM80 Ampere, SM90 Hopper, SM100
Blackwell) and its CPU (comm->cpuArch / cpuVendor, src/graph/topo.cc from /proc/cpuinfo):
- tuning.cc ncclTunerConstantsDefaults: llMaxBws (one node: the GPU row; across nodes the CPU
  row, AMD or mixed -> row 1 "AMD", anything else -> row 0 "Intel"), perChMaxRingLL128Bws,
  perChMaxTreeLL128Bws, perChMaxTreeBws (by GPU), indexed by nNodes 1, 2, more;
- tuning.cc getNetOverhead: 1 us on x86 Intel, 2 us on x86 AMD, 1 us otherwise (Arm);
- search.cc speedArrayIntra/Inter (SM80), sm90SpeedArray*, sm100SpeedArray* (the search:
  nccl_graph_search.py);
- topo.h SM80_NVLINK_BW 20, SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1 (GB/s per NVLink);
- topo.cc PCIe bandwidth = width x per-lane rate / 80 (Gen4 16 GT/s: 120, Gen5 32 GT/s: 240).
Arch-independent in 2.30.7: baseLatencies, hwLatencies, the ring plateau (x1.4 for SM >= 80)
and the LL128 enable rule on simsp's topologies (tuning.cc: SM90+ up to PXN, SM80 up to PXB;
a DGX's GPU-NIC path is PXB either way).
"""

from dataclasses import dataclass

AMPERE, HOPPER, BLACKWELL = "ampere", "hopper", "blackwell"  # tuning.cc compCapIndex 1, 2, 3
AMD, INTEL, ARM = "amd", "intel", "arm"  # topo.h NCCL_TOPO_CPU_VENDOR_AMD / _INTEL; Arm: no x86
CPU_VENDORS = (AMD, INTEL, ARM)
# simsp's GPU profiles give the NVLink generation: 3 is SM80 (A100), 4 SM90 (H100/H200/H800),
# 5 SM100 (B200/GB200) (the NVIDIA datasheets of each GPU)
COMPCAP_BY_NVLINK = {3: AMPERE, 4: HOPPER, 5: BLACKWELL}
# one NVLink per direction (GB/s): NVLink3 25 (A100: 12 links, 300), NVLink4 25 (H100: 18 links,
# 450), NVLink5 50 (B200: 18 links, 900) (NVIDIA A100 / H100 / B200 datasheets)
NVLINK_LINK_GBPS = {AMPERE: 25.0, HOPPER: 25.0, BLACKWELL: 50.0}
NVLINK_BW = {AMPERE: 20.0, HOPPER: 20.6, BLACKWELL: 40.1}  # topo.h SM80/SM90/SM100_NVLINK_BW
# NIC PCIe path: DGX A100 Gen4 x16, DGX H100 / B200 Gen5 x16 (the DGX user guides)
PCIE_X16_BW = {AMPERE: 16 * 120 / 80, HOPPER: 16 * 240 / 80, BLACKWELL: 16 * 240 / 80}
# search.cc speed arrays (GB/s per channel)
SPEED_INTRA = {AMPERE: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
               HOPPER: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
               BLACKWELL: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0,
                           18.0)}
SPEED_INTER = {AMPERE: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0,
                        4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
               HOPPER: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                        3.0, 2.4, 1.2, 0.24, 0.12),
               BLACKWELL: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0,
                           17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)}
# tuning.cc llMaxBws (GB/s): one node by GPU; across nodes (2, more) by CPU row
LL_MAX_BW_ONE_NODE = {AMPERE: 87.7, HOPPER: 141.0, BLACKWELL: 2 * 141.0}
LL_MAX_BW_NODES = {INTEL: (39.0, 20.4), AMD: (22.5, 19.0)}  # rows 0 "Volta/Intel", 1 "AMD"
# tuning.cc per-channel caps (GB/s), by GPU, indexed by nNodes (1, 2, more)
PER_CH_MAX_RING_LL128_BW = {AMPERE: (20.0, 20.0, 20.0), HOPPER: (36.7, 36.7, 36.7),
                            BLACKWELL: (40.0, 40.0, 40.0)}
PER_CH_MAX_TREE_BW = {AMPERE: (24.0, 23.6, 17.8), HOPPER: (38.7, 41.4, 36.0),
                      BLACKWELL: (70.0, 42.8, 24.0)}
PER_CH_MAX_TREE_LL128_BW = {AMPERE: (20.0, 20.0, 20.0), HOPPER: (36.7, 36.7, 29.0),
                            BLACKWELL: (55.6, 31.67, 20.0)}
NET_OVERHEAD_US = {INTEL: 1.0, AMD: 2.0, ARM: 1.0}  # tuning.cc getNetOverhead (x3 for Simple)


@dataclass(frozen=True)
class Platform:
    """The GPU architecture (compCapIndex) and host CPU vendor NCCL tunes for."""

    compcap: str  # AMPERE, HOPPER or BLACKWELL
    cpu: str  # AMD, INTEL or ARM

    def ll_max_bw(self, nodes: int) -> float:
        """tuning.cc llMaxBw: the GPU's row on one node, the CPU's across nodes (AMD: row 1,
        every other vendor row 0)."""
        if nodes == 1:
            return LL_MAX_BW_ONE_NODE[self.compcap]
        return LL_MAX_BW_NODES[AMD if self.cpu == AMD else INTEL][min(nodes, 3) - 2]

    def per_channel_cap(self, table: dict, nodes: int) -> float:
        """One of tuning.cc's per-channel caps (a PER_CH_MAX_* table) at this many nodes."""
        return table[self.compcap][min(nodes, 3) - 1]

    @property
    def net_overhead_us(self) -> float:
        """tuning.cc getNetOverhead: the network post overhead per ring step (us)."""
        return NET_OVERHEAD_US[self.cpu]


def inter_node_speed(compcap: str, nic_GBps: float) -> float:
    """The first of the architecture's speedArrayInter within the NIC and its PCIe path (GB/s a
    channel): CollNet Direct's heads (collnet.py; its search is not ported)."""
    path = min(nic_GBps, PCIE_X16_BW[compcap])
    speeds = SPEED_INTER[compcap]
    return next((s for s in speeds if s <= path), speeds[-1])


DGX_A100 = Platform(AMPERE, AMD)  # A100 (SM80), AMD EPYC 7742 (NVIDIA DGX A100 user guide)


def platform_of(nvlink_generation: int, cpu: str) -> Platform:
    """The platform of a GPU by its NVLink generation (3: Ampere, 4: Hopper, 5: Blackwell;
    Ampere's constants for anything else) and a CPU vendor."""
    return Platform(COMPCAP_BY_NVLINK.get(nvlink_generation, AMPERE), cpu)
