"""The key of the caches of per-stage parameter and bucket sizes (local_parameters.parameter_units, comm.py,
grad_overlap.py, fsdp_units.py): `param_dims`, a Dims with only what sizes the parameters."""

from __future__ import annotations

from functools import lru_cache

from paracube.cost_models.dims import Dims


@lru_cache(maxsize=256)
def param_dims(d: Dims) -> Dims:
    """`d` with only what sizes the parameters kept (L, h, f, V, s_model, heads, kv, family, tied, mla, head_size,
    qk_norm; the rest at Dims' defaults): the key of the caches of per-stage parameter and bucket sizes
    (local_parameters.parameter_units, comm.py, grad_overlap.py), which read nothing else, so the search's passes
    (recomputations, context parallelism, dtypes) share them. Equal results are one object (`_interned`): those
    caches' lookups then match it by identity instead of comparing its fields (the same keys either way)."""
    return _interned(Dims(L=d.L, h=d.h, f=d.f, V=d.V, s=0, s_model=d.s_model, heads=d.heads, kv=d.kv,
                          family=d.family, c=0, dtype="", recompute="", global_batch=0, tied=d.tied, mla=d.mla,
                          attention_bias=d.attention_bias, sinks=d.sinks, head_size=d.head_size, qk_norm=d.qk_norm))


@lru_cache(maxsize=256)
def _interned(d: Dims) -> Dims:
    """The first Dims equal to `d` this process saw (lru_cache returns the stored result for an equal key)."""
    return d


__all__ = ["param_dims"]
