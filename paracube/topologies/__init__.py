"""Cluster topologies: a graph of devices, NICs and switches (link_graph.py; networkx on request), presets, YAML.

Names load on first use (PEP 562), so that `paracube topologies` (presets + listing) imports no networkx.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "list_topologies": "loader", "load_topology": "loader", "save_topology": "loader",
    "topology_from_dict": "loader", "DEVICES": "presets", "PRESETS": "presets", "Preset": "presets",
    "DeviceSpec": "device", "GroupLink": "group_links", "Topology": "topology", "describe_preset": "listing",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
