"""Size arithmetic every mode shares, on ints (one layout) and int64 arrays (a LayoutBatch) alike: exact splits,
Megatron-LM's vocabulary padding, and the rules for splitting a micro-batch's tokens over ranks (which blocks hold
whole sequences, how many keys a block's queries see, where keys and values are gathered)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paracube.modes.collective import IntOrArr


def split(x: IntOrArr, k: IntOrArr) -> IntOrArr:
    """x / k: exact integer division on ints, true division on float arrays (compute and memory models)."""
    if isinstance(x, (int, np.integer)) and isinstance(k, (int, np.integer)):
        return x // k
    return x / k


VOCAB_MULTIPLE = 128  # Megatron-LM's make_vocab_size_divisible_by (its default)


def padded(V: int, by: IntOrArr) -> IntOrArr:
    """The vocabulary as Megatron-LM pads it (`_vocab_size_with_padding`): up to a multiple of 128 x its split
    `by` (Megatron: x tp). The executor pads its embedding and head to this size and masks the padded logits
    out of the loss; every cost model counts it. GPT-2's 50,257: 50,304 at by = 1, 50,688 at 4, 51,200 at 8."""
    multiple = VOCAB_MULTIPLE * by
    return -(-V // multiple) * multiple


def divides(a: IntOrArr, b: IntOrArr) -> np.ndarray:
    return np.asarray(a) % np.asarray(b) == 0


Rule = tuple[str, Callable[[Any, Any], np.ndarray]]  # (reason, predicate(dims, LayoutBatch))

TOKEN_RULE = "micro-batch tokens % token split != 0"


def attention_width_rules(over: str, n: Callable[[Any], IntOrArr]) -> tuple[Rule, Rule]:
    """Where a head is not hidden / heads wide (ModelSpec.head_size, Qwen3; not MLA), the query width heads x head_dim
    and the qkv width (heads + 2 kv heads) x head_dim split over the `n(b)` ranks the hidden size splits over (`over`
    names them): the executor refuses them otherwise (executor/sizes.py: its rules beside "hidden"); elsewhere both
    hold."""
    def plain(d: Any) -> bool:
        return not d.head_size or d.mla is not None

    return ((f"heads x head_dim % {over} != 0", lambda d, b: plain(d) | divides(d.q_width, n(b))),
            (f"qkv width (heads + 2 kv heads) x head_dim % {over} != 0",
             lambda d, b: plain(d) | divides(d.q_width + 2 * d.kv, n(b))))


def tokens_split_ok(mb: IntOrArr, s: IntOrArr, n: IntOrArr) -> IntOrArr:
    """Whether n ranks can split a micro-batch of mb sequences of s tokens (flattened batch-major, b x s) into n
    equal blocks: any micro-batch whose token count divides. A block may hold whole sequences, part of one, or
    the end of one and the start of the next (executor/layers/tokens.py)."""
    return (np.asarray(mb) * s) % np.asarray(n) == 0


def sequence_pieces(T: IntOrArr, s: IntOrArr, n: IntOrArr) -> IntOrArr:
    """Consecutive token blocks of c = T / n tokens that first end on a sequence boundary: s / gcd(c, s) (1: every
    block holds whole sequences). A group of g consecutive blocks holds whole sequences iff pieces | g."""
    c = np.asarray(T) // np.asarray(n)
    return np.asarray(s) // np.gcd(c, s)


def key_window(T: IntOrArr, s: IntOrArr, n: IntOrArr) -> IntOrArr:
    """Keys a rank's c = T / n queries attend over when its block is not whole sequences, at most over ranks:
    from the start of its first token's sequence to its last token, c + s - gcd(c, s) (s when c divides s).
    Whole sequences: s (each query row has at most s keys)."""
    c = np.asarray(T) // np.asarray(n)
    return np.where(c % s == 0, s, c + s - np.gcd(c, s))


def kv_gather_groups(axes: tuple[str, ...], sizes: dict[str, IntOrArr],
                     pieces: IntOrArr) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """Where a sequence split into `pieces` token blocks over `axes` (major -> minor) gathers its keys and
    values: for each suffix of `axes` (minor first), 1 where it is the smallest suffix whose ranks hold whole
    sequences (its size a multiple of `pieces`), else 0; all 0 when pieces = 1 (sequences whole on a rank)."""
    pieces = np.asarray(pieces)
    done = pieces <= 1
    out: list[tuple[tuple[str, ...], np.ndarray]] = []
    size: IntOrArr = 1
    for i in range(len(axes) - 1, -1, -1):
        size = size * sizes[axes[i]]
        hit = ~done & (np.asarray(size) % pieces == 0)
        out.append((axes[i:], hit))
        done = done | hit
    return out
