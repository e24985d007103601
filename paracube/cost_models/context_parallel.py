"""Context parallelism priced (Layout `cp=N`, `cpc=p2p|ag`): time of the key / value exchange and its buffers.

The contract is modes/context.py (the collectives, declared once; traffic.py lists them). Both engines price a
cp layout on the dimensions one cp rank sees (dims.context_local: s / cp tokens per sequence, `d.cp` = cp), so
everything linear in the tokens is the plain model's on s / cp:
- compute: the GEMMs, norms and head on T = b s / cp; the attention core is cp blocks of the [s/cp] x [s/cp]
  work (compute.attention_core_time): with the causal load balance (rank i holds chunks i and 2 cp - 1 - i of
  c = s / (2 cp) tokens) its queries meet c (i c + c/2) + c ((2 cp - 1 - i) c + c/2) = 2 cp c^2 = s^2 / (2 cp)
  causal key pairs: 1 / cp of the sequence's s^2 / 2 on every rank, cp equal blocks of 2 c^2 each;
- activation memory per rank (flash; activations.py): every saved tensor is linear in the rank's tokens, so
      activations(cp layout) = activations(the same layout at cp = 1, sequence s / cp) = activations(cp = 1) / cp
  (exactly: norms, linear inputs, q k v, the output, the log-sum-exp [b, heads, s / cp], llama's rotary tables of
  the rank's positions; the unfused core's scores are [s / cp, s] per head: cp x the s / cp case);
- gradients reduce, and zero shards, over Layout.data_axes (dp x cp): comm.py's data-parallel entries on the
  larger group;
- the exchange (this module), per layer and micro-batch, with KV = c T W / t bytes (modes/context.kv_bytes; W:
  Dims.kv_exchanged, MLA's k and v widths) and C = alpha + KV / B one ring step on the cp group's link:
    p2p forward (cp - 1 steps; step k's exchange issued before the attention on block k: Megatron-core's
      AttnFuncWithCPAndKVP2P):     exposed_f = (cp - 1) max(0, C - A_f / cp)
    p2p backward (cp - 1 steps, each one batched exchange of the next KV and the dK, dV travelling with the block,
      C2 = alpha + 2 KV / B; then the last block's dK, dV sent home alone):
                                   exposed_b = (cp - 1) max(0, C2 - A_b / cp) + C
    (A_f, A_b: the attention core's forward / backward seconds of the layer at its true head widths:
    compute.attention_core_time x compute.core_scale, so latent attention (DeepSeek-V3's core ~2.86 x the dense
    stand-in's) or a wide head hides what its own core hides; full recomputation repeats the forward exchange
    inside backward, and so does rc=selective's core re-run where the runtime runs it with its exchange:
    Megatron-core, Runtime.cp_core_recompute; `ring_again`);
    ag: the all_gather / reduce_scatter over cp exposed whole (comm.py prices them as any collective);
- buffers (temporaries, `kv_buffer_bytes`): p2p 4 KV (the block being used, the one arriving, and in backward the
  dK, dV partials travelling with them); ag the gathered cp KV and, backward, its gradient: 2 cp KV.
The event engine runs each ring step as its send alongside that block's attention (event_program.py: Op.alongside),
the same decomposition, so the engines agree (tests/test_context_parallel.py).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models import recompute_modules_cost as rmc
from paracube.cost_models.compute import GemmModel, attention_core_time, core_scale
from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import Sizes
from paracube.modes.context import kv_bytes, sends_per_layer

Arr = np.ndarray


def _kv(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    z = Sizes(T=b.mb * d.s, t=MODES[mode].head_split(b.t, b.q), q=b.q, depth=b.depth, sp=b.sp, V=0, cp=d.cp)
    return np.asarray(kv_bytes(d, z), dtype=float)


def kv_buffer_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Temporaries of the exchange per rank (module docstring): p2p 4 KV, ag 2 cp KV; 0 without cp."""
    if d.cp == 1:
        return np.zeros(len(b.dp))
    return _kv(d, mode, b) * (4.0 if d.cp_comm == "p2p" else 2.0 * d.cp)


def ring_blocks(d: Dims, mode: str, b: LayoutBatch, g: GemmModel) -> tuple[Arr, Arr]:
    """(forward, backward) seconds of the attention on one block of keys, one layer and micro-batch: A / cp, the
    core at its true head widths (compute.core_scale: MLA's, a wide head's; the dense core x 1.0 otherwise)."""
    attn_f, attn_b = attention_core_time(d, b.mb, b.t, g)
    k = core_scale(d) / d.cp
    return np.asarray(attn_f) * k, np.asarray(attn_b) * k


def ring_core_extra(d: Dims, mode: str, b: LayoutBatch, g: GemmModel) -> tuple[float, float]:
    """(forward, backward) seconds per layer and micro-batch of the core's correction (attention_correction.py) that
    the event engine's p2p ring steps carry (event_context.ring_ops: each step's block at its true width, of which
    the dense part's ops give the dense core's share): (cp - 1) (A_true - A_dense) / cp each way; a recompute phase
    of the ring carries the forward's again. 0 without a p2p ring or where the core is the dense one."""
    if d.cp == 1 or d.cp_comm != "p2p" or core_scale(d) == 1.0:
        return 0.0, 0.0
    f, bw = (float(np.asarray(x).ravel()[0]) for x in ring_blocks(d, mode, b, g))
    keep = (d.cp - 1) * (1.0 - 1.0 / core_scale(d))
    return keep * f, keep * bw


def ring_step_exposed(step: Arr, pair: Arr, block_f: Arr, block_b: Arr, cp: int, recompute: bool) -> Arr:
    """Exposed seconds of one layer's p2p exchange, one micro-batch, from one ring step's time `step` (one KV) and a
    backward step's `pair` (KV and dK, dV in one batched exchange); forward twice under full recomputation."""
    fwd = (cp - 1) * np.maximum(0.0, step - block_f)
    bwd = (cp - 1) * np.maximum(0.0, pair - block_b) + step
    return (2 if recompute else 1) * fwd + bwd


def ring_again(d: Dims) -> bool:
    """The backward re-runs the forward's ring (its cp - 1 KV steps beside the recomputed blocks): full
    recomputation, or rc=selective's core re-run by a runtime that runs it with its exchange (Megatron-core's:
    recompute_modules_cost.core_recomputed, Runtime.cp_core_recompute; the steps traffic.py lists under phase
    recompute, recompute_modules_cost.again_collectives)."""
    return d.recompute == "full" or (d.cp > 1 and rmc.core_recomputed(d))


def ring_time(d: Dims, mode: str, b: LayoutBatch, bw: Arr, lat: Arr, g: GemmModel, layers: Arr,
              rows: Arr) -> tuple[Arr, Arr]:
    """Per layout (`rows`: its configuration in `b`), the p2p exchange of one stage for one micro-batch: (exposed
    seconds per layout, bytes one rank sends per configuration) on the cp group's link (bw, lat per layout);
    zeros without cp or with cpc=ag (comm.py prices the all-gather as any collective)."""
    if d.cp == 1 or d.cp_comm != "p2p":
        return np.zeros(len(rows)), np.zeros(len(b.dp))
    kv = _kv(d, mode, b)
    block_f, block_b = ring_blocks(d, mode, b, g)
    step, pair = lat + kv[rows] / bw, lat + 2 * kv[rows] / bw
    exposed = ring_step_exposed(step, pair, block_f[rows], block_b[rows], d.cp, ring_again(d))
    n_f, n_b = sends_per_layer(d.cp)
    sends = n_f * (2 if ring_again(d) else 1) + n_b
    return layers[rows] * exposed, layers * sends * kv


def is_ring(kind: str, axes: tuple[str, ...]) -> bool:
    """A p2p ring step of the exchange (priced here, not as a plain collective)."""
    return kind == "send" and axes == ("cp",)


__all__ = ["is_ring", "kv_buffer_bytes", "ring_again", "ring_blocks", "ring_core_extra", "ring_step_exposed",
           "ring_time"]
