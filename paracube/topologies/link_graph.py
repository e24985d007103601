"""The graph a topology is built on, without networkx: an undirected graph with node and edge attributes.

Routing and group queries (routing.py, group_queries.py) need only nodes, attributes and adjacency; importing
networkx costs ~0.07 s, and ~0.5 s where its bytecode is not cached, on every `paracube plan`. The builders
(fabric.py, presets.py, loader.py) fill a LinkGraph; `Topology.graph` hands out the networkx graph, built on
first use, for code that wants one (the event engine's routes, the MoE all-to-all, calibration, users).

Same answers as networkx.Graph for what it offers (tests/test_link_graph.py builds both): `add_node` and
`add_edge` keep networkx's insertion orders (a node first added by an edge, adjacency in the order edges
touch it, one attribute dict shared by both directions of an edge), `edges(data=True)` yields each edge once
in networkx's order, and `copy` rebuilds adjacency as networkx.Graph.copy does. Topology copies the graph it is
given (its adjacency order is then the copy's, which a second copy keeps), so routes (BFS in adjacency order)
and edge ids are those of the networkx graph before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class NodeView:
    """`graph.nodes`: iterate node names, `nodes[name]` its attribute dict, `nodes(data=True)` (name, attrs)."""

    def __init__(self, node: dict[Any, dict[str, Any]]) -> None:
        self._node = node

    def __call__(self, data: bool = False) -> Iterator[Any]:
        return iter(self._node.items()) if data else iter(self._node)

    def __getitem__(self, name: Any) -> dict[str, Any]:
        return self._node[name]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, name: object) -> bool:
        return name in self._node


class LinkGraph:
    """An undirected graph: nodes with attribute dicts, edges with one attribute dict (networkx.Graph's subset)."""

    def __init__(self) -> None:
        self._node: dict[Any, dict[str, Any]] = {}
        self._adj: dict[Any, dict[Any, dict[str, Any]]] = {}

    def add_node(self, name: Any, **attrs: Any) -> None:
        if name not in self._node:
            self._adj[name] = {}
            self._node[name] = attrs
        else:
            self._node[name].update(attrs)

    def add_edge(self, u: Any, v: Any, **attrs: Any) -> None:
        for end in (u, v):
            if end not in self._node:
                self._adj[end] = {}
                self._node[end] = {}
        data = self._adj[u].get(v, {})
        data.update(attrs)
        self._adj[u][v] = data
        self._adj[v][u] = data

    @property
    def nodes(self) -> NodeView:
        return NodeView(self._node)

    @property
    def adj(self) -> dict[Any, dict[Any, dict[str, Any]]]:
        """Neighbours of each node, with the edge's attributes (read only)."""
        return self._adj

    def edges(self, data: bool = False) -> Iterator[tuple[Any, ...]]:
        """Each edge once, in networkx's order (a node's edges to nodes not listed before it)."""
        seen: set[Any] = set()
        for u, nbrs in self._adj.items():
            for v, d in nbrs.items():
                if v not in seen:
                    yield (u, v, d) if data else (u, v)
            seen.add(u)

    def has_edge(self, u: Any, v: Any) -> bool:
        return u in self._adj and v in self._adj[u]

    def number_of_nodes(self) -> int:
        return len(self._node)

    def __contains__(self, name: object) -> bool:
        return name in self._node

    def __len__(self) -> int:
        return len(self._node)

    def copy(self) -> LinkGraph:
        """networkx.Graph.copy: nodes in order, then every (u, v) of the adjacency added in order."""
        out = LinkGraph()
        node, adj = out._node, out._adj
        for n, attrs in self._node.items():  # add_node's steps inlined (a topology copies ~10k links)
            adj[n] = {}
            node[n] = dict(attrs)
        for u, nbrs in self._adj.items():
            out_u = adj[u]
            for v, d in nbrs.items():  # add_edge(u, v, **d): both ends are nodes already
                data = out_u.get(v)
                if data is None:
                    data = {}
                data.update(d)
                out_u[v] = data
                adj[v][u] = data
        return out

    def to_networkx(self) -> Any:
        """The same graph as a frozen networkx.Graph (built as networkx.Graph.copy builds: same orders)."""
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from((n, dict(attrs)) for n, attrs in self._node.items())
        g.add_edges_from((u, v, dict(d)) for u, nbrs in self._adj.items() for v, d in nbrs.items())
        return nx.freeze(g)


__all__ = ["LinkGraph", "NodeView"]
