"""Cluster topologies: a networkx graph of devices, NICs and switches, presets, and YAML files."""

from paracube.topologies.loader import list_topologies, load_topology, save_topology, topology_from_dict
from paracube.topologies.presets import DEVICES, PRESETS, Preset
from paracube.topologies.topology import DeviceSpec, GroupLink, Topology

__all__ = ["DEVICES", "PRESETS", "DeviceSpec", "GroupLink", "Preset", "Topology", "list_topologies",
           "load_topology", "save_topology", "topology_from_dict"]
