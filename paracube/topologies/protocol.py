"""What the cost models and the planner use of a topology: `Topology` (typing.Protocol) and its parts.

`paracube.topologies.Topology` (the networkx cluster) satisfies both protocols; cost_models'
UniformTopology (hand-derivable test numbers) and wrappers such as benchmarks/search_speed.py's satisfy
`Topology`. Type cost-model arguments with these protocols so that any object offering these members can
be priced, and so that what a cost model may ask of a topology is written down in one place:

- the analytic model and the planner: `device` (peak FLOP/s per dtype, memory bytes and bandwidth),
  `num_devices`, `devices_per_node`, `calibration` and `group_link(ranks, concurrent)` (ring bandwidth and
  per-step latency of a group while the concurrent groups of its mesh axis run);
- the event engine (`RoutedTopology`) also routes single transfers over the graph: `name`, `graph` (edges
  carry bandwidth and latency), `route(a, b)` (the directed edges from rank a to rank b) and
  `ring_channels(group)` (each hop of the group's node-major ring as parallel channels: (sending rank,
  receiving rank, share of the hop's bytes); a topology without it routes every hop as one path). Optional fast
  paths, read with getattr (topologies/link_loads.py): `route_hop(a, b)` (route as ids into `edges`, and its
  latency), `hop_edges(send, recv)` and `ring_channel_arrays(groups)` (many routes and channels as numpy arrays).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from paracube.topologies.calibration import Calibration


class Device(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def peak_flops(self) -> Mapping[str, float]: ...  # dense FLOP/s per dtype: fp32, fp16, bf16

    @property
    def memory_bytes(self) -> float: ...

    @property
    def memory_bandwidth(self) -> float: ...  # bytes/s


class GroupLink(Protocol):
    @property
    def bandwidth(self) -> float: ...  # bytes/s each rank of the group's ring gets

    @property
    def latency(self) -> float: ...  # seconds per ring step

    @property
    def nodes(self) -> int: ...

    @property
    def ranks_per_node(self) -> int: ...


class Topology(Protocol):
    @property
    def device(self) -> Device: ...

    @property
    def num_devices(self) -> int: ...

    @property
    def devices_per_node(self) -> int: ...

    @property
    def calibration(self) -> Calibration | None: ...

    def group_link(self, ranks: Sequence[int], concurrent: Sequence[Sequence[int]] = ()) -> GroupLink: ...


class RoutedTopology(Topology, Protocol):
    @property
    def name(self) -> str: ...

    @property
    def graph(self) -> Any: ...  # networkx.Graph: edges carry `bandwidth` (bytes/s) and `latency` (s)

    def route(self, a: int, b: int) -> list[tuple[str, str]]: ...

    def ring_channels(self, ranks: Sequence[int]) -> list[tuple[tuple[int, int, float], ...]]: ...


__all__ = ["Device", "GroupLink", "RoutedTopology", "Topology"]
