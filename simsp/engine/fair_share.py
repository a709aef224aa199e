"""Max-min fair rates of flows sharing directed links (progressive filling).

Bertsekas & Gallager, "Data Networks", §6.5.2: repeatedly find the link whose remaining capacity
split evenly among its unfixed flows is smallest, give those flows that share, and remove them.
Pure function; ties are broken by the order links first appear, so results are deterministic.
"""

Edge = tuple[str, str]


def max_min_rates(flows: dict[int, tuple[Edge, ...]],
                  capacity_Bps: dict[Edge, float]) -> dict[int, float]:
    """Rate (bytes/s) of each flow id given the links each crosses and every link's capacity."""
    users: dict[Edge, list[int]] = {}
    for flow_id, edges in flows.items():
        for edge in edges:
            users.setdefault(edge, []).append(flow_id)
    left = {edge: capacity_Bps[edge] for edge in users}
    unfixed = {edge: len(ids) for edge, ids in users.items()}
    rates = {flow_id: float("inf") for flow_id, edges in flows.items() if not edges}
    while len(rates) < len(flows):
        bottleneck = min((e for e in users if unfixed[e]), key=lambda e: left[e] / unfixed[e])
        share = left[bottleneck] / unfixed[bottleneck]
        for flow_id in users[bottleneck]:
            if flow_id not in rates:
                rates[flow_id] = share
                _take(flows[flow_id], share, left, unfixed)
    return rates


def _take(edges: tuple[Edge, ...], share: float, left: dict[Edge, float],
          unfixed: dict[Edge, int]) -> None:
    """Charge a newly fixed flow's rate to every link it crosses."""
    for edge in edges:
        left[edge] = max(0.0, left[edge] - share)
        unfixed[edge] -= 1
