"""The run report's in-network reduction section (under --use-sharp): what the DP-CP groups'
collectives ran as, and why the rest ran without SHARP (docs/nccl.md, "Across nodes").

Read from the metrics' `in_network` counts (metrics/sections.py `in_network_section`).
"""

IN_NETWORK = {"nvls", "nvls_tree", "collnet_direct", "collnet_chain"}
WHY_NOT = [
    "Collectives on other groups (TP, PP, EP) and on other communicators over the DP-CP ranks "
    "(the FP8 amax reduction's, counted above) never use the switches' SHARP (CollNet): Megatron "
    "sets NCCL_COLLNET_ENABLE only while it creates the DP-CP groups. NVLS_TREE (NVLink SHARP "
    "in each node, NCCL's tree between) needs no CollNet: any all-reduce across nodes weighs it.",
    "A ring or tree on a DP-CP group is NCCL's own pick: its estimate of the ring or tree "
    "(tuning.cc) was not above every in-network algorithm's, or the group is inside one node "
    "(CollNet needs 2 nodes or more).",
    "Reduce-scatters and all-gathers run in the network as NVLS or CollNet Direct only "
    "(tuning.cc: not NVLS_TREE nor CollNet Chain), with one GPU per NIC; CollNet needs at most 8 "
    "GPUs a node, NVLS reduce-scatters and all-gathers at most 32 (enqueue.cc).",
]


def in_network_lines(m: dict) -> list[str]:
    """`## In-network reduction`: per collective and algorithm, how many ran; absent without
    --use-sharp."""
    counts = m.get("in_network")
    if counts is None:
        return []
    rows = [f"| {key.split('/')[0].replace('_', '-')} | {key.split('/')[1]} | "
            f"{'yes' if key.split('/')[1] in IN_NETWORK else 'no'} | {n} |"
            for key, n in counts.items()]
    return ["## In-network reduction (--use-sharp)", "",
            "The collectives the run simulated on the DP-CP groups (one iteration), by the "
            "algorithm NCCL ran them as.", "",
            "| collective | algorithm | in the network | count |", "|---|---|---|---:|",
            *(rows or ["| (none) | | | 0 |"]), "", *[f"- {why}" for why in WHY_NOT], ""]
