"""How a linear multiplies: the plain GEMM of the compute dtype, or FP8 (fp8.py), behind one interface.

A linear (serial.SerialLinear, one_d.ColumnLinear / RowLinear) holds a `gemm` and calls `gemm(x, w)`
(differentiable); autograd Functions that issue their own collectives around the GEMMs (one_d._GatherLinear)
call `gemm.forward(x, w)` and `gemm.backward(x, w, dy) -> (dx, dw)` instead. `PLAIN` is what every linear
holds unless fp8.attach gave it an Fp8Gemm: `x @ w` exactly as before (autograd's own matmul backward).
"""

from __future__ import annotations

from torch import Tensor


class PlainGemm:
    """Y = X @ W in the operands' dtype; dX = dY W^T, dW = X^T dY (X's leading dimensions flattened)."""

    def __call__(self, x: Tensor, w: Tensor) -> Tensor:
        return x @ w

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        return x @ w

    def backward(self, x: Tensor, w: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
        dw = x.reshape(-1, x.shape[-1]).t() @ dy.reshape(-1, dy.shape[-1])
        return dy @ w.t(), dw


PLAIN = PlainGemm()

__all__ = ["PLAIN", "PlainGemm"]
