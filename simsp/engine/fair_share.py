"""Max-min fair rates of flows sharing directed links (progressive filling).

Bertsekas & Gallager, "Data Networks", §6.5.2: repeatedly find the link whose remaining capacity
split evenly among its unfixed flows is smallest, give those flows that share, and remove them.
Pure function; ties are broken by the order links first appear, so results are deterministic.
The bottleneck is found with a heap of (share, first-appearance index) whose stale entries are
skipped: the same bottleneck sequence (hence bit-identical rates) as a linear scan, in
O(F log L) instead of O(L^2).
"""

import heapq

Edge = tuple[str, str]


def max_min_rates(flows: dict[int, tuple[Edge, ...]],
                  capacity_Bps: dict[Edge, float]) -> dict[int, float]:
    """Rate (bytes/s) of each flow id given the links each crosses and every link's capacity.
    A flow listing a link m times counts m-fold on it (each of its m shares charged there): m
    like flows on the same links solved as one, bit for bit (network.py flow classes: they
    are fixed at one bottleneck, where each link loses the same share once per flow, and the
    links first appear in the same order)."""
    users: dict[Edge, list[int]] = {}
    for flow_id, edges in flows.items():
        for edge in edges:
            users.setdefault(edge, []).append(flow_id)
    order = {edge: index for index, edge in enumerate(users)}
    left = {edge: capacity_Bps[edge] for edge in users}
    unfixed = {edge: len(ids) for edge, ids in users.items()}
    heap = [(left[e] / unfixed[e], order[e], e) for e in users]
    heapq.heapify(heap)
    rates = {flow_id: float("inf") for flow_id, edges in flows.items() if not edges}
    while len(rates) < len(flows):
        share, _, bottleneck = heapq.heappop(heap)
        if not unfixed[bottleneck] or share != left[bottleneck] / unfixed[bottleneck]:
            continue  # a stale entry: this link's share changed since it was pushed
        for flow_id in users[bottleneck]:
            if flow_id not in rates:
                rates[flow_id] = share
                _take(flows[flow_id], share, left, unfixed)
        _push_changed(heap, users[bottleneck], flows, left, unfixed, order)
    return rates


def _take(edges: tuple[Edge, ...], share: float, left: dict[Edge, float],
          unfixed: dict[Edge, int]) -> None:
    """Charge a newly fixed flow's rate to every link it crosses."""
    for edge in edges:
        left[edge] = max(0.0, left[edge] - share)
        unfixed[edge] -= 1


def _push_changed(heap: list, fixed: list[int], flows: dict, left: dict, unfixed: dict,
                  order: dict) -> None:
    """Push the new share of every link crossed by the just-fixed flows (once per link)."""
    seen = set()
    for flow_id in fixed:
        for edge in flows[flow_id]:
            if edge not in seen and unfixed[edge]:
                seen.add(edge)
                heapq.heappush(heap, (left[edge] / unfixed[edge], order[edge], edge))


def linked_flows(changed: list[Edge], users: dict[Edge, dict[int, None]],
                 flows: dict[int, object]) -> list[int]:
    """Ids (ascending) of the flows joined to a `changed` link through shared links,
    transitively (`users`: link -> ids of the flows crossing it; `flows`: id -> a flow with its
    `edges`, in ascending id order): a union of connected components of the flow-link graph. Max-min rates are solved
    per component alone (progressive filling never moves a rate across components), and in
    ascending id order within it every link sees the same subtractions in the same order as in
    a solve of all flows: the rates of these flows, bit for bit, while the others' stand.
    The walk stops once it holds every flow (under the quotient by rail symmetry a stage's
    flows all share its simulated GPU's links, so the component is often all of them)."""
    seen_links: set[Edge] = set()
    found: set[int] = set()
    stack = list(changed)
    everyone = len(flows)  # once all are found the walk stops: the rest can add none
    while stack:
        edge = stack.pop()
        if edge in seen_links:
            continue
        seen_links.add(edge)
        for flow_id in users.get(edge, ()):
            if flow_id not in found:
                found.add(flow_id)
                stack.extend(flows[flow_id].edges)
        if len(found) == everyone:
            return list(flows)  # every flow, ascending
    return sorted(found)
