"""paracube's activation accounting (cost_models/activations.py: what the executor's autograd saves) against
Korthikanti et al. (2022, Table 2; `--activations megatron`) for GPT-3 175B's layer shape.

Per transformer layer, one micro-batch of one sequence (s = 2048, h = 12288, a = 96), bf16, dropout 0.1 (the
preset's, Megatron's default), per GPU, for 1D tensor parallelism with and without sequence parallelism, each
recomputation and each attention kernel: fa=0 is Megatron's unfused core attention (what Korthikanti et al.
count: softmax output, dropout mask and output, 5 a s^2 b), fa=1 flash attention (no s x s tensors); then the whole
activation memory per GPU of dp=8,pp=16,tp=1d:8,sp with selective recomputation (first pipeline stage).
Parameters live in the compute dtype (fp32 master weights in the optimizer), so no per-micro-batch weight
copies are saved: paracube's figure is what its executor's autograd keeps.
Usage: python benchmarks/activations_vs_megatron.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.cost_models import activations  # noqa: E402
from paracube.cost_models.block_acts import megatron_block_bytes as _block_acts  # noqa: E402
from paracube.cost_models.dims import dims_of, with_pins  # noqa: E402
from paracube.cost_models.memory import in_flight, stage_memory  # noqa: E402
from paracube.cost_models.validity import layout_arrays  # noqa: E402
from paracube.layout_parse import parse_layout  # noqa: E402
from paracube.model_presets import PRESETS  # noqa: E402
from paracube.workload import TrainingSpec

GIB, MIB = 2**30, 2**20
LAYOUTS = ["tp=1d:8,fa=0", "tp=1d:8,sp,fa=0", "tp=1d:8,fa=1", "tp=1d:8,sp,fa=1"]
RECOMPUTE = ["none", "selective", "full"]


def per_layer() -> None:
    model = PRESETS["gpt3-175b"]
    sbh = model.seq_len * model.hidden
    print(f"GPT-3 175B layer, b=1, s={model.seq_len}, h={model.hidden}, bf16; MiB per GPU (sbh = {sbh / MIB:.0f} MiB "
          f"at 1 byte)")
    print(f"{'layout':<16} {'recompute':<10} {'paracube':>10} {'megatron':>10} {'ratio':>7}")
    for text in LAYOUTS:
        layout = parse_layout(text)
        b = layout_arrays(layout, 1)
        for rc in RECOMPUTE:
            d = with_pins(dims_of(model, TrainingSpec(global_batch=1, dtype="bf16", recompute=rc)), layout)
            ours = float(activations.block_bytes(d, layout.mode, b)[0])
            meg = float(_block_acts(d, layout.mode, b, rc)[0])
            row = f"{ours / MIB:>10.1f} {meg / MIB:>10.1f} {ours / meg:>7.3f}"
            print(f"{text:<16} {rc:<10} {row}")


def whole_run() -> None:
    model = PRESETS["gpt3-175b"]
    layout = parse_layout("dp=8,pp=16,tp=1d:8,sp,mb=1")
    b = layout_arrays(layout, 1)
    n_micro = 1536 // layout.dp
    print(f"\nGPT-3 175B, {layout}, global batch 1536, selective, bf16: activations per GPU of the first stage")
    for who in ("paracube", "megatron"):
        d = dims_of(model, TrainingSpec(global_batch=1536, dtype="bf16", recompute="selective", activations=who))
        mem = stage_memory(d, layout.mode, b, True, False)
        print(f"  {who:<9} {float(mem['activations'][0]) / GIB:8.1f} GiB")
    layers, flight = model.layers // layout.pp, float(in_flight(b, np.array([float(n_micro)]), True)[0])
    print(f"  ({layers} layers x {flight:.0f} micro-batches in flight)")


if __name__ == "__main__":
    per_layer()
    whole_run()
