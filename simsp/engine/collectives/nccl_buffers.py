"""NCCL's device buffers per rank for one communicator (docs/non_tensor_memory.md), read from
NVIDIA/nccl v2.30.7, the version simsp's tuning port follows (nccl_tuning.py):

- src/init.cc computeBuffSizes: DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) ×
  NCCL_LL_MAX_NTHREADS (512) × NCCL_STEPS (8) × 16 B = 512 KiB; DEFAULT_LL128_BUFFSIZE =
  NCCL_LL128_ELEMS_PER_THREAD (120) × NCCL_LL128_MAX_NTHREADS (640) × NCCL_STEPS × 8 B
  = 4,915,200 B; DEFAULT_BUFFSIZE (Simple) = 4 MiB (constants of src/include/device.h);
- src/transport/p2p.cc p2pSendSetup / p2pRecvSetup: a connection inside a node holds every
  protocol's buffer once, the receiver the LL and LL128 ones and the Simple one with them
  (P2P write) or on the sender (P2P read), each end one allocation; with cuMem (NCCL's default)
  each allocation is rounded up to the 2 MiB granularity: 10 MiB at the receiver and 2 MiB at
  the sender in write mode, 6 + 6 MiB in read mode, 12 MiB a connection either way (NVIDIA/nccl
  NVIDIA/nccl issue 1685 counts allocations of 10,485,760 B and 2,097,152 B on 8 × H100);
- src/transport/net.cc sendProxyConnect / recvProxyConnect: across nodes (GPUDirect RDMA) the
  receiver holds all three in GPU memory and the sender LL128 and Simple (10 MiB each, rounded);
- ring collectives: one send and one receive connection per channel, on the communicator's
  channels (nccl_tuning.Graph.comm_channels);
- send/recv (pipeline, all-to-all): src/graph/paths.cc ncclTopoGetNchannels gives a peer over
  NVLink 2 × its links channels, rounded up to a power of two and at most p2pnChannels (the
  communicator's channels, a power of two), here at most 32, the ring graph's maximum: issue
  1685 sees 32 per peer on 8 × H100, where the port's SM90 speeds give 24 ring channels
  (nccl_platform.py); a peer across nodes uses the proxy's shared buffers,
  p2pnChannels × NCCL_SHARED_STEPS (16, net.cc) × p2pChunkSize (128 KiB, init.cc
  P2P_NET_CHUNKSIZE) on each of the send and receive side, once for all such peers.
"""

from simsp.engine.collectives.nccl_platform import DGX_A100, NVLINK_LINK_GBPS, Platform
from simsp.engine.collectives.nccl_graphs import GRAPH_MAX_CHANNELS, nccl_graph

LL_BUFFSIZE = 8 * 512 * 8 * 16  # B: init.cc DEFAULT_LL_BUFFSIZE
LL128_BUFFSIZE = 120 * 640 * 8 * 8  # B: init.cc DEFAULT_LL128_BUFFSIZE
SIMPLE_BUFFSIZE = 1 << 22  # B: init.cc DEFAULT_BUFFSIZE
CUMEM_GRANULARITY = 2 << 20  # B: cuMem granularity (NVIDIA/nccl issue 1685: 2,097,152 B)
CONTROL_BYTES = 4096  # B: ncclSendMem / ncclRecvMem (comm.h), well under one granule


def granules(nbytes: int) -> int:
    """Bytes rounded up to whole cuMem granules, as NCCL's cuMem allocations are."""
    return -(-nbytes // CUMEM_GRANULARITY) * CUMEM_GRANULARITY


# B: one NVLink connection: the receiver's three buffers and the sender's control block
CONNECTION_SET = (granules(LL_BUFFSIZE + LL128_BUFFSIZE + SIMPLE_BUFFSIZE + CONTROL_BYTES)
                  + granules(CONTROL_BYTES))
# B: a ring channel that leaves the node, at the rank that sends across: its receiver end inside
# the node and its GPUDirect send buffers (LL128 and Simple)
NET_RING_CHANNEL = (granules(LL_BUFFSIZE + LL128_BUFFSIZE + SIMPLE_BUFFSIZE + CONTROL_BYTES)
                    + granules(LL128_BUFFSIZE + SIMPLE_BUFFSIZE))
SHARED_STEPS = 16  # net.cc NCCL_SHARED_STEPS
P2P_NET_CHUNK = 1 << 17  # B: init.cc P2P_NET_CHUNKSIZE
P2P_MAX_CHANNELS = GRAPH_MAX_CHANNELS  # 32, the ring graph's maximum (nccl_graphs.GRAPH_MAX_CHANNELS), see above


def pow2_up(n: int) -> int:
    """The smallest power of two at least n (NCCL's pow2Up)."""
    return 1 << max(0, (n - 1).bit_length())


def comm_channels(nodes: int, ranks_per_node: int, nvlink_GBps: float, ib_GBps: float,
                  platform: Platform = DGX_A100) -> int:
    """The communicator's channels as NCCL's ring graph gives them (nccl_graphs.nccl_graph)."""
    return nccl_graph(nodes, ranks_per_node, nvlink_GBps, ib_GBps, platform).comm_channels


def ring_bytes(nodes: int, ranks_per_node: int, nvlink_GBps: float, ib_GBps: float,
               platform: Platform = DGX_A100) -> int:
    """A rank's ring buffers: one connection per channel, its sending end across nodes when
    the ring leaves the node (the busiest rank, at a node's edge)."""
    channels = comm_channels(nodes, ranks_per_node, nvlink_GBps, ib_GBps, platform)
    return channels * (NET_RING_CHANNEL if nodes > 1 else CONNECTION_SET)


def p2p_bytes(local_peers: int, remote_peers: int, nodes: int, ranks_per_node: int,
              nvlink_GBps: float, ib_GBps: float, platform: Platform = DGX_A100) -> int:
    """A rank's send/recv buffers: per NVLink peer, its channels × one connection set; for the
    peers across nodes, the proxy's shared send and receive buffers once."""
    p2p_channels = min(P2P_MAX_CHANNELS, pow2_up(comm_channels(nodes, ranks_per_node, nvlink_GBps,
                                                           ib_GBps, platform)))
    links = max(1, int(nvlink_GBps // NVLINK_LINK_GBPS[platform.compcap]))  # 25 / 25 / 50 GB/s
    per_peer = min(p2p_channels, pow2_up(2 * links))
    shared = 2 * p2p_channels * SHARED_STEPS * P2P_NET_CHUNK if remote_peers else 0
    return local_peers * per_peer * CONNECTION_SET + shared
