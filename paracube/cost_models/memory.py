"""Memory per device at the peak of a step, vectorized over layouts.

Static: 16 bytes per local parameter (TrainingSpec: 4 fp32 param + 4 fp32 grad + 8 Adam), with the exact
local parameter count of comm.stage_layers_params (3d: total/q^3, 2d/2.5d: total/q^2, 1d: replicated norms,
row biases and pos_emb).

Activations of one block for one micro-batch (Korthikanti et al. 2022, bytes for 16-bit activations, scaled
by c/2 so fp32 doubles them; s sequence, b micro-batch, h hidden, a heads, t tensor ranks). The paper's
34 sbh = 18 sbh + 4 sbf at f = 4h, so for any f we use X = 18 sbh + 4 sbf (llama SwiGLU: 18 sbh + 6 sbf):
  none:            X + 5 a s^2 b
  1d:              10 sbh + (X - 10 sbh)/t + 5 a s^2 b/t       (= sbh(10 + 24/t + 5as/(ht)) at f = 4h)
  1d + sp:         (X + 5 a s^2 b)/t                            (= sbh/t (34 + 5as/h))
  2d, 2.5d, 3d:    (X + 5 a s^2 b)/t + G    every activation is split over all t ranks (tokens x hidden)
  selective:       drop the 5 a s^2 b terms (34 sbh/t with sp)
  full recompute:  2 sbh / t_act per block (input only; t_act = 1 for 1d without sp), G = 0
G = gathered tensors the 2d/3d linears save for their backward (the executor's backward re-gathers
nothing): 2d/2.5d: c (T/(dq) sum(h_in) (1 - 1/q) + sum(h_in h_out)/q); 3d: c (T/q sum(h_in)/q (1 - 1/q)
+ sum(h_in h_out)/q^2).
Pipeline: blocks on a stage x micro-batches in flight: 1 without pipelining; 1F1B first stage min(pp, N);
interleaved first stage min(N, pp (1 + (pp-1)/(pp v))) (Narayanan factor); last stage 1 (1F1B) or
min(N, 1 + (pp-1)/v) interleaved. Embedding output 4 T h / t_act on the first stage.
Temporaries: the largest linear's gathered operands and output (2d/3d), or gathered input + widest output
(1d), plus fp32 logits and their gradient on the last stage, plus one block's full activations while it
is recomputed (full recompute). The fp32 flat gradient buffer of grad_sync (4 x params, dp > 1) lives
after the activations are freed: temporaries = max(that, buffer - activations).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paracube.cost_models import activations
from paracube.cost_models.comm import stage_layers_params
from paracube.cost_models.dims import Dims

Arr = np.ndarray


def _block_acts(d: Dims, mode: str, a: dict[str, Arr], recompute: str) -> Arr:
    t, q, dd, mb = (a[k].astype(float) for k in ("t", "q", "d", "mb"))
    sp = a["sp"] > 0
    s, h = d.s, d.h
    sbh = mb * s * h
    X = 18 * sbh + (4 if d.family == "gpt" else 6) * mb * s * d.f
    att = 5.0 * d.heads * s * s * mb if recompute == "none" else 0.0
    scale = d.c / 2.0
    if recompute == "full":
        t_act = np.where(sp, t, 1.0) if mode == "1d" else t
        return scale * 2 * sbh / t_act
    if mode == "none":
        return scale * (X + att)
    if mode == "1d":
        return scale * np.where(sp, (X + att) / t, 10 * sbh + (X - 10 * sbh) / t + att / t)
    T = mb * s
    if mode == "3d":
        G = d.c * (T / q * d.sum_hin() / q * (1 - 1 / q) + d.sum_w() / q**2)
    else:
        G = d.c * (T / (dd * q) * d.sum_hin() * (1 - 1 / q) + d.sum_w() / q)
    return scale * (X + att) / t + G


def in_flight(a: dict[str, Arr], N: Arr, first: bool) -> Arr:
    pp, v = a["pp"].astype(float), a["v"].astype(float)
    interleaved = pp * (1 + (pp - 1) / (pp * v)) if first else 1 + (pp - 1) / v
    return np.minimum(N, np.where(v > 1, interleaved, pp if first else 1.0))


def stage_memory(d: Dims, mode: str, a: dict[str, Arr], first: bool, last: bool) -> dict[str, Arr]:
    """Bytes per device of a stage (first / last flags as Python bools) for every layout in `a`."""
    dp, pp, t, q, dd, mb = (a[k] for k in ("dp", "pp", "t", "q", "d", "mb"))
    ones = np.ones(len(dp), dtype=np.int64)
    F, H = (first or False) * ones, (last or False) * ones
    F = np.where(pp == 1, 1, F)
    H = np.where(pp == 1, 1, H)
    n_local = stage_layers_params(d, mode, a, F, H).astype(float)
    N = (d.global_batch // (dp * mb)).astype(float)
    Ls = d.L // pp
    T = (mb * d.s).astype(float)
    t_act = np.where(a["sp"] > 0, t, 1) if mode == "1d" else t
    fl = np.where(F > 0, in_flight(a, N, True), in_flight(a, N, False))
    split = {"none": 1, "1d": t, "2d": q, "2.5d": q, "3d": q * q}[mode]
    V = -(-d.V // split) * split
    if d.activations == "paracube":
        acts = fl * (Ls * activations.block_bytes(d, mode, a) + F * activations.first_stage_bytes(d, mode, a)
                     + H * activations.last_stage_bytes(d, mode, a, V))
    else:
        acts = fl * (Ls * _block_acts(d, mode, a, d.recompute) + F * 4 * T * d.h / t_act)
    # Temporaries of the largest linear.
    c = d.c
    temp = np.zeros_like(T)
    for _, h_in, h_out, _ in [*d.linears, ("head", d.h, 0, False)]:
        h_out = V if h_out == 0 else h_out
        if mode in ("2d", "2.5d"):
            tq = T / (dd * q)
            x = c * (tq * h_in + 2 * h_in * h_out / q + tq * h_out)
        elif mode == "3d":
            x = c * (T / q * h_in / q + 2 * h_in * h_out / q**2 + T / q * h_out / q)
        elif mode == "1d":
            x = c * T * (h_in + h_out / t)
        else:
            x = c * T * (h_in + h_out)
        temp = np.maximum(temp, x)
    temp = temp + H * 2 * 4.0 * T * V / t
    if d.recompute == "full":
        full = d if d.activations == "megatron" else replace(d, recompute="none")
        temp = temp + (_block_acts(d, mode, a, "none") if d.activations == "megatron"
                       else activations.block_bytes(full, mode, a))
    grad_buffer = np.where(dp * (dd if mode == "2.5d" else 1) > 1, 4 * n_local, 0.0)
    temp = np.maximum(temp, grad_buffer - acts)
    return {
        "parameters": 4 * n_local,
        "gradients": 4 * n_local,
        "optimizer": 8 * n_local,
        "activations": acts,
        "temporaries": temp,
    }


def total(mem: dict[str, Arr]) -> Arr:
    return mem["parameters"] + mem["gradients"] + mem["optimizer"] + mem["activations"] + mem["temporaries"]
