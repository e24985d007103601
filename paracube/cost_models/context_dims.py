"""A context-parallel rank's view of the dimensions (Layout.cp; modes/context.py): `context_local` and its inverse
`full_sequence`, and the cp degrees a sequence length allows (`valid_cps`)."""

from __future__ import annotations

from dataclasses import replace

from paracube.cost_models.dims import Dims
from paracube.errors import check


def context_local(d: Dims, cp: int, cp_comm: str | None = None) -> Dims:
    """The dimensions one rank of a cp-way context-parallel group sees: s / cp tokens of each sequence (its two
    load-balanced chunks, modes/context.py), attention over the cp x s keys of the whole sequence. Everything
    linear in the tokens (GEMMs, activations, tensor-parallel and pipeline traffic) is then the plain model's on
    s / cp; attention's extra factor cp is priced from `cp` (compute.attention_core_time). Idempotent."""
    comm = cp_comm or d.cp_comm
    if cp == 1 or (d.cp == cp and d.cp_comm == comm):
        return d
    if d.cp == cp:
        return replace(d, cp_comm=comm)
    check(d.cp == 1 and d.s % (2 * cp) == 0,
          f"cp={cp} splits each sequence into {2 * cp} chunks: sequence length {d.s * d.cp} is not a multiple "
          f"of {2 * cp}; valid: {', '.join(map(str, valid_cps(d.s)))}")
    return replace(d, s=d.s // cp, cp=cp, cp_comm=comm)


def valid_cps(s: int, most: int = 64) -> list[int]:
    """cp degrees up to `most` that split sequences of s tokens into 2 cp equal chunks (1: no context parallelism)."""
    return [1] + [k for k in range(2, most + 1) if s % (2 * k) == 0]


def full_sequence(d: Dims) -> Dims:
    """The inverse of `context_local`: the whole-sequence dimensions (model FLOPs, reporting)."""
    return d if d.cp == 1 else replace(d, s=d.s * d.cp, cp=1)


__all__ = ["context_local", "full_sequence", "valid_cps"]
