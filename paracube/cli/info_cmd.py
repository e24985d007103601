"""`paracube models` and `paracube topologies`: the presets with their figures."""

from __future__ import annotations

import argparse

from rich.table import Table

from paracube.cli.options import console, human_bytes, positive_int, print_json
from paracube.errors import ParacubeError
from paracube.model_presets import PRESETS
from paracube.topologies.presets import PRESETS as TOPOLOGY_PRESETS
from paracube.workload import ModelSpec

TOPOLOGY_NAMES = tuple(TOPOLOGY_PRESETS)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=models)
    p = sub.add_parser("topologies", help="list the cluster presets, or show one preset or YAML file sized to --gpus")
    p.add_argument("name", nargs="?", default=None, metavar="NAME|FILE.yaml",
                   help="one preset, or a topology YAML file (docs/topologies.md); default: every preset")
    p.add_argument("--gpus", type=positive_int, default=None, help="size the presets (or FILE) to N devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=topologies)

def _experts(m: ModelSpec) -> str:
    """`top-k/E x f_e (+shared f_s), mla` for an MoE model; `-` for a dense one."""
    if m.moe is None:
        return "-"
    e = m.moe
    text = f"top-{e.top_k}/{e.experts} x {e.expert_ffn}" + (f" +shared {e.shared_ffn}" if e.shared_ffn else "")
    return text + (", mla" if m.mla else "")


def models(args: argparse.Namespace) -> int:
    rows = [{**m.to_dict(), "parameters": m.num_parameters()} for m in PRESETS.values()]
    if args.json:
        print_json(rows)
        return 0
    table = Table(title="model presets (untied embeddings)")
    for col in ("name", "family", "params", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq", "experts"):
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for m in PRESETS.values():
        n = m.num_parameters()
        table.add_row(m.name, m.family, f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M", str(m.layers),
                      str(m.hidden), str(m.heads), str(m.num_kv_heads), str(m.ffn_hidden), str(m.vocab), str(m.seq_len),
                      _experts(m))
    console().print(table)
    return 0


def _described(name: str, gpus: int | None) -> dict:
    if gpus is None and name in TOPOLOGY_NAMES:
        # From the presets' constants, no graph: equal to load_topology(name).describe(), without networkx.
        from paracube.topologies.listing import describe_preset

        return describe_preset(name)
    from paracube.topologies import load_topology

    return load_topology(name, gpus=gpus).describe()


def _rate(bytes_per_s: object) -> str:
    """3 significant digits, so that a local process's 0.5 GB/s link does not print as 0 GB/s."""
    return "-" if bytes_per_s is None else f"{float(bytes_per_s) / 1e9:.3g} GB/s"  # type: ignore[arg-type]


def topologies(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list(TOPOLOGY_NAMES)
    described: list[dict] = []
    skipped: list[str] = []
    for name in names:
        try:
            described.append(_described(name, args.gpus))
        except ParacubeError as exc:
            if args.name:  # the one asked for: its error is the answer
                raise
            skipped.append(f"{name}: {exc}")  # e.g. --gpus 12 on 8-GPU nodes: the others still list
    from paracube.topologies.listing import preset_sources

    sources = {name: preset_sources(name) for name in names if name in TOPOLOGY_NAMES}
    if args.json:
        described = [{**d, "efficiency_sources": sources.get(d["name"], {})} for d in described]
        print_json(described)
        return 0
    size = f"{args.gpus} devices" if args.gpus else "default size; --gpus N to resize"
    table = Table(title=f"{'cluster presets' if not args.name else args.name} ({size})")
    for col in ("name", "device", "devices", "nodes x per node", "fp16/bf16 TFLOP/s", "fp8 TFLOP/s", "fp32 TFLOP/s",
                "memory",
                "intra-node", "inter-node", "NICs/node"):
        table.add_column(col, justify="left" if col in ("name", "device") else "right")
    for d in described:
        table.add_row(
            str(d.get("name")), str(d.get("device")), str(d.get("devices")),
            f"{d.get('nodes')} x {d.get('devices_per_node')}",
            f"{max(d['peak_flops'].get('bf16', 0), d['peak_flops'].get('fp16', 0)) / 1e12:.3g}",
            f"{d['peak_flops']['fp8'] / 1e12:.3g}" if "fp8" in d["peak_flops"] else "-",
            f"{d['peak_flops'].get('fp32', 0) / 1e12:.3g}", human_bytes(float(d.get("memory_bytes", 0))),
            _rate(d.get("intra_node_bandwidth")), _rate(d.get("inter_node_bandwidth")),
            str(d.get("nics_per_node", "-")),
        )
    con = console()
    con.print(table)
    con.print("bandwidths: one direction, per device, of the slowest link of a ring (intra-node: the devices of "
              "node 0; inter-node: one device per node)", highlight=False)
    for line in skipped:
        con.print(f"not sized: {line}", highlight=False, markup=False)
    if sources:
        con.print("efficiencies (topologies/efficiency.py; NOT FITTED: no published run exercises the figure):",
                  highlight=False)
    for name, by_figure in sources.items():
        con.print(f"  {name}: " + "; ".join(f"{k} {v}" for k, v in by_figure.items()), soft_wrap=True,
                  highlight=False, markup=False)
    return 0
