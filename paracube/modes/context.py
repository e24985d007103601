"""Context parallelism's collectives (Layout `cp=N`, `cpc=p2p|ag`): the one declaration of what cp ranks exchange.

The contract (shared with the executor, docs: README "Layout syntax", layout.py): each sequence of s tokens
splits into 2 cp chunks of s / (2 cp); cp rank i holds chunks i and 2 cp - 1 - i (causal load balance,
Megatron-core / Llama 3). A rank's tokens are T = b s / cp (b: sequences per micro-batch; `Sizes.T` is this
local count wherever cp > 1, traffic.layout_sizes). Per layer and micro-batch its keys and values are

    KV = c * T * W / t    bytes  (W = Dims.kv_exchanged: 2 kv with kv = kv_heads * head_dim; MLA: its core's
                          k and v, H (qk_nope + qk_rope + v_head_dim); t: the tensor ranks its heads split over,
                          1 in `none`; with 1D + sp the attention's k, v are whole over the T tokens)

- `cpc=p2p` (ring; Megatron's cp_comm_type=p2p): forward cp - 1 ring steps, each a `send` of KV to cp rank
  (i + 1) % cp (and a receive from (i - 1) % cp: batch_isend_irecv), the next exchange issued before the
  attention on the block already there. Backward: the KV blocks circulate again (cp - 1 sends of KV) and the
  partial dK, dV of each block travel with it back to its owner (cp sends of KV size): 2 cp - 1 KV per rank.
- `cpc=ag` (Megatron's all_gather): forward an all_gather of KV over cp (payload: the gathered cp KV, the
  convention of every all_gather here); backward the all_gather again and a reduce_scatter of dK, dV.
A `send` over ("cp",) is one ring step: each of the cp ranks sends KV bytes (collective.py: send factors 1, 1).
With full recomputation the forward list repeats in backward (phase recompute), as a mode's forward collectives
do (traffic.py). Parameter gradients reduce over Layout.data_axes (dp x cp): the data-parallel collectives with
the larger group, declared there, not here. Labels: `<unit>.cp_kv` / `<unit>.cp_dkv` with <unit> the mode's
program unit holding attention (`attention_unit`: 1D "attn", none "qkv"), so the event engine places them there.
"""

from __future__ import annotations

from typing import Any

from paracube.modes.base import COMPUTE, Collective, IntOrArr, Sizes, TensorMode, coll

CP = ("cp",)
CP_COMMS = ("p2p", "ag")  # layout.CP_COMMS: ring p2p, all-gather
DEFAULT_COMM = "p2p"  # an unpinned cpc (None): what the executor runs and what is priced


def kv_bytes(d: Any, z: Sizes) -> IntOrArr:
    """KV of one layer, one micro-batch, one rank (module docstring): c T W / t."""
    return d.c * z.T * d.kv_exchanged // z.t


def attention_unit(mode: TensorMode) -> str:
    """The program unit of `mode` that runs attention (its events are labelled with it)."""
    return "attn" if "attn" in mode.program_units else "qkv"


def comm_of(cp_comm: str | None) -> str:
    return cp_comm or DEFAULT_COMM


def layer_fwd(d: Any, cp_comm: str | None, unit: str = "attn") -> list[Collective]:
    """The forward exchange of one layer (also issued as the recompute under full recomputation)."""
    def kv(z: Sizes) -> IntOrArr:
        return kv_bytes(d, z)

    def gathered(z: Sizes) -> IntOrArr:
        return z.cp * kv_bytes(d, z)

    if comm_of(cp_comm) == "p2p":
        return [coll("send", CP, COMPUTE, kv, f"{unit}.cp_kv", calls=lambda z: z.cp - 1)]
    return [coll("all_gather", CP, COMPUTE, gathered, f"{unit}.cp_kv")]


def layer_bwd(d: Any, cp_comm: str | None, unit: str = "attn") -> list[Collective]:
    """The backward exchange of one layer: KV again, and dK, dV home to their owners."""
    def kv(z: Sizes) -> IntOrArr:
        return kv_bytes(d, z)

    def gathered(z: Sizes) -> IntOrArr:
        return z.cp * kv_bytes(d, z)

    if comm_of(cp_comm) == "p2p":
        return [coll("send", CP, COMPUTE, kv, f"{unit}.cp_kv", "bwd", calls=lambda z: z.cp - 1),
                coll("send", CP, COMPUTE, kv, f"{unit}.cp_dkv", "bwd", calls=lambda z: z.cp)]
    return [coll("all_gather", CP, COMPUTE, gathered, f"{unit}.cp_kv", "bwd"),
            coll("reduce_scatter", CP, COMPUTE, gathered, f"{unit}.cp_dkv", "bwd")]


def sends_per_layer(cp: IntOrArr) -> tuple[IntOrArr, IntOrArr]:
    """p2p ring sends of KV size per layer and micro-batch: (forward, backward) = (cp - 1, 2 cp - 1)."""
    return cp - 1, 2 * cp - 1


__all__ = ["CP", "CP_COMMS", "DEFAULT_COMM", "attention_unit", "comm_of", "kv_bytes", "layer_bwd", "layer_fwd",
           "sends_per_layer"]
