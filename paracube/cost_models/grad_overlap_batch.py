"""grad_overlap.py's per-layout functions over a search's batch, with the release profile kept per stage shape.

A release profile depends on the stage's shape only (grad_overlap.release_keys: one row per distinct shape), while
the search scores every configuration on many placements: `stream_window` indexes the rows' results by `rows` (each
layout's row of the profile) instead of the profile itself, and `exposed_grad_time` evaluates
grad_overlap.exposed_grad_time on groups of layouts whose configurations have about the same number of releases,
each group's profile trimmed to its widest (a power of two: few groups). The padding it drops holds only S = 0
entries, which grad_overlap.exposed_grad_time reads as -inf: the result is the same element by element, while a
batch mixing 1F1B stages of a few blocks with pp = 1 stages of a hundred no longer pays the widest for every layout.
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models import grad_overlap
from paracube.cost_models.grad_overlap import Profile

Arr = np.ndarray


def stream_window(profile: Profile, v: Arr, rows: Arr) -> tuple[Arr, Arr]:
    """grad_overlap.stream_window per layout, from a profile and v per row (configuration or stage shape; `rows`:
    each layout's row): a row's window reads only that row."""
    x1, s_end = grad_overlap.stream_window(profile, v)
    return x1[rows], s_end[rows]


def exposed_grad_time(grad: Arr, backward: Arr, stage_index: Arr, pp: Arr, v: Arr, profile: Profile,
                      rows: Arr) -> Arr:
    """grad_overlap.exposed_grad_time per layout (grad, backward, stage_index, pp, v: per layout) from a profile
    per row (configuration or stage shape; `rows`: each layout's row); layouts grouped by their profile's width
    rounded up to a power of two."""
    chunk, frac, share = profile
    width = share.shape[1] if share.ndim == 2 else 0
    if width <= 8 or len(rows) == 0:
        return grad_overlap.exposed_grad_time(grad, backward, stage_index, pp, v, tuple(x[rows] for x in profile))
    live = share > 0
    used = np.where(live.any(axis=1), width - np.argmax(live[:, ::-1], axis=1), 1)  # up to the last S > 0
    cap = np.minimum(2 ** np.ceil(np.log2(np.maximum(used, 1))).astype(np.int64), width)[rows]
    out = np.empty(len(rows))
    for k in np.unique(cap):
        sel = np.nonzero(cap == k)[0]
        r = rows[sel]
        out[sel] = grad_overlap.exposed_grad_time(grad[sel], backward[sel], stage_index[sel], pp[sel], v[sel],
                                                  (chunk[r, :k], frac[r, :k], share[r, :k]))
    return out


def exposed_by_config(grad: Arr, backward: Arr, stage_index: Arr, pp: Arr, v: Arr, profile: Profile, shape: Arr,
                      rows: Arr) -> Arr:
    """exposed_grad_time with stage_index, pp, v and the profile row (`shape`) given per configuration and `rows`
    each layout's configuration (grad, backward: per layout). A configuration's placements share
    -(s + chunk pp), 1 - frac and S: computed once per configuration, then gathered per layout; the same
    operations on the same operands as grad_overlap.exposed_grad_time, in its order, so the same floats
    (grouped by profile width as exposed_grad_time is)."""
    if len(rows) <= 2 * len(shape):  # a layout or two per configuration: nothing shared to gain
        return exposed_grad_time(grad, backward, stage_index[rows], pp[rows], v[rows], profile, shape[rows])
    chunk, frac, share = profile
    lead = -(stage_index[:, None] + chunk[shape] * pp[:, None])  # per configuration
    rest, live = 1.0 - frac[shape], share[shape]
    slot = (backward / np.maximum(v[rows], 1))[:, None]
    width = live.shape[1]
    if width <= 8 or len(rows) == 0:
        groups = [(slice(None), rows, width)]
    else:
        on = share > 0
        used = np.where(on.any(axis=1), width - np.argmax(on[:, ::-1], axis=1), 1)  # up to the last S > 0
        cap = np.minimum(2 ** np.ceil(np.log2(np.maximum(used, 1))).astype(np.int64), width)[shape[rows]]
        groups = [(sel, rows[sel], int(k)) for k in np.unique(cap) for sel in [np.nonzero(cap == k)[0]]]
    out = np.empty(len(rows))
    for sel, r, k in groups:
        sl = slot[sel]
        at = lead[r, :k] * sl - sl * rest[r, :k]
        s_k = live[r, :k]
        out[sel] = np.maximum(0.0, np.where(s_k > 0, at + s_k * grad[sel][:, None], -np.inf).max(axis=1))
    return out


__all__ = ["exposed_by_config", "exposed_grad_time", "stream_window"]
