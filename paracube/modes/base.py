"""What one tensor mode declares: mesh axes, shapes, size rules, splits, parameters, collectives, costs.

A mode is a `TensorMode` subclass in its own module (none.py, one_d.py, two_d.py, two_half_d.py,
three_d.py), registered by one line in paracube/modes/__init__.py. Everything here is torch-free and works
on Python ints (one layout) and on numpy int64 arrays (a LayoutBatch) alike, so ONE declaration feeds:
- the explicit per-event list of a step (cost_models/traffic.py, compared with what the executor records),
- the vectorized per-(kind, axes, dtype) sums of the analytic model (cost_models/comm.py),
- memory, activations and compute (cost_models/*), the planner and the executor's mode dispatch (what the
  executor runs of a mode: executor_support.py).

Collectives (`Collective`): kind, mesh axes, dtype (COMPUTE = the training's compute dtype, or float32),
payload bytes as a function of `Sizes`, label, phase (edge and per-step collectives; a layer's forward
list is issued once per forward phase: fwd, plus recompute under full recomputation; its backward list
once, phase bwd), `when` ("sp" / "no_sp": only with / without sequence parallelism) and `tpo`: the GEMM
that produces or consumes it, against which a layout with `tpo` decomposes it (collective matmul). Per micro-batch a
stage issues: `embedding` (first stage), `layer_fwd` and `layer_bwd` per block, `head` (last stage); per
step `step_collectives`, then the generic gradient / grad-norm / metrics all-reduces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from paracube.modes.collective import (
    COMPUTE,
    F32,
    TPO_GEMMS,
    Collective,
    IntOrArr,
    Payload,
    Sizes,
    chunks,
    coll,
    first_exposed,
)
from paracube.modes.executor_support import ExecutorSupport
from paracube.modes.split_rules import (
    TOKEN_RULE,
    VOCAB_MULTIPLE,
    Rule,
    attention_width_rules,
    divides,
    key_window,
    kv_gather_groups,
    padded,
    sequence_pieces,
    split,
    tokens_split_ok,
)

LAYER_UNITS = ("ln1", "qkv", "proj", "ln2", "fc", "fc2")  # a block, in forward order


class TensorMode:
    """Defaults describe a mode without tensor parallelism; each mode module overrides what differs."""

    name: str = ""
    axes: tuple[str, ...] = ()  # tensor mesh axes, outer -> inner
    shape_rule: str = ""  # the syntax and what a valid shape is
    no_shape: str = "no layout"  # why N GPUs have no shape of this mode ({n} = GPU count)
    sequence_parallel: bool = False  # accepts the sp option
    tpo_needs_sp: bool = False  # declares tpo-overlappable collectives only with sp (1D): tpo without sp is refused
    # accepts `cp=N` (context parallelism): modes whose activations are whole sequences on every tensor rank
    # (none, 1D); 2D/2.5D/3D split tokens themselves (their token split is already context parallel)
    context_parallel: bool = False
    alternating: bool = False  # consecutive collectives switch mesh axes (calibration's alternating fit)
    grad_axes: tuple[str, ...] = ("dp",)  # the per-step gradient all_reduce group
    collective_axes: tuple[tuple[str, ...], ...] = ()  # every tensor group its collectives use
    mesh_groups: tuple[tuple[str, ...], ...] = ()  # extra process groups the executor builds
    executor: ExecutorSupport | None = None
    ops_layer: int = 0  # torch dispatches per block, forward + backward (step_ops.ops_per_step)
    ops_edge: int = 0  # embedding + head + loss dispatches
    program_units: tuple[str, ...] = LAYER_UNITS  # units of a block in the event engine's program
    merged_units: tuple[tuple[str, tuple[str, ...]], ...] = ()  # program unit -> its linears (1D halves)
    replicates_activations: bool = True  # block activations are whole on every tensor rank (none, 1D)
    rules: tuple[Rule, ...] = ()
    dispatches_like: str = ""  # the mode whose calibrated per-op overhead this one borrows ("": its own)
    megatron_style: bool = False  # the tensor layout Megatron-LM / DeepSpeed / torchtitan run (export)
    ties_embeddings: bool = False  # the head can be the embedding's transpose in this mode's layout (executor)
    # Tied embeddings in the flat token layout (2D, 2.5D, 3D): the head's GEMM X E^T runs on the embedding's own
    # blocks. `tied_head_roles` (I, W, O): X gathered over I, E^T's block over W ("": used in place), the
    # partial logits reduce-scattered over O along the tokens (the roles of a 3D linear, two_d.py / three_d.py);
    # the logits' tokens are then split over `tied_token_axes` and their vocabulary (the embedding's rows) over
    # `tied_vocab_axes`, where the cross-entropy reduces. Empty: the untied head's layout serves (none, 1D).
    tied_head_roles: tuple[str, str, str] | None = None
    tied_token_axes: tuple[str, ...] = ()
    tied_vocab_axes: tuple[str, ...] = ()
    keeps_weights: bool = False  # declares `kept` weight collectives (Layout kw=1 applies)
    paper: str = ""  # the paper whose closed form `paper_layer_bytes` states
    # A variant of another mode's layout (`tp=<variant_of>:SHAPE,<variant_flag>`, e.g. 2D's SUMMA baseline):
    # the layout parser and printer read these two; the cost models see the variant as a mode of its own.
    variant_of: str = ""
    variant_flag: str = ""
    searched: bool = True  # the planner searches it unless asked for modes (False: a baseline, priced on request)

    def __repr__(self) -> str:
        return f"<tensor mode {self.name}>"

    # --- shapes and sizes ---------------------------------------------------------------------------------
    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == 0

    def shapes(self, gpus: int) -> list[tuple[int, ...]]:
        """Tensor shapes whose size divides `gpus` (the planner's enumeration)."""
        return [()]

    def depth(self, shape: tuple[int, ...]) -> int:
        return 1

    def axis_sizes(self, q: IntOrArr, t: IntOrArr, depth: IntOrArr) -> dict[str, IntOrArr]:
        """Size of each tensor axis (ints or arrays)."""
        return {}

    def token_split(self, q: IntOrArr, depth: IntOrArr) -> IntOrArr:
        """Ways the tensor group splits the tokens of a micro-batch."""
        return 1

    # Modes that split a micro-batch's b x s tokens (flattened batch-major) over mesh axes, major -> minor:
    # in the block layout (`token_axes`) and in the attention layout, the qkv output (`attention_token_axes`).
    token_axes: tuple[str, ...] = ()
    attention_token_axes: tuple[str, ...] = ()

    def kv_gathers(self, d: Any) -> list[Collective]:
        """The key / value all-gather of a sequence split over ranks (forward; reduce-scatter of their
        gradients backward), over the smallest minor group of `attention_token_axes` holding whole sequences
        (`kv_gather_groups`): T / n tokens per rank, g of them gathered, k and v of the rank's heads
        (2 kv / head_split columns), compute dtype. Issued only where a rank's block is not whole sequences."""
        out: list[Collective] = []
        axes = self.attention_token_axes
        for i in range(len(axes)):
            group = axes[len(axes) - 1 - i:]

            def gathered(z: Sizes, group: tuple[str, ...] = group) -> IntOrArr:
                sizes = self.axis_sizes(z.q, z.t, z.depth)
                g = np.prod([sizes[a] for a in group], axis=0)
                n = self.token_split(z.q, z.depth)
                return d.c * g * (z.T // n) * 2 * d.kv // self.head_split(z.t, z.q)

            def applies(z: Sizes, i: int = i) -> IntOrArr:
                n = self.token_split(z.q, z.depth)
                hits = kv_gather_groups(axes, self.axis_sizes(z.q, z.t, z.depth), sequence_pieces(z.T, d.s, n))
                return hits[i][1].astype(np.int64) if np.ndim(hits[i][1]) else int(hits[i][1])

            # Labelled with the qkv unit (the event engine's program): gathered after its GEMM, the gradients
            # reduce-scattered before its backward.
            out += [coll("all_gather", group, COMPUTE, gathered, "qkv.kv", applies=applies),
                    coll("reduce_scatter", group, COMPUTE, gathered, "qkv.dkv", "bwd", applies=applies)]
        return out

    def vocab_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        """Ways the vocabulary (embedding rows, head columns) is split."""
        return 1

    def head_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        """Ways the attention heads are split (the head count must divide by it)."""
        return 1

    def act_split(self, t: IntOrArr, sp: IntOrArr) -> IntOrArr:
        """Ways one rank's share of the block-boundary activations [T, h] is split (pipeline sends)."""
        return t

    # --- parameters -----------------------------------------------------------------------------------------
    def local_params(self, d: Any, t: IntOrArr, q: IntOrArr, layers: IntOrArr, first: IntOrArr,
                     last: IntOrArr) -> IntOrArr:
        """Closed form of the parameters one rank stores (one stage of `layers` blocks)."""
        return _total_params(d, padded(d.V, self.vocab_split(t, q)), layers, first, last)

    def linear_shard(self, h_in: int, h_out: int, bias: bool, row: bool, t: int, q: int) -> int:
        """Elements of one linear's weight and bias shard on a rank (row: row-parallel in 1D)."""
        return h_in * h_out + (h_out if bias else 0)

    def vector_shard(self, h: int, t: int, q: int) -> int:
        """Local length of one norm parameter vector."""
        return h

    def embedding_shard(self, V: int, pos: int, h: int, t: int, q: int) -> int:
        return V * h + pos * h

    def head_shard(self, h: int, V: int, t: int, q: int) -> int:
        return h * V

    # --- collectives ------------------------------------------------------------------------------------------
    def embedding(self, d: Any) -> list[Collective]:
        return []

    def layer_fwd(self, d: Any) -> list[Collective]:
        return []

    def layer_bwd(self, d: Any) -> list[Collective]:
        return []

    def head(self, d: Any) -> list[Collective]:
        """The final norm, head and loss of a micro-batch (d.tied: the head is the embedding's transpose)."""
        return []

    def loss_token_axes(self, tied: bool) -> tuple[str, ...]:
        """Axes the head's logits (and the loss's labels) split the micro-batch's flat tokens over."""
        return self.tied_token_axes if tied and self.tied_head_roles else self.attention_token_axes

    def step_collectives(self, d: Any) -> list[Collective]:
        """Mode-specific per-step collectives (before the generic gradients / grad norm / metrics)."""
        return []

    # --- compute and memory ---------------------------------------------------------------------------------------
    def gemm_shape(self, T: IntOrArr, h_in: IntOrArr, h_out: IntOrArr, column: bool, t: IntOrArr,
                   q: IntOrArr, depth: IntOrArr) -> tuple[IntOrArr, IntOrArr, IntOrArr]:
        """(m, n, k) of the forward GEMM of one linear on one rank: X [m, k] x A [k, n]."""
        return T, h_out, h_in

    def activation_split(self, t: Any, q: Any, depth: Any) -> dict[str, Any]:
        """Divisors of saved activations: tok (tokens), all (tokens x hidden), gx (gathered linear inputs),
        gw (gathered weights), vocab (the head's output)."""
        one = np.ones_like(t)
        return {"tok": one, "all": one, "gx": one, "gw": one, "vocab": one}

    def megatron_block(self, d: Any, X: Any, att: Any, sbh: Any, T: Any, t: Any, q: Any, depth: Any,
                       sp: Any, scale: float) -> Any:
        """Korthikanti et al.'s activations of one block in bytes (memory.py; `scale` = c / 2)."""
        return scale * (X + att)

    def linear_temporaries(self, c: int, T: Any, h_in: int, h_out: Any, t: Any, q: Any, depth: Any) -> Any:
        """Bytes of one linear's gathered operands and output while it runs."""
        return c * T * (h_in + h_out)

    def tied_head_temporaries(self, c: int, T: Any, h: int, V: Any, t: Any, q: Any, depth: Any) -> Any:
        """Bytes of the tied head's gathered operands and outputs while it runs (default: the untied head's)."""
        return self.linear_temporaries(c, T, h, V, t, q, depth)

    def paper_layer_bytes(self, T: float, linears: Sequence[tuple[str, int, int]], shape: tuple[int, ...],
                          e: float) -> float:
        """The paper's closed form (`paper`) of the bytes one rank sends for one transformer layer, forward +
        backward, one micro-batch of T tokens; linears: (name, h_in, h_out); e bytes per element.
        planner/theory.py compares it with the cost model. NaN: no tensor parallelism, nothing to send."""
        return math.nan

    def executor_rules(self, s: int, h: int, f: int, V: int, heads: int, q: int,
                       micro_batch: int | None) -> list[tuple[str, int, int]]:
        """(name, value, divisor) the executor needs to divide exactly (executor/sizes.py)."""
        return []


def _total_params(d: Any, V: IntOrArr, layers: IntOrArr, first: IntOrArr, last: IntOrArr) -> IntOrArr:
    """Every parameter of a stage of `layers` blocks, unsplit (V: the padded vocabulary)."""
    head = d.head_count(first, last) * V * d.h  # 0 when tied to this stage's embedding
    return layers * d.layer_params() + first * (V * d.h + d.pos_params) + head + last * d.norm_vectors * d.h


def split_embedding(d: Any, axes: tuple[str, ...], tok: Payload, pos_axes: tuple[str, ...] = (),
                    gather_axes: tuple[str, ...] = ()) -> list[Collective]:
    """Collectives of a 2D / 3D embedding (vocabulary rows split over `axes`): the looked-up token block `tok`
    reduce-scattered over `axes` forward (all-gathered backward); with `gather_axes` (3D: the table's hidden
    is split further there) the combined block, `tok` bytes again, is then all-gathered over `gather_axes`
    along the hidden (reduce-scattered backward). GPT's position table [s, h/q] all-gathered over `pos_axes`
    (default `axes`) forward, its gradient reduce-scattered backward (fp32): a kept weight (kw=1)."""
    def pos(z: Sizes) -> IntOrArr:
        return 4 * d.s * d.h // z.q

    out = [coll("reduce_scatter", axes, F32, tok, "tok_emb"), coll("all_gather", axes, F32, tok, "tok_emb", "bwd")]
    if gather_axes:
        out += [coll("all_gather", gather_axes, F32, tok, "tok_emb.h"),
                coll("reduce_scatter", gather_axes, F32, tok, "tok_emb.h", "bwd")]
    if d.family == "gpt":
        pa = pos_axes or axes
        out += [coll("all_gather", pa, F32, pos, "pos_emb", kept=True),
                coll("reduce_scatter", pa, F32, pos, "pos_emb", "bwd", kept=True)]
    return out


def replica_grad_groups(mode: TensorMode) -> list[tuple[str, ...]]:
    """The groups a parameter replicated over the tensor group sums its gradient over, where each tensor rank's
    gradient covers only its own heads and tokens (the q / k norms' gammas: head_norm.py; the attention sinks:
    sinks.py): the mode's tensor axes less its grad_axes (those the step's gradient all-reduce already sums: 2.5D's
    dep), as one group where that is the whole tensor group (the mesh builds it), else one per axis (2.5D: row,
    col). None without tensor axes."""
    axes = tuple(a for a in mode.axes if a not in mode.grad_axes)
    return [] if not axes else [axes] if axes == mode.axes else [(a,) for a in axes]


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (O(sqrt n): the planner asks for them of up to a million GPUs)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


# What a mode module imports: this file's declarations and the vocabulary of collective.py and split_rules.py.
__all__ = ["COMPUTE", "F32", "LAYER_UNITS", "TOKEN_RULE", "TPO_GEMMS", "VOCAB_MULTIPLE", "Collective",
           "IntOrArr", "Payload", "Rule", "Sizes", "TensorMode", "attention_width_rules", "chunks", "coll", "divides",
           "divisors", "first_exposed", "key_window", "kv_gather_groups", "padded", "replica_grad_groups",
           "sequence_pieces", "split", "split_embedding", "tokens_split_ok"]
