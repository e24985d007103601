"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3, arXiv 2412.19437) as the
executor runs it in tensor modes none and 1D (+ sp), split as Megatron-core's MLASelfAttention splits it.

Per block (x [b, s, h]; MLASpec: r_q = q_lora_rank, r_kv = kv_lora_rank, d_r = qk_rope_head_dim,
d_n = qk_nope_head_dim, d_v = v_head_dim, H heads):
  c_q = RMSNorm_q(x W_dq)            [b, s, r_q]    (no q_lora_rank: c_q = x, q = x W_q)
  [c_kv, k_r] = x W_dkv              [b, s, r_kv + d_r]; c_kv' = RMSNorm_kv(c_kv)
  q = c_q W_uq                       [b, s, H (d_n + d_r)]  -> per head [q_n, q_r]
  [k_n, v] = c_kv' W_ukv             [b, s, H (d_n + d_v)]  -> per head [k_n, v]
  q_r, k_r rotated (llama.rotary: rotate_half form, positions 0..s-1); k_r shared by every head
  o = softmax([q_n, q_r] [k_n, k_r]^T / sqrt(d_n + d_r), causal) v;  y = o W_o   [H d_v, h]
Parameters (registration order, the gradient buckets' order): q_a [h, r_q], q_norm [r_q], q_b [r_q, H(d_n+d_r)],
kv_a [h, r_kv + d_r], kv_norm [r_kv], kv_b [r_kv, H(d_n+d_v)], proj [H d_v, h]; no biases.

1D over `tp` (p ranks), Megatron-core's split: the down projections q_a, kv_a and their norms are replicated
(every rank computes the latents of its tokens), the up projections q_b, kv_b column-parallel over whole heads
(H / p per rank), the output row-parallel. The latent [c_q, c_kv', k_r] (width w = r_q + r_kv + d_r; without
q_lora_rank r_q is h) enters the heads' group ONCE, fused:
- without sp: f on the latent (identity forward, all_reduce of its gradient [T, w] backward: every head's
  share of dc_q, dc_kv' and of the shared rotary key's gradient), then the down projections' and norms'
  gradients and dx are the same on every rank (no further collective);
- with sp (x in sequence shards [b, s/p, h]): the down projections and norms run on the shard, the latent is
  all_gathered over the sequence (backward reduce_scatter, [T, w]); their weights then hold partial gradients
  and join the sequence-parallel parameters' per-step all_reduce (one_d.py), as Megatron-core marks them
  sequence_parallel. The gathered latent is kept for backward (narrower than x: DeepSeek-V3's w = 2112 vs
  h = 7168): no re-gather, unlike the dense column linears.
The output is one_d's RowLinear (g: all_reduce forward; sp: reduce_scatter forward, all_gather backward).
Context parallelism (Layout cp > 1, executor/layers/context_parallel.py's contract): a cp rank holds chunks i and
2 cp - 1 - i of each sequence; everything above runs on its tokens as is (the latent, its f / gather over tp, the
projections), q_r and k_r are rotated at the tokens' global positions, and the core is context_attention over
every cp rank's k [.., d_n + d_r] and v [.., d_v] (ring p2p or all-gather, `cpc`), as Megatron-core hands MLA's
core to Transformer Engine with k_channels = q_head_dim, v_channels = v_head_dim and its cp_comm_type
(multi_latent_attention.py l.155-165). Dropout on the probabilities and fa=0 are refused under cp (sizes.py).
Differences from transformers' DeepseekV3Attention, by choice: the rotary pairs in rotate_half order (its
rope_interleave=True pairs adjacent columns: the same model up to a fixed permutation of the rope columns of
W_uq and W_dkv), the softmax scale 1 / sqrt(d_n + d_r) without YaRN's mscale (no rope scaling is modelled).
--dtype fp8 (executor/layers/fp8.py): the seven linears (q_a, q_b, kv_a, kv_b, proj and the MLP's two; without
q_lora_rank six) run FP8 GEMMs as every block linear does, the latent's norms and the core stay in the compute
dtype (Megatron-core's MLA is TE linears throughout; cost_models/mla.fp8_linears prices their casts and amaxes).
The cost model prices exactly these (cost_models/mla.py, modes/one_d.py). Why hand-written: torch has no MLA module,
and the block must run through paracube's recorded collectives and shard specs like every other layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import Tensor, nn

from paracube.executor.comm import copy_to_group, gather_fn
from paracube.executor.layers.attention_mask import sequence_mask
from paracube.executor.layers.context_parallel import chunk_positions, context_attention
from paracube.executor.layers.discard import Discard, region
from paracube.executor.layers.functional import compute_dtype, core_attention, flash_attention
from paracube.executor.layers.gemm import PLAIN, PlainGemm
from paracube.executor.layers.llama import decoder_init_tensors, rotary, rotary_tables
from paracube.executor.layers.serial import Mode, SerialLinear, SerialRMSNorm, ShardedModule
from paracube.executor.layers.shards import block, make_spec
from paracube.executor.mesh import Mesh
from paracube.moe_spec import MLASpec
from paracube.workload import ModelSpec

SEQ = 1  # the sequence dimension of [b, s, h] activations (1D + sp splits it)


def _replicated(module: ShardedModule, mesh: Mesh, axes: tuple[str, ...]) -> ShardedModule:
    """Every parameter of `module` whole on each rank of `axes` (counted once, on index 0)."""
    for name, spec in module.shard_specs.items():
        module.shard_specs[name] = make_spec(mesh, spec.global_shape, {}, replicated_axes=axes)
    return module


class HeadColumns(ShardedModule):
    """[h_in, h_out] split by columns over `axes` (whole heads); no collective of its own: its input, the latent,
    entered the heads' group once (module docstring). Its `gemm` is fp8.attach's to replace, as a linear's."""

    gemm: PlainGemm = PLAIN

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, axes: tuple[str, ...]):
        super().__init__()
        self.add_param("weight", make_spec(mesh, (h_in, h_out), {1: block(h_out, mesh, axes)}))

    def forward(self, x: Tensor) -> Tensor:
        return self.gemm(x, self.weight.to(compute_dtype(x)))


def _down(mesh: Mesh, h_in: int, h_out: int, axes: tuple[str, ...]) -> ShardedModule:
    return _replicated(SerialLinear(mesh, h_in, h_out, False), mesh, axes)


def mla_rope(q: Tensor, kv: Tensor, k_rope: Tensor, heads: int, mla: MLASpec, theta: float,
             cp: tuple[Mesh, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The heads' queries, keys and values [b, H, s, d_n + d_r], [b, H, s, d_n + d_r], [b, H, s, d_v] from the up
    projections q [b, s, H (d_n + d_r)], kv [b, s, H (d_n + d_v)] and the shared rotary key k_rope [b, s, d_r]: q_r
    and k_r rotated, k_r given to every head (Megatron-core's qkv_up_proj_and_rope_apply after its GEMMs,
    multi_latent_attention.py ~l.760-836). cp (mesh, s): the tokens are a cp rank's chunks of sequences of s,
    rotated at their global positions (context_parallel.chunk_positions; Megatron-core's RotaryEmbedding with its
    cp_group, multi_latent_attention.py l.129-135, rope_utils.get_pos_emb_on_this_cp_rank l.48-70)."""
    b, s, _ = q.shape
    dn, dr, dv = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    q_nope, q_rope = q.view(b, s, heads, dn + dr).transpose(1, 2).split([dn, dr], dim=-1)
    k_nope, v = kv.view(b, s, heads, dn + dv).transpose(1, 2).split([dn, dv], dim=-1)
    if cp is None:
        cos, sin = rotary_tables(s, dr, theta, q)
    else:
        mesh, whole = cp
        cos, sin = rotary_tables(whole, dr, theta, q)
        pos = chunk_positions(whole, mesh.layout.cp, mesh.coord("cp"), q.device)
        cos, sin = cos[pos], sin[pos]  # indexed once: q's and k_r's rotations save the same two tables
    q_rope, k_r = rotary(q_rope, cos, sin), rotary(k_rope.unsqueeze(1), cos, sin)
    q = torch.cat([q_nope, q_rope], dim=-1)
    k = torch.cat([k_nope, k_r.expand(b, heads, s, dr)], dim=-1)
    return q, k, v.contiguous()  # backward keeps v alone, not the whole kv_b output it is a view of


def mla_attend(q: Tensor, k: Tensor, v: Tensor, flash: bool = True, p: float = 0.0, seed: int | None = None,
               window: int | None = None) -> Tensor:
    """Causal attention of the heads' q, k, v (mla_rope) -> [b, s, H d_v], within the block's sliding window
    `window` (attention_mask.py; None: full causal). flash: scaled_dot_product_attention, else Megatron's unfused
    core."""
    b, heads, s, dv = v.shape
    d = q.shape[-1]
    remake = partial(sequence_mask, s, window, q.device)
    allowed = remake()  # None: the plain causal path (a window >= s included)
    if flash:
        out = flash_attention(q, k, v, p, seed, allowed=allowed, remake=remake)
    else:
        n = b * heads
        out = core_attention(q.reshape(n, s, d), k.reshape(n, s, d), v.reshape(n, s, dv), p,
                             seed, allowed).view(b, heads, s, dv)
    return out.transpose(1, 2).reshape(b, s, heads * dv)


def mla_context(q: Tensor, k: Tensor, v: Tensor, mesh: Mesh, s: int, window: int | None) -> Tensor:
    """mla_attend of a cp rank's chunks (q, k, v from mla_rope with cp) over every cp rank's keys and values:
    context_parallel.context_attention with keys of d_n + d_r and values of d_v per head -> [b, s / cp, H d_v]."""
    b, heads, n, dv = v.shape
    return context_attention(q, k, v, mesh, s, window).transpose(1, 2).reshape(b, n, heads * dv)


def mla_core(q: Tensor, kv: Tensor, k_rope: Tensor, heads: int, mla: MLASpec, theta: float, flash: bool = True,
             p: float = 0.0, seed: int | None = None, window: int | None = None) -> Tensor:
    """Causal attention of whole sequences: q [b, s, H (d_n + d_r)], kv [b, s, H (d_n + d_v)], k_rope [b, s, d_r]
    (shared by the heads) -> [b, s, H d_v]: mla_rope, then mla_attend."""
    return mla_attend(*mla_rope(q, kv, k_rope, heads, mla, theta), flash, p, seed, window)


class MLAttention(nn.Module):
    """The block's attention for a model with `spec.mla` (module docstring), built from any Mode that keeps
    whole sequences per tensor rank with heads split over its tensor axes (none, 1D)."""

    def __init__(self, mode: Mode, modules: frozenset[str] = frozenset(), flash: bool = True,
                 window: int | None = None):
        super().__init__()
        spec, mesh = mode.spec, mode.mesh
        self.window = window  # the block's sliding window (ModelSpec.attention_window), None: full causal
        mla = spec.mla
        assert mla is not None
        self.mla, self.mode, self.mesh = mla, mode, mesh
        self.flash, self.p, self.theta = flash, spec.attention_dropout, spec.rope_theta
        # recompute_modules.py: core_attn (region of the core), mla_up_proj (discard of q, k, v: module docstring)
        self.selective, self.up_proj = "core_attn" in modules, "mla_up_proj" in modules
        self.heads = mode.heads_local
        self.axes = mesh.layout.tensor_axes  # (): none; ("tp",): 1D (other modes are refused: executor/sizes.py)
        self.sp = bool(mesh.layout.sequence_parallel) and mesh.size(self.axes) > 1
        h, H, axes = spec.hidden, spec.heads, self.axes
        qk = mla.qk_head_dim
        shards: list[nn.Parameter] = []  # used on sequence shards (sp): partial gradients, summed over tp
        if mla.q_lora_rank:
            self.q_a = _down(mesh, h, mla.q_lora_rank, axes)
            self.q_norm = _replicated(SerialRMSNorm(mesh, mla.q_lora_rank, spec.rms_eps), mesh, axes)
            shards += [self.q_a.weight, self.q_norm.weight]
        self.q_b = HeadColumns(mesh, mla.q_lora_rank or h, H * qk, axes)
        self.kv_a = _down(mesh, h, mla.kv_lora_rank + mla.qk_rope_head_dim, axes)
        self.kv_norm = _replicated(SerialRMSNorm(mesh, mla.kv_lora_rank, spec.rms_eps), mesh, axes)
        self.kv_b = HeadColumns(mesh, mla.kv_lora_rank, H * (mla.qk_nope_head_dim + mla.v_head_dim), axes)
        self.proj = mode.linear("proj", H * mla.v_head_dim, h, False)  # row-parallel in 1D
        shards += [self.kv_a.weight, self.kv_norm.weight]
        if self.sp:
            mode.sequence_parallel_params.extend(shards)  # type: ignore[attr-defined]  # Mode1D's list

    def latent(self, x: Tensor) -> Tensor:
        """[c_q, c_kv', k_r] of x's tokens, in the compute dtype, entered into the heads' group (f or gather)."""
        m, c = self.mla, compute_dtype(x)
        c_kv, k_rope = self.kv_a(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        c_q = self.q_norm(self.q_a(x)) if m.q_lora_rank else x
        lat = torch.cat([c_q.to(c), self.kv_norm(c_kv).to(c), k_rope.to(c)], dim=-1)
        if self.sp:
            return gather_fn(lat, self.mesh, self.axes, SEQ, label="attn.latent.in")
        return copy_to_group(lat, self.mesh, self.axes, label="attn.latent.f")

    def forward(self, x: Tensor, seed: int | None = None, s: int = 0) -> Tensor:
        """x: [b, s, h] (1D + sp: [b, s / p, h]) of whole sequences; with cp a cp rank's chunks of sequences of s
        tokens ([b, s / cp, h], sp: [b, s / (cp p), h])."""
        m = self.mla
        c_q, c_kv, k_rope = self.latent(x).split(
            [m.q_lora_rank or self.mode.spec.hidden, m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        if self.mesh.layout.cp > 1:
            return self.proj(self._context(c_q, c_kv, k_rope, s))
        if self.up_proj and torch.is_grad_enabled():
            # mla_up_proj (Megatron-core's qkv_up_checkpoint, multi_latent_attention.py l.344, 838): the up
            # projections and rotary run without a graph, their q, k, v freed once the core used them and made
            # again (GEMMs included) right before the core's backward.
            ckpt = Discard(lambda cq, ckv, kr: mla_rope(self.q_b(cq), self.kv_b(ckv), kr, self.heads, m, self.theta))
            q, k, v = ckpt(c_q, c_kv, k_rope)
            core = (q, k, v, self.flash, self.p, seed, self.window)
            out = region(mla_attend, *core) if self.selective else mla_attend(*core)
            ckpt.discard(out)
            return self.proj(out)
        args = (self.q_b(c_q), self.kv_b(c_kv), k_rope, self.heads, m, self.theta, self.flash, self.p, seed,
                self.window)
        # core_attn (Korthikanti et al.): keep q, kv and k_r, redo rotary and the core in backward.
        out = region(mla_core, *args) if self.selective else mla_core(*args)
        return self.proj(out)

    def _context(self, c_q: Tensor, c_kv: Tensor, k_rope: Tensor, s: int) -> Tensor:
        """The core under cp (mla_context): keys and values exchanged over cp. As the dense cp path
        (context_parallel.py), core_attn leaves it alone (redoing it would exchange again: activations.py prices it
        kept); mla_up_proj discards and remakes q, k, v around it as without cp."""
        m, cp = self.mla, (self.mesh, s)
        if self.up_proj and torch.is_grad_enabled():
            ckpt = Discard(lambda cq, ckv, kr: mla_rope(self.q_b(cq), self.kv_b(ckv), kr, self.heads, m, self.theta,
                                                        cp))
            out = mla_context(*ckpt(c_q, c_kv, k_rope), self.mesh, s, self.window)
            ckpt.discard(out)
            return out
        q, k, v = mla_rope(self.q_b(c_q), self.kv_b(c_kv), k_rope, self.heads, m, self.theta, cp)
        return mla_context(q, k, v, self.mesh, s, self.window)


def mla_init_tensors(spec: ModelSpec, seed: int) -> Iterator[tuple[str, Tensor]]:
    """llama.decoder_init_tensors with MLA: the query's down projection and norm (q_lora_rank), its up projection,
    the compressed key-value's down projection, norm and up projection, and the output projection (0.02 /
    sqrt(2 L), as llama's)."""
    mla = spec.mla
    assert mla is not None
    h, H = spec.hidden, spec.heads

    def attention(p: str, normal: Callable[..., Tensor], resid_std: float) -> Iterator[tuple[str, Tensor]]:
        if mla.q_lora_rank:
            yield p + "q_a.weight", normal(h, mla.q_lora_rank)
            yield p + "q_norm.weight", torch.ones(mla.q_lora_rank)
        yield p + "q_b.weight", normal(mla.q_lora_rank or h, H * mla.qk_head_dim)
        yield p + "kv_a.weight", normal(h, mla.kv_lora_rank + mla.qk_rope_head_dim)
        yield p + "kv_norm.weight", torch.ones(mla.kv_lora_rank)
        yield p + "kv_b.weight", normal(mla.kv_lora_rank, H * (mla.qk_nope_head_dim + mla.v_head_dim))
        yield p + "proj.weight", normal(H * mla.v_head_dim, h, std=resid_std)

    return decoder_init_tensors(spec, seed, attention)


__all__ = ["HeadColumns", "MLAttention", "mla_attend", "mla_context", "mla_core", "mla_init_tensors", "mla_rope"]
