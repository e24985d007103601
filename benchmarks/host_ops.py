"""The ops Megatron-core's host issues per MoE block, and its host seconds per op: Runtime.moe_host_ops and
devices.HOST_OP_S / HOST_BWD_OP_S (cost_models/host_issue.py).

Runs one Megatron-core 0.16.1 transformer layer with a MoE MLP (get_gpt_layer_local_spec: RMSNorm, qk norms, rotary,
the router with its aux loss, the alltoall dispatcher's permute, SequentialMLP's SwiGLU experts) on this CPU, world
size 1 over gloo (ep = 1: every expert local), with 2 / 4 / 8 / 16 local experts and without experts (a dense MLP),
8 tokens (the ops' work negligible: what remains is the host's Python, dispatch and autograd). It counts the aten ops
of a forward and of a backward (TorchDispatchMode, views included: each is a dispatch) and times each pass (medians
of --reps after warm-up): seconds per op = time / ops per layer, and the slope of time against ops.
Stand-ins for the calls that need a GPU, each the same number of ops or fewer: the attention core is torch's SDPA (one
op, as TE's fused kernel; the local spec's unfused core allocates on the GPU), the router's gating one fp32 linear
(Megatron's RouterGatingLinear calls TE's GEMM, or fails without TE), the dispatcher's device-to-host copies skipped
(no-ops on CPU tensors; 5 copies on a GPU, not counted), the rotary table built here (RotaryEmbedding moves it to the
GPU); the router and the dispatcher are subclassed on the built layer for the last two. Not counted: the ops ep > 1
adds (the counts' all_gather, the all_to_alls, the chunk sorts) and any CUDA launch; Transformer Engine's fused
kernels (fewer ops) and FP8 casts (more) are not run here.
`--bias` counts only what experts with biases (GPT-OSS) add: TEGroupedMLP._apply_bias (MoEHostOps.bias).
Usage: python benchmarks/host_ops.py [--reps N] [--bias]   (run at nice -n -20 for the timings; ~1 min)
"""

from __future__ import annotations

import argparse
import collections
import os
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

TOKENS, HIDDEN, HEADS, GROUPS, HEAD_DIM = 8, 128, 8, 2, 16


class Count(TorchDispatchMode):
    """Counts every aten op dispatched under it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class SDPA(torch.nn.Module):
    """The fused attention core, one op (TE's DotProductAttention runs cuDNN's fused kernel)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()

    def forward(self, q, k, v, *args, **kwargs):  # type: ignore[no-untyped-def]
        s, b, n, d = q.shape
        o = torch.nn.functional.scaled_dot_product_attention(
            q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), is_causal=True, enable_gqa=True)
        return o.permute(2, 0, 1, 3).reshape(s, b, n * d)


def layer(local: int):  # type: ignore[no-untyped-def]
    """Megatron-core's layer with `local` experts (0: a dense MLP), CPU stand-ins set (module docstring)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe import token_dispatcher as td
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=2, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS, kv_channels=HEAD_DIM,
        ffn_hidden_size=4 * HIDDEN, num_moe_experts=local or None, moe_router_topk=min(8, local) if local else 2,
        moe_ffn_hidden_size=HIDDEN // 2 if local else None, moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3, use_cpu_initialization=True,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, params_dtype=torch.float32, qk_layernorm=True, hidden_dropout=0.0,
        attention_dropout=0.0, bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(num_experts=local or None, qk_layernorm=True, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPA
    if local and td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = object()  # its side stream: unused with CPU tensors
    out = build_module(spec, config=cfg, layer_number=1)
    if local:
        router = type(out.mlp.router)

        class CpuRouter(router):  # type: ignore[misc, valid-type]
            def gating(self, x: torch.Tensor) -> torch.Tensor:
                return torch.nn.functional.linear(x.float(), self.weight.float())

        class CpuDispatcher(td.MoEAlltoAllTokenDispatcher):
            def _maybe_dtoh_and_synchronize(self, point: str, tokens_per_expert=None):  # type: ignore[no-untyped-def]
                return tokens_per_expert  # the device-to-host copies: no-ops on CPU tensors

        out.mlp.router.__class__ = CpuRouter
        out.mlp.token_dispatcher.__class__ = CpuDispatcher
    return out


def measure(local: int, reps: int) -> tuple[int, int, float, float]:
    """(forward ops, backward ops, forward s, backward s) of one layer pass, medians of `reps`."""
    block = layer(local)
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(TOKENS).float(), inv)
    rope = torch.cat((freqs, freqs), -1)[:, None, None, :]
    x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)

    def fwd() -> torch.Tensor:
        out = block(x, attention_mask=None, rotary_pos_emb=rope)
        return out[0] if isinstance(out, tuple) else out

    for _ in range(5):
        fwd().float().sum().backward()
    with Count() as c:
        y = fwd()
    nf = sum(c.ops.values())
    with Count() as c:
        y.float().sum().backward()
    nb = sum(c.ops.values())
    tf, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        y = fwd()
        t1 = time.perf_counter()
        y.float().sum().backward()
        tf.append(t1 - t0)
        tb.append(time.perf_counter() - t1)
    return nf, nb, float(np.median(tf)), float(np.median(tb))


def bias_ops() -> None:
    """The ops experts with biases add (MoEHostOps.bias): TEGroupedMLP._apply_bias, which weights fc2's bias per token
    expert by expert, counted forward and backward at 2 / 4 / 8 / 16 local experts (8 tokens each). Its two inputs are
    leaves here, activations in a block: their two AccumulateGrad detaches are not counted."""
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    rows = []
    for local in (2, 4, 8, 16):
        out = torch.randn(8 * local, HIDDEN, requires_grad=True)
        probs = torch.rand(8 * local, 1, requires_grad=True)
        biases = [torch.randn(HIDDEN, requires_grad=True) for _ in range(local)]
        with Count() as c:
            y = TEGroupedMLP._apply_bias(out, biases, [8] * local, probs)
        nf = sum(c.ops.values())
        grad = torch.randn_like(y)
        with Count() as c:
            torch.autograd.backward(y, grad)
        rows.append((local, nf, sum(c.ops.values()) - 2))
    arr = np.array(rows)
    fwd, bwd = np.polyfit(arr[:, 0], arr[:, 1], 1), np.polyfit(arr[:, 0], arr[:, 2], 1)
    print(f"experts' biases: forward {fwd[1]:.1f} + {fwd[0]:.2f} L, backward {bwd[1]:.1f} + {bwd[0]:.2f} L "
          f"({', '.join(f'{n}: {f} / {b}' for n, f, b in rows)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--bias", action="store_true", help="count only the ops experts with biases add")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if args.bias:
        bias_ops()
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29631")
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    rows = {local: measure(local, args.reps) for local in (0, 2, 4, 8, 16)}
    print("local experts   fwd ops  bwd ops   fwd us   bwd us fwd us/op bwd us/op")
    for local, (nf, nb, tf, tb) in rows.items():
        per = f"{tf / nf * 1e6:9.2f} {tb / nb * 1e6:9.2f}"
        print(f"{local:13d} {nf:9d} {nb:8d} {tf * 1e6:8.0f} {tb * 1e6:8.0f} {per}")
    moe = np.array([rows[k] for k in (2, 4, 8, 16)])
    for name, n, t in (("forward", moe[:, 0], moe[:, 2]), ("backward", moe[:, 1], moe[:, 3])):
        ops = np.polyfit(np.array([2, 4, 8, 16]), n, 1)
        per_op, at0 = np.polyfit(n, t, 1)
        print(f"{name}: ops = {ops[1]:.1f} + {ops[0]:.2f} L; {per_op * 1e6:.2f} us an op (intercept "
              f"{at0 * 1e6:.0f} us)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
