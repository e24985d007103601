"""`paracube models` and `paracube topologies`: the presets with their figures."""

from __future__ import annotations

import argparse

from rich.table import Table

from paracube.cli.options import console, human_bytes, print_json
from paracube.workload import PRESETS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=models)
    p = sub.add_parser("topologies", help="list the cluster presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=topologies)


def models(args: argparse.Namespace) -> int:
    rows = [{**m.to_dict(), "parameters": m.num_parameters()} for m in PRESETS.values()]
    if args.json:
        print_json(rows)
        return 0
    table = Table(title="model presets (untied embeddings)")
    for col in ("name", "family", "params", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq"):
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for m in PRESETS.values():
        n = m.num_parameters()
        table.add_row(m.name, m.family, f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M", str(m.layers),
                      str(m.hidden), str(m.heads), str(m.num_kv_heads), str(m.ffn_hidden), str(m.vocab), str(m.seq_len))
    console().print(table)
    return 0


def topologies(args: argparse.Namespace) -> int:
    # From the presets' constants, no graph: equal to load_topology(name).describe(), without networkx.
    from paracube.topologies.listing import describe_preset, preset_sources
    from paracube.topologies.presets import PRESETS as TOPOLOGY_PRESETS

    described = [describe_preset(name) for name in TOPOLOGY_PRESETS]
    sources = {name: preset_sources(name) for name in TOPOLOGY_PRESETS}
    if args.json:
        described = [{**d, "efficiency_sources": sources[d["name"]]} for d in described]
        print_json(described)
        return 0
    table = Table(title="cluster presets (default size; --gpus N to resize)")
    for col in ("name", "device", "devices", "per node", "fp16/bf16 TFLOP/s", "fp8 TFLOP/s", "fp32 TFLOP/s",
                "memory", "intra-node", "inter-node"):
        table.add_column(col)
    for d in described:
        table.add_row(
            str(d.get("name")), str(d.get("device")), str(d.get("devices")), str(d.get("devices_per_node")),
            f"{max(d['peak_flops'].get('bf16', 0), d['peak_flops'].get('fp16', 0)) / 1e12:.4g}",
            f"{d['peak_flops']['fp8'] / 1e12:.4g}" if "fp8" in d["peak_flops"] else "-",
            f"{d['peak_flops'].get('fp32', 0) / 1e12:.3g}", human_bytes(float(d.get("memory_bytes", 0))),
            f"{float(d.get('intra_node_bandwidth', 0)) / 1e9:.0f} GB/s",
            f"{float(d.get('inter_node_bandwidth', 0)) / 1e9:.1f} GB/s",
        )
    console().print(table)
    out = console()
    out.print("efficiencies (topologies/efficiency.py; NOT FITTED: no published run exercises the figure):")
    for name, by_figure in sources.items():
        out.print(f"  {name}: " + "; ".join(f"{k} {v}" for k, v in by_figure.items()), soft_wrap=True)
    return 0
