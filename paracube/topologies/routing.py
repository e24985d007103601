"""How a ring hop travels on a cluster graph: `Routing`, the route queries of `topology.Topology` (a mixin).

Routing (`route`): inside a node, the shortest path in that node's own subgraph; between nodes,
GPU -> its NIC (inside the node) -> the NIC's fabric switch -> shortest fabric path -> the peer NIC -> GPU.
Graphs without that structure fall back to a shortest path on the whole graph. Paths are cached per pair.

The graph conventions (node kinds, `node_index`, `nic`, link attributes) and the route caches these methods
read and fill (`_adj`, `_node_of`, `_paths`, `_hop_cache` ...) are `Topology.__init__`'s (topology.py).
"""

from __future__ import annotations

from collections import deque

import numpy as np

Edge = tuple[str, str]


class Routing:
    """Paths between ranks' devices, as node names, directed edges and edge ids (cached per pair)."""
    def route(self, a: int, b: int) -> list[Edge]:
        """Directed edges on the path from rank a's device to rank b's (empty when a == b)."""
        ids, _ = self._hops(self._rank(a), self._rank(b))  # the analytic model's hop cache, shared
        edges = self._edges
        return [edges[i] for i in ids.tolist()]

    def _hops(self, a: int, b: int) -> tuple[np.ndarray, float]:
        """Edge ids and summed latency of the ring hop from rank a to rank b (cached: groups of many layouts
        share hops)."""
        hops = self._hop_cache.get((a, b))
        if hops is None:
            dpn = self.devices_per_node
            parts = self._parts.hop(a, b) if a // dpn != b // dpn else None  # link_loads.HopParts: same route
            ids = None if parts is None else np.array(parts, dtype=np.int64)
            if ids is None:
                path = self._path(self._ranks[a], self._ranks[b])
                ids = np.array([self._eid[e] for e in zip(path, path[1:], strict=False)], dtype=np.int64)
            lat = self._lat_of
            hops = self._hop_cache[a, b] = (ids, sum(lat[i] for i in ids.tolist()))  # path order, as before
        return hops

    def route_hop(self, a: int, b: int) -> tuple[np.ndarray, float]:
        """`route(a, b)` as ids into `edges`, and its summed link latency (the analytic model's hop cache)."""
        return self._hops(self._rank(a), self._rank(b))

    @property
    def edges(self) -> list[Edge]:
        """Every directed edge, in the order of the ids route_hop returns."""
        return self._edges

    # --- routing --------------------------------------------------------------------------------------
    # Machines are usually identical: paths inside a node are computed once per *template* (the node's
    # subgraph with the "n{i}." prefix stripped from names) and shared by every node with that template.
    def _template(self, ni: int) -> tuple[int, str]:
        if ni not in self._templates:
            members, prefix = self._members[ni], f"n{ni}."
            if not all(u.startswith(prefix) for u in members):
                prefix = ""  # irregular names: a template of its own
            cut = len(prefix)
            attrs, bw, lat, node_of = self._graph.nodes, self._bw, self._lat, self._node_of
            nodes = frozenset((u[cut:], attrs[u]["kind"], str(attrs[u].get("nic", ""))[cut:])
                              for u in members)
            edges = frozenset((u[cut:], v[cut:], bw[(u, v)], lat[(u, v)])  # both directions: no sorting
                              for u in members for v in self._adj[u] if node_of[v] == ni)
            sig = self._sig_ids.setdefault((nodes, edges), len(self._sig_ids))
            self._templates[ni] = (sig, prefix)
        return self._templates[ni]

    def _bfs(self, src: str, dst: str, ni: int | None = None) -> tuple[str, ...] | None:
        """Shortest path by hops (deterministic); with `ni`, only through nodes of machine `ni`."""
        parent: dict[str, str | None] = {src: None}
        queue = deque([src])
        while queue:
            u = queue.popleft()
            if u == dst:
                out = [u]
                while parent[out[-1]] is not None:
                    out.append(parent[out[-1]])  # type: ignore[arg-type]
                return tuple(reversed(out))
            for v in self._adj[u]:
                if v not in parent and (ni is None or self._node_of[v] == ni):
                    parent[v] = u
                    queue.append(v)
        return None

    def _in_node(self, src: str, dst: str) -> tuple[str, ...] | None:
        if (src, dst) in self._in_node_paths:  # a GPU's path to its NIC serves all of its cross-node hops
            return self._in_node_paths[src, dst]
        ni = self._node_of[src]
        assert ni is not None
        sig, prefix = self._template(ni)
        cut = len(prefix)
        key = (sig, src[cut:], dst[cut:])
        if key not in self._tpl_paths:
            path = self._bfs(src, dst, ni)
            self._tpl_paths[key] = None if path is None else tuple(u[cut:] for u in path)
        labels = self._tpl_paths[key]
        path = None if labels is None else tuple(prefix + u for u in labels)
        self._in_node_paths[src, dst] = path
        return path

    def _nic_of(self, gpu: str) -> str | None:
        """The GPU's `nic` attribute, else the nearest NIC of its node (BFS order breaks ties)."""
        if gpu not in self._egress:
            named = self._graph.nodes[gpu].get("nic")
            ni = self._node_of[gpu]
            sig, prefix = self._template(ni)  # type: ignore[arg-type]
            key = (sig, gpu[len(prefix):])
            if named is None and key in self._tpl_nics:  # same template, same answer
                label = self._tpl_nics[key]
                named = None if label is None else prefix + label
            elif named is None:
                seen, queue = {gpu}, deque([gpu])
                while queue and named is None:
                    u = queue.popleft()
                    for v in self._adj[u]:
                        if v not in seen and self._node_of[v] == ni:
                            if self._graph.nodes[v]["kind"] == "nic":
                                named = v
                                break
                            seen.add(v)
                            queue.append(v)
                self._tpl_nics[key] = None if named is None else named[len(prefix):]
            self._egress[gpu] = named
        return self._egress[gpu]

    def _fabric_path(self, nic_a: str, nic_b: str) -> tuple[str, ...] | None:
        """nic_a -> its (first) fabric switch -> shortest path over fabric nodes only -> nic_b."""
        ups_a = [v for v in self._adj[nic_a] if self._node_of[v] is None]
        ups_b = [v for v in self._adj[nic_b] if self._node_of[v] is None]
        if not ups_a or not ups_b:
            return None
        sa, sb = ups_a[0], ups_b[0]
        # One BFS tree per source switch, over fabric nodes only, grown lazily: the search pauses once `sb` is
        # found and resumes for a later destination. Parents are set at discovery in the same order as a full
        # BFS, so every path is the full tree's (a 16,384-GPU fabric: ~500 full BFS cost ~3 s).
        grown = self._fabric.get(sa)
        if grown is None:
            grown = self._fabric[sa] = ({sa: None}, deque([sa]))
        tree, queue = grown
        adj, node_of = self._adj, self._node_of
        while sb not in tree and queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in tree and node_of[v] is None:
                    tree[v] = u
                    queue.append(v)
        if sb not in tree:
            return None
        middle = [sb]
        while tree[middle[-1]] is not None:
            middle.append(tree[middle[-1]])  # type: ignore[arg-type]
        return (nic_a, *reversed(middle), nic_b)

    def _path(self, src: str, dst: str) -> tuple[str, ...]:
        key = (src, dst)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        path: tuple[str, ...] | None = None
        if self._node_of[src] == self._node_of[dst]:
            path = self._in_node(src, dst)
        else:
            nic_a, nic_b = self._nic_of(src), self._nic_of(dst)
            if nic_a is not None and nic_b is not None:
                first, last = self._in_node(src, nic_a), self._in_node(nic_b, dst)
                mid = self._fabric_path(nic_a, nic_b)
                if first and mid and last:
                    path = first[:-1] + mid + last[1:]
        if path is None:  # irregular graph: plain shortest path (connectivity was validated)
            path = self._bfs(src, dst)
        assert path is not None
        self._paths[key] = path
        return path
