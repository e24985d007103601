"""FP8 GEMMs of the block linears (`--dtype fp8`): Transformer Engine's hybrid recipe with delayed scaling.

Contract (the recipe is workload.FP8_RECIPE, priced by cost_models/fp8.py): parameters, activations and every
collective stay in the compute dtype (bf16; fp32 master weights in the optimizer); the four linears of every
block (`attach`: each holds an `Fp8Gemm` instead of gemm.PLAIN) multiply FP8 operands with per-tensor scales:
  forward  Y  = (q4(X s_x) q4(W s_w)) / (s_x s_w)
  dgrad    dX = (q5(dY s_g) q4(W s_w)^T) / (s_g s_w)
  wgrad    dW = (q4(X s_x)^T q5(dY s_g)) / (s_x s_g)
q4 / q5 = saturating casts to float8_e4m3fn (max 448) / float8_e5m2 (max 57344). On CUDA the GEMM is
torch._scaled_mm (FP8 tensor cores: row-major A, column-major B, hence the weight's FP8 copy and its
transpose, both held for the step as TE holds them); on CPU (and for fp64 models, or shapes _scaled_mm does not
take) the same numerics are emulated: the FP8 operands are upcast and multiplied in fp32 (fp64 for an fp64 model,
the equivalence tests' precision), then scaled by the inverse scales and cast to the compute dtype.
The weight is cast once per step (first use after `begin_step`; TE's is_first_microbatch) and reused by every
micro-batch and recomputation; X is cast again in backward with the same scale (the same bits as the forward's;
the saved activation stays the compute dtype's X, as without FP8).

Delayed scaling (TE DelayedScaling, transformer_engine/pytorch/fp8.py `_default_get_amax_and_update_history`,
`_default_sf_compute`): each linear keeps amax_history [H, 3] (X, W, dY) whose row 0 collects this step's
amaxes (max over micro-batches); once per step, after backward (`Fp8Scaling.reduce_and_update`), the rows 0 of
every linear of the stage are max-reduced in one fp32 all_reduce over TE's amax reduction group (Megatron-core:
tensor x data-parallel ranks, cost_models/fp8.amax_axes; recorded, predicted by traffic.stage_events), then
  amax = max(history) ("max"; "most_recent": row 0), history rolled by one and row 0 zeroed,
  scale = fp8_max / amax / 2^margin, kept where amax is 0 or not finite (fp32 max where it overflows),
so step k runs on scales from steps <= k-1 (step 1 on scale 1).
Overflow (as fp16's loss scaler, training/loss_scale.py): a non-finite reduced amax on any rank means the step's
tensors overflowed: every rank sees it (the all_reduce; a NaN is sent as inf, since gloo's max drops a NaN met
second), the step is skipped (no optimizer step), the scales are kept and the step's amaxes dropped, so the next
finite step's update recovers them from the finite history; `max_skips` such steps in a row stop the run
(training/loop.py).
With zero=2/3 (data_parallel/fsdp.py) the units gather the bf16 shards and the linear casts the gathered weight
(TE's and torchao's order: the all-gathers stay bf16, as cost_models/fp8.py prices them); the FP8 copy is kept
for the step as without sharding, so backward's re-gather does not cast again. With tpo (1D + sp,
collective_matmul.py) the rings move bf16 blocks and each block's GEMM is this linear's (forward / dgrad /
wgrad on the block, cast with the per-tensor scale): the amaxes are maxima over the blocks, the whole's.
Checkpoints (executor/checkpoint/store.py) hold every linear's amax history and scales (`checkpoint_entries`),
so a resumed run scales as the uninterrupted one did.
Written here rather than taken from Transformer Engine / torchao: TE needs CUDA (the CPU ranks run the same
recipe emulated) and torchao's float8 training is current scaling only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from paracube.errors import check
from paracube.executor.comm import all_reduce
from paracube.executor.layers.gemm import PlainGemm
from paracube.executor.layers.shards import ShardSpec
from paracube.executor.mesh import Mesh
from paracube.workload import FP8_RECIPE, Fp8Recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}  # 448, 57344
X, W, DY = 0, 1, 2  # the three FP8 tensors of a linear (columns of its amax history)
FP8_DTYPES = (torch.bfloat16, torch.float32, torch.float64)  # compute copies FP8 runs with (fp16: refused)
STATE = ("amax_history", "scale", "scale_inv")  # a linear's delayed-scaling state (checkpointed)


def quantize(t: Tensor, scale: Tensor, fmt: torch.dtype) -> Tensor:
    """Saturating cast of t * scale to the FP8 format (in fp64 for an fp64 tensor, else fp32)."""
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    m = FP8_MAX[fmt]
    return (t.to(acc) * scale.to(acc)).clamp(-m, m).to(fmt)


def amax_of(t: Tensor) -> Tensor:
    """max |t| in fp32 (inf / nan propagate: the overflow signal)."""
    return t.detach().abs().amax().float() if t.numel() else torch.zeros((), device=t.device)


def scaled_mm(a: Tensor, b: Tensor, scale_inv: Tensor, out: torch.dtype) -> Tensor:
    """(a @ b) * scale_inv of FP8 operands, in dtype `out`; torch._scaled_mm on CUDA where it applies."""
    if a.is_cuda and out != torch.float64 and a.dim() == 2 and all(n % 16 == 0 for n in (*a.shape, b.shape[1])):
        a = a if a.stride(1) == 1 else a.contiguous()  # row-major A
        b = b if b.stride(0) == 1 else b.t().contiguous().t()  # column-major B
        one = torch.ones((), device=a.device)
        return torch._scaled_mm(a, b, scale_a=scale_inv.float().reshape(()), scale_b=one, out_dtype=out)
    acc = torch.float64 if out == torch.float64 else torch.float32
    return ((a.to(acc) @ b.to(acc)) * scale_inv.to(acc)).to(out)


class _Fp8Matmul(torch.autograd.Function):
    """Y = gemm.forward(X, W); backward gemm.backward (X saved in the compute dtype, as a plain matmul saves it)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, gemm: Fp8Gemm) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.gemm = gemm
        return gemm.forward(x, w)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, w = ctx.saved_tensors
        dx, dw = ctx.gemm.backward(x, w, dy)
        return dx, dw, None


class Fp8Gemm(PlainGemm):
    """One linear's FP8 GEMMs and its delayed-scaling state (scale, scale_inv, amax_history: fp32)."""

    def __init__(self, label: str, recipe: Fp8Recipe = FP8_RECIPE):
        self.label, self.recipe = label, recipe
        self.formats = (FORMATS[recipe.forward_format], FORMATS[recipe.forward_format], FORMATS[recipe.backward_format])
        self.fp8_max = torch.tensor([FP8_MAX[f] for f in self.formats])
        self.amax_history = torch.zeros(recipe.amax_history_len, 3)
        self.scale = torch.ones(3)
        self.scale_inv = torch.ones(3)
        self.wq: Tensor | None = None  # this step's FP8 weight [k, n] and its transpose [n, k]
        self.wq_t: Tensor | None = None

    def __call__(self, x: Tensor, w: Tensor) -> Tensor:
        return _Fp8Matmul.apply(x, w, self)

    def _on(self, device: torch.device) -> None:
        if self.scale.device != device:  # the state follows the model's device (built on CPU, moved later)
            for name in ("fp8_max", "amax_history", "scale", "scale_inv"):
                setattr(self, name, getattr(self, name).to(device))

    def _record(self, i: int, t: Tensor) -> None:
        self.amax_history[0, i] = torch.maximum(self.amax_history[0, i], amax_of(t))

    def _weight(self, w: Tensor) -> tuple[Tensor, Tensor]:
        if self.wq is None or self.wq_t is None:
            self._record(W, w)
            self.wq = quantize(w.detach(), self.scale[W], self.formats[W])
            self.wq_t = self.wq.t().contiguous()
        return self.wq, self.wq_t

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        self._on(x.device)
        self._record(X, x)
        xq = quantize(x, self.scale[X], self.formats[X])
        _, wq_t = self._weight(w)
        y = scaled_mm(xq.reshape(-1, xq.shape[-1]), wq_t.t(), self.scale_inv[X] * self.scale_inv[W], x.dtype)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _grad(self, dy: Tensor) -> Tensor:
        """dY's amax recorded (a max: the blocks of a ring record the whole's), dY [m, n] cast to e5m2."""
        self._on(dy.device)
        self._record(DY, dy)
        return quantize(dy.reshape(-1, dy.shape[-1]), self.scale[DY], self.formats[DY])

    def _dgrad(self, g: Tensor, w: Tensor, lead: tuple[int, ...]) -> Tensor:
        wq, _ = self._weight(w)
        dx = scaled_mm(g, wq.t(), self.scale_inv[DY] * self.scale_inv[W], w.dtype)
        return dx.view(*lead, dx.shape[-1])

    def _wgrad(self, x: Tensor, g: Tensor) -> Tensor:
        xq = quantize(x.reshape(-1, x.shape[-1]), self.scale[X], self.formats[X])  # the forward's bits again
        return scaled_mm(xq.t(), g, self.scale_inv[X] * self.scale_inv[DY], x.dtype)

    def dgrad(self, dy: Tensor, w: Tensor) -> Tensor:
        return self._dgrad(self._grad(dy), w, tuple(dy.shape[:-1]))

    def wgrad(self, x: Tensor, dy: Tensor) -> Tensor:
        return self._wgrad(x, self._grad(dy))

    def backward(self, x: Tensor, w: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
        g = self._grad(dy)  # cast once for both GEMMs
        return self._dgrad(g, w, tuple(dy.shape[:-1])), self._wgrad(x, g)

    def update(self) -> None:
        """The delayed-scaling update after the step's amaxes are reduced (TE's, module docstring)."""
        h, r = self.amax_history, self.recipe
        amax = h.max(dim=0).values if r.amax_compute_algo == "max" else h[0].clone()
        if h.shape[0] > 1:
            h.copy_(torch.roll(h, -1, 0))
        h[0].zero_()
        sf = self.fp8_max / amax / 2.0 ** r.margin
        sf = torch.where((amax > 0) & torch.isfinite(amax), sf, self.scale)
        sf = torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)
        self.scale.copy_(sf)
        self.scale_inv.copy_(1.0 / sf)

    def held_bytes(self) -> int:
        """Bytes of the FP8 weight copies and the scaling state this linear holds."""
        copies = sum(t.numel() * t.element_size() for t in (self.wq, self.wq_t) if t is not None)
        return copies + 4 * (self.scale.numel() + self.scale_inv.numel() + self.amax_history.numel())


class Fp8Scaling:
    """A stage's FP8 linears: the per-step weight casts, the amax reduction and the scale update."""

    def __init__(self, gemms: list[Fp8Gemm], recipe: Fp8Recipe = FP8_RECIPE, max_skips: int = 20):
        self.gemms, self.recipe, self.max_skips = gemms, recipe, max_skips
        self.skips = 0  # overflowing steps in a row

    def begin_step(self) -> None:
        """A step starts: its weights are cast again (they changed in the last optimizer step)."""
        for g in self.gemms:
            g.wq = g.wq_t = None

    def reduce_and_update(self, mesh: Mesh, axes: tuple[str, ...]) -> bool:
        """Max-reduce this step's amaxes over `axes` (one fused fp32 all_reduce) and update every scale; True
        (nothing updated, the step to be skipped) where a reduced amax is not finite."""
        if not self.gemms:
            return False
        current = torch.stack([g.amax_history[0] for g in self.gemms])
        # A NaN goes as inf: gloo's max (a std::max) keeps its first operand where a comparison with NaN is
        # false, so a NaN on one rank would vanish on the others; max keeps an inf everywhere.
        current = torch.where(torch.isnan(current), torch.full_like(current, float("inf")), current)
        current = all_reduce(current, mesh, axes, op="max", label="fp8_amax")
        overflow = not bool(torch.isfinite(current).all())
        for g, row in zip(self.gemms, current, strict=True):
            g.amax_history[0] = 0.0 if overflow else row
            if not overflow:
                g.update()
        self.skips = self.skips + 1 if overflow else 0
        return overflow

    @property
    def exhausted(self) -> bool:
        return self.skips >= self.max_skips

    def checkpoint_entries(self, mesh: Mesh) -> dict[str, tuple[Tensor, ShardSpec]]:
        """`fp8.<linear>.<state>` -> (the tensor itself: a load lands in it, its ShardSpec): every linear's
        amax history, scale and inverse scale, whole. After reduce_and_update every rank of a stage's amax
        group (data x tensor ranks) holds the same values, so the group's first rank writes them and every
        rank reads them; linears are named by their global block index (`blocks.<i>.`), so a checkpoint of
        one layout (pp, tp, dp, zero) loads into another."""
        leader = all(mesh.coord(a) == 0 for a in (*mesh.layout.data_axes, *mesh.layout.tensor_axes))
        out = {}
        for g in self.gemms:
            for name in STATE:
                t = getattr(g, name)
                out[f"fp8.{g.label}.{name}"] = (t, ShardSpec(tuple(t.shape), (0,) * t.dim(), tuple(t.shape), leader,
                                                             mesh.layout.tensor_axes))
        return out

    def held_bytes(self) -> int:
        return sum(g.held_bytes() for g in self.gemms)


def attach(blocks: nn.Module, recipe: Fp8Recipe = FP8_RECIPE) -> Fp8Scaling:
    """Give every linear of `blocks` (modules holding a `gemm`) an Fp8Gemm; their Fp8Scaling."""
    gemms = []
    for name, module in blocks.named_modules():
        if isinstance(getattr(module, "gemm", None), PlainGemm) and getattr(module, "fp8", True):  # opt-out: moe.py
            module.gemm = Fp8Gemm(name, recipe)
            gemms.append(module.gemm)
    check(bool(gemms) or not list(blocks.children()), "fp8: this tensor mode's linears do not run FP8 GEMMs")
    return Fp8Scaling(gemms, recipe)


__all__ = ["FP8_DTYPES", "Fp8Gemm", "Fp8Scaling", "amax_of", "attach", "quantize", "scaled_mm"]
