"""Context parallelism priced (modes/context.py, cost_models/context_parallel.py): the declared exchange by hand,
the closed forms equal to the explicit list, memory per rank, the engines' agreement, and bad input."""

from __future__ import annotations

from collections import Counter

from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.layout import parse_layout
from paracube.workload import PRESETS, TrainingSpec

TINY = PRESETS["tiny"]  # L=2, h=64, heads=4 (kv = h: no GQA), f=256, V=256, s=64


def _events(text: str, mb: int, gb: int = 8) -> Counter:
    d = dims_of(TINY, TrainingSpec(global_batch=gb, dtype="bf16"))
    return Counter((e.kind, e.axes, e.payload_bytes, e.phase, e.label.split(".", 2)[-1])
                   for e in stage_events(parse_layout(text), d, mb) if e.axes == ("cp",))


def test_ring_exchange_by_hand() -> None:
    """dp=2, cp=2, tp=1d:2, mb=2, bf16: N = 8 / (2 x 2) = 2 micro-batches; a rank's T = 2 x 64 / 2 = 64 tokens;
    KV = 2 B x 64 x 2 x 64 / 2 (heads over tp) = 8192 B. Per layer forward cp - 1 = 1 send, backward cp - 1 = 1
    KV + cp = 2 dKV sends; 2 layers x 2 micro-batches. The gradients all_reduce over (dp, cp), the metric too."""
    got = _events("dp=2,cp=2,tp=1d:2,mb=2", 2)
    cp = ("cp",)
    assert got == Counter({("send", cp, 8192, "fwd", "attn.cp_kv"): 4, ("send", cp, 8192, "bwd", "attn.cp_kv"): 4,
                           ("send", cp, 8192, "bwd", "attn.cp_dkv"): 8})
    d = dims_of(TINY, TrainingSpec(global_batch=8, dtype="bf16"))
    grads = [e for e in stage_events(parse_layout("dp=2,cp=2,tp=1d:2,mb=2"), d, 2) if e.label == "gradients"]
    assert grads and all(e.axes == ("dp", "cp") and e.group_size == 4 for e in grads)


def test_all_gather_exchange_and_recompute_by_hand() -> None:
    """dp=1, cp=4, cpc=ag, no tp, mb=4, full recomputation: N = 2; T = 4 x 64 / 4 = 64; KV = 2 x 64 x 2 x 64 =
    16384 B, gathered cp KV = 65536 B. Per layer forward an all_gather (again in the recompute), backward an
    all_gather and a reduce_scatter of dK, dV; 2 layers x 2 micro-batches. Labels name `none`'s qkv unit."""
    d = dims_of(TINY, TrainingSpec(global_batch=8, dtype="bf16", recompute="full"))
    got = Counter((e.kind, e.payload_bytes, e.phase, e.label.split(".", 2)[-1])
                  for e in stage_events(parse_layout("dp=1,cp=4,cpc=ag,mb=4"), d, 4) if "cp" in e.axes
                  and e.phase != "metrics" and e.phase != "grad_sync")
    assert got == Counter({("all_gather", 65536, "fwd", "qkv.cp_kv"): 4,
                           ("all_gather", 65536, "recompute", "qkv.cp_kv"): 4,
                           ("all_gather", 65536, "bwd", "qkv.cp_kv"): 4,
                           ("reduce_scatter", 65536, "bwd", "qkv.cp_dkv"): 4})
