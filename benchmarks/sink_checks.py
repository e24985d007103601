"""gpu_check's check 5: attention sinks' fused kernels (executor/layers/sink_kernels.py) on the device's own ops.

The fused path runs the flash (causal) or efficient (masked) attention kernel once and merges the sink into its
log-sum-exp; its backward calls the kernel's own backward with (O', L'). On CPU tests/test_sink_kernels.py checks
it in fp64; the CUDA ops (aten._scaled_dot_product_flash_attention / _efficient_attention and their backward) are
checked there only on meta tensors (argument order, shapes). Here, per case (GPT-OSS's shape: 64 query heads of
64 over 8 kv heads, a 4096-token micro-batch cut to `seq`; causal, and a 128-token sliding window), the fused
path's output and dq, dk, dv, ds in the compute dtype against the same attention computed in fp32 by the plain
softmax with a sink column (`reference`), and the padded path's (sinks.padded_sink_flash: one more key through
scaled_dot_product_attention) against the same: the fused path passes where its largest relative error is at
most twice the padded path's plus 1e-3 (both run the same precision; a wrong merge or a misread lse is off by
O(1)). The kernel each case ran is reported (kernel_for: cuda_flash, cuda_efficient, cpu_flash, or None: padded).
A third case runs the window without sinks: functional.flash_attention's masked path (sink_kernels.masked_flash:
the same kernel, the mask rebuilt in backward instead of kept) against scaled_dot_product_attention with the mask,
both against fp32 (out dq dk dv; ds is "-"), with the same rule.
"""

from __future__ import annotations

import math
from typing import Any


def reference(q: Any, k: Any, v: Any, sinks: Any, allowed: Any) -> Any:
    """Softmax attention with one more column s_h per row (value 0), fp32, grouped-query heads expanded."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs, v)


def _run(fn: Any, inputs: list[Any], grad: Any) -> list[Any]:
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*xs)
    out.backward(grad.to(out.dtype))
    return [out.detach().float()] + [x.grad.float() for x in xs]


def _rel(a: Any, b: Any) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check_sinks(device: Any, seq: int = 1024, dtype: Any = None) -> list[dict[str, Any]]:
    import torch

    from paracube.executor.layers.functional import flash_attention
    from paracube.executor.layers.sink_kernels import kernel_for
    from paracube.executor.layers.sinks import padded_sink_flash, sink_flash

    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    gen = torch.Generator().manual_seed(0)
    heads, kv, d, b = 64, 8, 64, 1
    rows = []
    for name, window in (("causal", None), ("window 128", 128)):
        q, k, v = (torch.randn(b, h, seq, d, generator=gen).to(device, dtype) for h in (heads, kv, kv))
        sinks = torch.randn(heads, generator=gen).to(device, torch.float32)
        grad = torch.randn(b, heads, seq, d, generator=gen).to(device)
        i = torch.arange(seq, device=device)
        causal = i[:, None] >= i[None, :]
        allowed = None if window is None else causal & (i[:, None] - i[None, :] < window)
        mask = causal if allowed is None else allowed
        ref = _run(lambda q, k, v, s, m=mask: reference(q, k, v, s, m), [t.float() for t in (q, k, v)] + [sinks],
                   grad)
        fused = _run(lambda q, k, v, s, a=allowed: sink_flash(q, k, v, s, 0.0, None, True, a), [q, k, v, sinks],
                     grad)
        padded = _run(lambda q, k, v, s, a=allowed: padded_sink_flash(q, k, v, s, 0.0, None, True, a),
                      [q, k, v, sinks], grad)
        rows.append(_row(name, kernel_for(q, k, v, allowed), dtype, fused, padded, ref))
        if allowed is not None:  # the same window without sinks: the masked path against SDPA
            none = torch.full_like(sinks, float("-inf"))  # a sink of weight 0: the plain softmax
            ref = _run(lambda q, k, v, m=mask, z=none: reference(q, k, v, z, m), [t.float() for t in (q, k, v)], grad)
            fused = _run(lambda q, k, v, a=allowed: flash_attention(q, k, v, 0.0, None, True, a, lambda: a),
                         [q, k, v], grad)
            plain = _run(lambda q, k, v, a=allowed: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=a, enable_gqa=True), [q, k, v], grad)
            rows.append(_row(f"{name}, no sinks", kernel_for(q, k, v, allowed), dtype, fused, plain, ref))
    return rows


def _row(case: str, kernel: str | None, dtype: Any, fused: list[Any], other: list[Any], ref: list[Any]
         ) -> dict[str, Any]:
    names = ("out", "dq", "dk", "dv", "ds")[:len(ref)]
    err_f = {n: _rel(f, r) for n, f, r in zip(names, fused, ref, strict=True)}
    err_p = {n: _rel(p, r) for n, p, r in zip(names, other, ref, strict=True)}
    passed = all(err_f[n] <= 2 * err_p[n] + 1e-3 for n in names)
    return {"case": case, "kernel": kernel, "dtype": str(dtype).split(".")[-1], "fused": err_f, "padded": err_p,
            "passed": passed}


def report_sinks(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["5. attention sinks: fused kernel vs padded path (no sinks: vs sdpa), max relative error against fp32 "
             "(out dq dk dv ds)"]
    for r in rows:
        f = " ".join(f"{r['fused'][n]:.1e}" if n in r["fused"] else "-" for n in ("out", "dq", "dk", "dv", "ds"))
        p = " ".join(f"{r['padded'][n]:.1e}" if n in r["padded"] else "-" for n in ("out", "dq", "dk", "dv", "ds"))
        other = "padded" if len(r["padded"]) == 5 else "sdpa"
        lines.append(f"   {r['case']:20s} {r['dtype']} kernel {r['kernel']}: fused {f} | {other} {p}: "
                     f"{'PASS' if r['passed'] else 'FAIL'}")
    return lines
