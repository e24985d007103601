"""The parameters one rank stores, tensor by tensor, in the executor's registration order.

Each mode's shards (paracube/modes: linear_shard, vector_shard, embedding_shard, head_shard) of the model's
tensors at their true widths (cost_models/dims.py: Dims.linears; MLA's: cost_models/mla.py): per block norm 1,
qkv, with qk_norm the q / k norms' gammas (whole on every tensor rank: executor/layers/head_norm.py), proj,
norm 2, fc, fc2. The gradient buckets (modes/buckets.py: reverse registration order), zero's FSDP units, the
data-parallel gradient all-reduce's payloads (cost_models/traffic.py) and the memory's closed form
(dims.local_params, which tests compare against this count) all read these sizes.
"""

from __future__ import annotations

from functools import lru_cache

from paracube.cost_models.dims import Dims, padded_vocab
from paracube.cost_models.mla import mla_layer_sizes
from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.stages import stage_layers


def local_parameter_count(layout: Layout, d: Dims, stage: str = "first") -> int:
    """Parameters one rank stores, summed shard by shard (each mode's linear / vector / embedding / head
    shards; independent of the closed form `local_params`, which tests compare against this)."""
    return sum(local_parameter_sizes(layout, d, stage))


def local_parameter_sizes(layout: Layout, d: Dims, stage: str = "first") -> list[int]:
    pp = layout.pp
    first, last = pp == 1 or stage == "first", pp == 1 or stage == "last"
    layers = int(stage_layers(d.L, pp, layout.interleave, int(first), int(last)))
    return list(parameter_sizes(layout.mode, d, layout.tensor_size, layout.q, layers, first, last))


def parameter_sizes(mode_name: str, d: Dims, t: int, q: int, layers: int, first: bool,
                    last: bool) -> tuple[int, ...]:
    """Elements of every local parameter of a stage in the executor's registration order (executor/model/gpt.py:
    token and position embedding; per block norm 1, qkv w/b, (qk_norm: q, k norm gammas), proj w/b, (GPT-OSS's
    sinks), norm 2, fc w/b, fc2 w/b; final norm, head): the order gradient buckets are built from (reversed)."""
    return tuple(n for unit in parameter_units(mode_name, d, t, q, layers, first, last) for n in unit)


@lru_cache(maxsize=4096)
def parameter_units(mode_name: str, d: Dims, t: int, q: int, layers: int, first: bool,
                    last: bool) -> tuple[tuple[int, ...], ...]:
    """`parameter_sizes` grouped by FSDP unit (modes/buckets.plan_units): the embedding (first stage), each
    block, the final norm + head (last stage); units in registration order."""
    mode = MODES[mode_name]
    h, nv = d.h, d.norm_vectors
    V = padded_vocab(d.V, mode.vocab_split(t, q))
    vec = mode.vector_shard(h, t, q)
    units: list[tuple[int, ...]] = []
    if first:
        emb = [mode.embedding_shard(V, 0, h, t, q)]
        pos = d.pos_params // d.h if d.family == "gpt" else 0
        if pos:
            emb.append(mode.embedding_shard(0, pos, h, t, q))
        units.append(tuple(int(x) for x in emb))
    if layers > 0:  # every block alike: its unit computed once
        if d.mla is not None:  # latent attention's parameters (cost_models/mla.py)
            block = mla_layer_sizes(mode, d, t, q)
        else:
            sizes: list[int] = []
            for n, (_, h_in, h_out, bias) in enumerate(d.linears):
                if n in (0, 2):  # the norm before attention / before the MLP
                    sizes += [vec] * nv
                w = mode.linear_shard(h_in, h_out, False, n in (1, 3), t, q)
                sizes.append(w)
                if bias:
                    sizes.append(mode.linear_shard(h_in, h_out, True, n in (1, 3), t, q) - w)
                if n == 0 and d.qk_norm:  # the q / k norms' gammas, whole on every rank (Dims.qk_norm_params)
                    sizes += [d.head_width] * 2
                if n == 1 and d.sinks:  # GPT-OSS's sinks, registered after proj (executor/layers/llama.py)
                    sizes.append(d.sink_params)
            block = tuple(int(x) for x in sizes)
        units += [block] * layers
    if last:
        sizes = [vec] * nv
        if d.head_count(int(first), 1):  # a tied head (same stage as the embedding) has no weight of its own
            sizes.append(mode.head_shard(h, V, t, q))
        units.append(tuple(int(x) for x in sizes))
    return tuple(units)


__all__ = ["local_parameter_count", "local_parameter_sizes", "parameter_sizes", "parameter_units"]
