"""3D bytes per rank per step, before and after issue #15's changes (3D embedding, kept weights `kw`, tokens split
over b x s).

Cases (a 4-micro-batch step each, fp32 tiny / bf16 GPT-3 2.7B):
- tiny, dp=1,tp=3d:2x2x2,mb=4, global batch 16: the model's bytes (traffic.stage_events, cost_models) AND
  the bytes the executor records in one train_step on 8 gloo CPU ranks (the max over ranks);
- gpt3-2.7b on 64 GPUs, dp=1,tp=3d:4x4x4,mb=16, global batch 64: the model's bytes;
- the same two with one sequence per micro-batch (mb=1, global batch 4): runnable only with tokens split over
  b x s (each sequence over q^2 ranks, which gather its keys and values for attention).
Bytes = what one rank sends with ring algorithms (CommEvent.sent_bytes), and the summed payloads.
Columns: kw=0 and kw=1 of the checkout this script imports; `--before DIR` also runs it on another source
tree (e.g. `git archive 49cc7e8 | tar -x -C /tmp/main49`, the tree before the change: no kw; a tree with kw
shows its kw=0; n/a: that tree refuses the layout) and prints the three side by side.
Usage: python benchmarks/three_d_bytes.py [--before DIR] [--no-executor]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("PARACUBE_TREE") or str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from paracube.errors import ParacubeError  # noqa: E402

CASES = [  # (name, model preset, gpus, layout, global batch, dtype, executor-recorded too)
    ("tiny 3d 2x2x2", "tiny", 8, "dp=1,tp=3d:2x2x2,mb=4", 16, "fp32", True),
    ("gpt3-2.7b 3d 4x4x4", "gpt3-2.7b", 64, "dp=1,tp=3d:4x4x4,mb=16", 64, "bf16", False),
    # one sequence per micro-batch, below the token split (q^2): each sequence over q^2 ranks, keys and values
    # gathered for attention (executor/layers/tokens.py); trees before the b x s split refuse it (n/a)
    ("tiny 3d 2x2x2 mb=1", "tiny", 8, "dp=1,tp=3d:2x2x2,mb=1", 4, "fp32", True),
    ("gpt3-2.7b 3d mb=1", "gpt3-2.7b", 64, "dp=1,tp=3d:4x4x4,mb=1", 4, "bf16", False),
]
SCHEMES = (",kw=0", ",kw=1", "")  # "": the layout as written (only where kw does not parse: before kw existed)


def _model_bytes(preset: str, gpus: int, layout_text: str, batch: int, dtype: str) -> tuple[float, float]:
    from paracube.cost_models import estimate
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    est = estimate(PRESETS[preset], TrainingSpec(global_batch=batch, dtype=dtype), parse_layout(layout_text),
                   load_topology("dgx-a100", gpus=gpus))
    return sum(e.sent_bytes() for e in est.events), sum(e.payload_bytes for e in est.events)


def _one_step(rank: int, world: int, device: torch.device, preset: str, layout_text: str, batch: int) -> list:
    from paracube.executor import Mesh, build_model, train_step
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS

    spec, layout = PRESETS[preset], parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    model = build_model(spec, mesh, seed=0)
    mb = layout.micro_batch
    gen = torch.Generator().manual_seed(1)
    micro = [(torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen),
              torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen)) for _ in range(batch // mb)]
    mesh.recorder.reset()
    train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), mesh, micro, batch * spec.seq_len)
    return [(e.sent_bytes(), e.payload_bytes) for e in mesh.recorder.events]


def _executor_bytes(preset: str, gpus: int, layout_text: str, batch: int) -> tuple[float, float]:
    from paracube.executor.launch.local_ranks import run_on_ranks

    ranks = run_on_ranks(_one_step, gpus, (preset, layout_text, batch), "gloo", 600.0, "three_d_bytes")
    return max(sum(s for s, _ in r) for r in ranks), max(sum(p for _, p in r) for r in ranks)


def measure(executor: bool) -> dict[str, dict[str, list[float] | None]]:
    """{case: {scheme: [model sent, model payload, executor sent, executor payload] or None}}."""
    out: dict[str, dict[str, list[float] | None]] = {}
    for name, preset, gpus, layout, batch, dtype, run in CASES:
        out[name] = {}
        for scheme in SCHEMES:
            if scheme == "" and out[name].get(",kw=0") is not None:
                continue
            try:
                row = list(_model_bytes(preset, gpus, layout + scheme, batch, dtype))
            except ParacubeError:  # a tree without the kw pin
                out[name][scheme] = None
                continue
            row += list(_executor_bytes(preset, gpus, layout + scheme, batch)) if run and executor else [0.0, 0.0]
            out[name][scheme] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a source tree to measure as 'before' (e.g. main 49cc7e8)")
    ap.add_argument("--no-executor", action="store_true", help="model bytes only (no 8-rank run)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    after = measure(not args.no_executor)
    if args.json:
        print(json.dumps(after))
        return
    before = None
    if args.before:
        cmd = [sys.executable, __file__, "--json"] + (["--no-executor"] if args.no_executor else [])
        env = {**os.environ, "PARACUBE_TREE": str(Path(args.before).resolve()), "PYTHONPATH": args.before}
        # cwd: the rank processes' forkserver imports paracube from its working directory first
        before = json.loads(subprocess.run(cmd, env=env, cwd=args.before, check=True, capture_output=True,
                                           text=True).stdout)
    mb = 2**20
    cols = [("before", before, "")] if before else []
    cols += [("after kw=0", after, ",kw=0"), ("after kw=1", after, ",kw=1")]
    print("MiB per rank per step (ring bytes sent; payload sum in parentheses)")
    print(f"{'case':<22} {'source':<9} " + " ".join(f"{c:>22}" for c, _, _ in cols))
    for name, *_, run in CASES:
        for label, idx in (("model", 0), ("executor", 2)):
            if label == "executor" and (not run or args.no_executor):
                continue
            cells = []
            for _, data, scheme in cols:
                row = None if data is None else data[name].get(scheme)
                if row is None and data is before and data is not None:  # a before tree with kw: its kw=0
                    row = data[name].get(",kw=0")
                cells.append("n/a" if row is None else f"{row[idx] / mb:.3f} ({row[idx + 1] / mb:.3f})")
            print(f"{name:<22} {label:<9} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
