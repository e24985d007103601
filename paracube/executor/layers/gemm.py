"""How a linear multiplies: the plain GEMM of the compute dtype, or FP8 (fp8.py), behind one interface.

A linear (serial.SerialLinear, one_d.ColumnLinear / RowLinear) holds a `gemm` and calls `gemm(x, w)`
(differentiable); autograd Functions that issue their own collectives around the GEMMs (one_d._GatherLinear)
call `gemm.forward(x, w)` and `gemm.backward(x, w, dy) -> (dx, dw)` instead; the rings of collective_matmul.py
(tpo) call `forward` / `dgrad` / `wgrad` on the blocks of X and dY as they arrive (row blocks of a GEMM: the
same math as the whole, FP8 included, since its casts are elementwise with per-tensor scales). `PLAIN` is what
every linear holds unless fp8.attach gave it an Fp8Gemm: `x @ w` exactly as before (autograd's own matmul
backward).
"""

from __future__ import annotations

from torch import Tensor


class PlainGemm:
    """Y = X @ W in the operands' dtype; dX = dY W^T, dW = X^T dY (X's leading dimensions flattened)."""

    def __call__(self, x: Tensor, w: Tensor) -> Tensor:
        return x @ w

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        return x @ w

    def dgrad(self, dy: Tensor, w: Tensor) -> Tensor:
        """dX = dY W^T."""
        return dy @ w.t()

    def wgrad(self, x: Tensor, dy: Tensor) -> Tensor:
        """dW = X^T dY over the flattened leading dimensions."""
        return x.reshape(-1, x.shape[-1]).t() @ dy.reshape(-1, dy.shape[-1])

    def backward(self, x: Tensor, w: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
        return self.dgrad(dy, w), self.wgrad(x, dy)


PLAIN = PlainGemm()

__all__ = ["PLAIN", "PlainGemm"]
