"""fair_share.linked_flows against the connected components of the flow-link graph (networkx,
the oracle): the flows joined to the changed links, ascending, whether or not the walk stops
early because it holds every flow."""

from types import SimpleNamespace

import hypothesis.strategies as st
from hypothesis import given, settings
import networkx as nx

from simsp.engine.fair_share import linked_flows

LINKS = [(f"l{i}", f"m{i}") for i in range(6)]


@settings(max_examples=150, deadline=None)
@given(routes=st.lists(st.lists(st.sampled_from(LINKS), min_size=1, max_size=3), max_size=12),
       changed=st.lists(st.sampled_from(LINKS + [("gone", "link")]), max_size=4))
def test_linked_flows_are_the_components_of_the_changed_links(routes, changed):
    flows = {flow_id: SimpleNamespace(edges=tuple(edges)) for flow_id, edges in
             enumerate(routes)}  # id -> flow, in ascending id order as the network keeps them
    users: dict = {}
    for flow_id, flow in flows.items():
        for edge in flow.edges:
            users.setdefault(edge, {})[flow_id] = None
    graph = nx.Graph()  # flows ("f", id) and links, joined where a flow crosses a link
    graph.add_nodes_from(changed)
    graph.add_edges_from((("f", flow_id), edge) for flow_id, flow in flows.items()
                         for edge in flow.edges)
    expected = sorted({node[1] for edge in changed for node in nx.node_connected_component(graph, edge)
                       if node[0] == "f"})
    assert linked_flows(changed, users, flows) == expected
