"""Load a topology by preset name or from a YAML file; save one to YAML.

YAML, compact form (GPUs of a node share one switch, NICs go to a two-level fat tree):

    name: mycluster
    device: {name: A100-80GB, peak_flops: {fp32: 19.5e12, bf16: 312e12, fp16: 312e12},
             memory_bytes: 80e9, memory_bandwidth: 2.0e12}   # or a known device name, e.g. A100-SXM-80GB
    nodes: 4
    devices_per_node: 8
    intra_node: {bandwidth: 300e9, latency: 2e-6}         # per GPU to the node's switch, bytes/s each way
    inter_node: {bandwidth: 25e9, latency: 5e-6, nics_per_node: 8,   # per NIC to its leaf
                 nodes_per_leaf: 20, oversubscription: 1.0, spine_latency: 3e-7,   # optional
                 pcie_bandwidth: 31.5e9, pcie_latency: 1e-6}     # optional: GPU (or switch) to NIC
    calibration: {...}      # optional (written by `paracube calibrate`): topologies/calibration.py parses it

Explicit form (what `save_topology` writes): instead of intra_node/inter_node, a `graph` with
`nodes: [{id, kind (gpu|nic|switch|cpu), node_index, local_rank, ...}]` and
`links: [{a, b, bandwidth, latency}]`; see `paracube.topologies.topology` for the graph conventions.
Numbers may be written as 300e9 (YAML 1.1 reads that as a string; numeric fields accept it as a number).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from paracube.errors import ParacubeError, check, did_you_mean, unknown
from paracube.topologies.calibration import Calibration, as_calibration
from paracube.topologies.device import DeviceSpec
from paracube.topologies.presets import DEVICES, PRESETS, Preset, build_switched, new_graph
from paracube.topologies.topology import Topology

if TYPE_CHECKING:  # pydantic (~50 ms) loads only when a file is read: presets need none of it
    from paracube.topologies.topology_file import TopologyFile


def list_topologies() -> list[str]:
    return list(PRESETS)


MAX_DEVICES = 1 << 18  # 262,144: far beyond any cluster planned today, small enough to build as a graph
MAX_PER_NODE = 1024


def _check_size(where: str, nodes: int, per_node: int) -> tuple[int, int]:
    """Refuse sizes the graph cannot be built for (a typo like 10**9 nodes would exhaust memory)."""
    check(per_node <= MAX_PER_NODE, f"{where}: devices_per_node={per_node} is larger than {MAX_PER_NODE}")
    check(nodes * per_node <= MAX_DEVICES,
          f"{where}: {nodes} nodes x {per_node} devices = {nodes * per_node} devices; at most {MAX_DEVICES}")
    return nodes, per_node


def _sizes(where: str, dpn: int, default_nodes: int, gpus: int | None, nodes: int | None,
           per_host: int = 0) -> tuple[int, int]:
    """(nodes, devices per node) from the requested counts; fewer GPUs than one node use part of a node."""
    return _check_size(where, *_requested_sizes(where, dpn, default_nodes, gpus, nodes, per_host))


def partial_racks(gpus: int, dpn: int, per_host: int) -> tuple[int, int] | None:
    """(racks, GPUs per rack) for a GPU count that does not fill whole racks of dpn, where a rack (one NVLink
    domain of several hosts) may be used in part: the fewest racks holding equal numbers of whole hosts (NVIDIA's
    GB200 NVL72 runs: 64, 128, 256, 512 GPUs as racks of 64, 16 of their 18 compute trays; NeMo performance
    summary 25.04, ../shared/docs/published-runs.md section 5); None if no such split exists."""
    if per_host <= 0 or gpus % per_host:
        return None
    racks = next((r for r in range(-(-gpus // dpn), gpus // per_host + 1)
                  if gpus % r == 0 and (gpus // r) % per_host == 0), None)
    return None if racks is None else (racks, gpus // racks)


def _requested_sizes(where: str, dpn: int, default_nodes: int, gpus: int | None,
                     nodes: int | None, per_host: int = 0) -> tuple[int, int]:
    check(nodes is None or (isinstance(nodes, int) and nodes >= 1), f"{where}: nodes={nodes!r} must be >= 1")
    if gpus is None:
        return (nodes or default_nodes), dpn
    check(isinstance(gpus, int) and gpus >= 1, f"{where}: gpus={gpus!r} must be a positive integer")
    if gpus < dpn:
        check(nodes in (None, 1), f"{where}: gpus={gpus} fit in one node, but nodes={nodes}")
        return 1, gpus
    racks = partial_racks(gpus, dpn, per_host) if gpus % dpn else None
    if racks is not None:
        check(nodes is None or nodes == racks[0], f"{where}: gpus={gpus} run as {racks[0]} racks of {racks[1]} "
              f"(whole hosts of {per_host}), but nodes={nodes}")
        return racks
    if per_host > 0 and gpus % per_host:
        raise ParacubeError(f"{where}: gpus={gpus} is not a multiple of the {per_host} GPUs of a host; try "
                            f"{gpus // per_host * per_host} or {(gpus // per_host + 1) * per_host}")
    check(gpus % dpn == 0, f"{where}: gpus={gpus} is not a multiple of the {dpn} devices per node "
          f"(or fewer than one node); try {gpus // dpn * dpn} or {(gpus // dpn + 1) * dpn}")
    check(nodes is None or nodes * dpn == gpus,
          f"{where}: gpus={gpus} and nodes={nodes} disagree ({dpn} devices per node)")
    return gpus // dpn, dpn


def _from_preset(preset: Preset, gpus: int | None, nodes: int | None) -> Topology:
    if preset.fixed_nodes:  # local-cpu: one node; gpus = number of processes
        check(nodes in (None, 1), f"{preset.name}: nodes={nodes!r}; valid: 1 (this machine)")
        check(gpus is None or (isinstance(gpus, int) and gpus >= 1),
              f"{preset.name}: gpus={gpus!r} must be >= 1")
        return preset.build(*_check_size(preset.name, 1, gpus or preset.devices_per_node))
    return preset.build(*preset_sizes(preset, gpus, nodes))


def preset_sizes(preset: Preset, gpus: int | None, nodes: int | None = None) -> tuple[int, int]:
    """(nodes, devices per node) a preset is built with for a GPU count: whole nodes, part of one node, or (a
    rack of several hosts) the fewest equal racks of whole hosts (partial_racks)."""
    return _sizes(preset.name, preset.devices_per_node, preset.default_nodes, gpus, nodes, preset.devices_per_host)


def topology_from_dict(data: Any, source: str = "topology", gpus: int | None = None,
                       nodes: int | None = None) -> Topology:
    """Build from the YAML structure (either form). `source` names the file in error messages."""
    spec = _validated(data, source)
    try:
        calibration = as_calibration(spec.calibration)
    except ParacubeError as exc:  # name the file too
        raise ParacubeError(f"{source}: {exc}") from None
    if isinstance(spec.device, str):
        check(spec.device in DEVICES, f"{source}: field device: unknown device {spec.device!r}; "
              f"{did_you_mean(spec.device, DEVICES)}give a mapping or one of {', '.join(DEVICES)}")
        device = DEVICES[spec.device]
    else:
        device = DeviceSpec(**spec.device.model_dump())
    if spec.graph is not None:
        return _from_graph(spec, device, calibration, source, gpus, nodes)
    check(spec.intra_node is not None, f"{source}: field intra_node: missing; expected "
          "{bandwidth: bytes/s, latency: s} (or an explicit graph)")
    n, per = _sizes(source, spec.devices_per_node, spec.nodes, gpus, nodes)
    inter = spec.inter_node
    check(inter is not None or n == 1, f"{source}: field inter_node: missing; expected {{bandwidth: bytes/s, "
          f"latency: s, nics_per_node: N}} for {n} nodes")
    assert spec.intra_node is not None
    kw: dict[str, Any] = {}
    if inter is not None:
        kw = dict(inter_bandwidth=inter.bandwidth, inter_latency=inter.latency,
                  nics_per_node=min(inter.nics_per_node, per), pcie_bandwidth=inter.pcie_bandwidth,
                  pcie_latency=inter.pcie_latency, nodes_per_leaf=inter.nodes_per_leaf,
                  oversubscription=inter.oversubscription, spine_latency=inter.spine_latency)
    else:
        kw = dict(inter_bandwidth=1.0, inter_latency=1.0, nics_per_node=1)  # unused: one node has no NICs
    topo = build_switched(spec.name, device, n, per, spec.intra_node.bandwidth, spec.intra_node.latency, **kw)
    topo.calibration = calibration
    return topo


def _validated(data: Any, source: str) -> TopologyFile:
    """The file's structure checked by pydantic; one line naming the first bad field otherwise."""
    check(isinstance(data, dict), f"{source}: expected a mapping with name, device, nodes, devices_per_node, "
          f"...; got {type(data).__name__}")
    from pydantic import ValidationError

    from paracube.topologies.topology_file import TopologyFile

    try:
        return TopologyFile.model_validate(data)  # lax mode: "300e9" strings become floats
    except ValidationError as exc:
        # A union (device: mapping | name) reports one error per branch: show the mapping branch's.
        errs = exc.errors()
        err = next((e for e in errs if "str" not in e["loc"]), errs[0])
        # A misspelt key (device_per_node) is the cause of its "missing" twin: name it first, with its near miss.
        extra = next((e for e in errs if e["type"] == "extra_forbidden" and "str" not in e["loc"]), None)
        if extra is not None:
            raise ParacubeError(_unknown_key(source, extra["loc"])) from None
        field = ".".join(_key_text(p) for p in err["loc"] if p not in ("DeviceModel", "str")) or "(top level)"
        shown = err["type"] != "missing" and not isinstance(err["input"], dict)
        value = f" (got {err['input']!r})" if shown else ""
        raise ParacubeError(f"{source}: field {field}: {err['msg']}{value}") from None


def _key_text(key: object) -> str:
    """A file's key as an error names it: as written, or quoted with escapes where it holds a line break or other
    unprintable character (the message stays one line)."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def _unknown_key(source: str, loc: tuple) -> str:
    """`my.yaml: field device_per_node: unknown key; did you mean devices_per_node? valid: ...`."""
    from pydantic import BaseModel

    from paracube.topologies.topology_file import TopologyFile

    parts = [str(p) for p in loc if p not in ("DeviceModel", "str")]
    model: type[BaseModel] = TopologyFile
    for part in parts[:-1]:  # the model the key was found in
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)
                 and issubclass(a, BaseModel)]
        if not inner:
            break
        model = inner[0]
    valid = list(model.model_fields)
    return (f"{source}: field {'.'.join(_key_text(p) for p in parts)}: unknown key; {did_you_mean(parts[-1], valid)}"
            f"valid keys here: {', '.join(valid)} (docs/topologies.md)")


def _from_graph(spec: TopologyFile, device: DeviceSpec, calibration: Calibration | None, source: str,
                gpus: int | None, nodes: int | None) -> Topology:
    """The explicit form: the file's graph as is (it cannot be resized)."""
    assert spec.graph is not None
    check(spec.intra_node is None and spec.inter_node is None,
          f"{source}: give either graph or intra_node/inter_node, not both")
    _check_size(source, spec.nodes, spec.devices_per_node)
    check((gpus is None or gpus == spec.nodes * spec.devices_per_node) and nodes in (None, spec.nodes),
          f"{source}: an explicit graph has {spec.nodes} nodes x {spec.devices_per_node} devices; "
          f"it cannot be resized to gpus={gpus}, nodes={nodes}")
    g = new_graph()
    for node in spec.graph.nodes:
        attrs = node.model_dump(exclude={"id"})
        g.add_node(node.id, **{k: v for k, v in attrs.items() if v is not None})
    for link in spec.graph.links:
        for end in (link.a, link.b):
            check(end in g, f"{source}: link {link.a!r}-{link.b!r} names node {end!r}, "
                  "which is not in graph.nodes")
        g.add_edge(link.a, link.b, **link.model_dump(exclude={"a", "b"}))
    try:
        return Topology(spec.name, g, device, spec.nodes, spec.devices_per_node, calibration)
    except ParacubeError as exc:  # name the file too
        raise ParacubeError(f"{source}: {exc}") from None


def looks_like_file(name: str) -> bool:
    """A name with a file suffix or a directory part is a path, not a misspelt preset."""
    return Path(name).suffix.lower() in (".yaml", ".yml", ".json") or "/" in name or "\\" in name


def load_topology(name_or_path: str, gpus: int | None = None, nodes: int | None = None) -> Topology:
    """A preset by name (see `list_topologies()`), or a YAML file path."""
    check(isinstance(name_or_path, str) and name_or_path != "", f"empty topology name; valid presets: "
          f"{', '.join(PRESETS)}, or a .yaml file")
    if name_or_path in PRESETS:
        return _from_preset(PRESETS[name_or_path], gpus, nodes)
    path = Path(name_or_path)
    if not path.is_file():
        check(not (looks_like_file(name_or_path) or path.is_dir()), f"topology file {name_or_path!r} "
              + ("is a directory" if path.is_dir() else "does not exist")
              + f"; give a YAML file (docs/topologies.md) or a preset: {', '.join(PRESETS)}")
        raise unknown("topology", name_or_path, PRESETS, ", or the path of a YAML file (docs/topologies.md)")
    import yaml  # only files need it (~10 ms to import)

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ParacubeError(f"cannot read topology file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ParacubeError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return topology_from_dict(data, str(path), gpus, nodes)


def save_topology(topo: Topology, path: str | Path) -> None:
    """Write the explicit form; `load_topology(path)` gives an equal topology."""
    import yaml

    Path(path).write_text(yaml.safe_dump(topo.to_dict(), sort_keys=False, width=120))
