"""Llama 4's blocks as the executor builds them, in one process, against independent references: the chunk mask
(attention_mask.py with attention_chunk.Chunk) against the rule written pair by pair; llama's GQA kernel (flash and
unfused) with chunks, NoPE and the L2 q / k norm against attention computed query by query over exactly the chunk's
keys, with the norm written out (transformers' Llama4TextL2Norm: x rsqrt(mean(x^2) + eps)) (fp64, rel 1e-12: the
same sums in another order, ~1e-16 apart); qk_positions.l2_norm against megatron-core 0.16.1's L2Norm
(transformer/torch_norm.py, installed: an implementation not ours; it computes in fp32 whatever the input, so compared
in fp32); each block's mask and positions by its global
index; and the MoE block with the router's score on the experts' input against transformers' Llama4TextMoe written
out (routed_in = x * sigmoid(top-1 logit); out = shared(x) + expert(routed_in)), fp64.

torchtitan 0.3.0 (installed) has no llama4 module (models/: llama3, qwen3, gpt_oss, deepseek_v3, ...), so it cannot
serve as a reference here; transformers is not installed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import F64, rel_err
from megatron.core.transformer.torch_norm import L2Norm

from paracube.attention_chunk import Chunk
from paracube.executor import build_model
from paracube.executor.layers.attention_mask import ranges_meet, sequence_mask, visible
from paracube.executor.layers.llama import gqa_attention, rotary, rotary_tables
from paracube.executor.layers.qk_positions import QKPositions, l2_norm
from paracube.executor.layers.tokens import window_mask
from paracube.executor.mesh import Mesh
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec

L4 = ModelSpec("l4-llama", layers=4, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, family="llama",
               kv_heads=2, attention_chunk=8, rope_pattern="RRRN", qk_l2_norm=True)
_TINY = PRESETS["tiny-moe"]
L4_MOE = replace(_TINY, name="l4-moe", seq_len=32, attention_chunk=8, rope_pattern="RN", qk_l2_norm=True,
                 moe=replace(_TINY.moe, top_k=1, router="sigmoid", probs_on_input=True))


def rule(i: int, j: int, c: int) -> bool:
    """The contract, one pair: j <= i and both in the same chunk of c."""
    return j <= i and i // c == j // c


@pytest.mark.parametrize("c", [1, 3, 8, 20, 31])
def test_mask_is_the_pair_rule(c: int) -> None:
    s = 32
    want = torch.tensor([[rule(i, j, c) for j in range(s)] for i in range(s)])
    got = sequence_mask(s, Chunk(c), torch.device("cpu"))
    assert got is not None and torch.equal(got, want)
    # a flat block of 24 queries (tokens 40..63) over keys from its first sequence's start (32): two sequences,
    # positions in each sequence from its own start
    got = window_mask((40, 32, s), 24, 32, torch.device("cpu"), Chunk(c))
    want = torch.tensor([[(i // s == j // s) and rule(i % s, j % s, c) for j in range(32, 64)] for i in range(40, 64)])
    assert torch.equal(got, want)
    # a chunk no shorter than the sequence hides nothing: the caller's plain causal path
    assert sequence_mask(s, Chunk(s), torch.device("cpu")) is None


@pytest.mark.parametrize("c", [1, 4, 7, 16])
def test_ranges_meet_is_any_visible_pair(c: int) -> None:
    """Every pair of position ranges in [0, 24): ranges_meet (context parallelism's skip) == visible(...).any()."""
    s = 24
    spans = [(a, b) for a in range(s) for b in range(a + 1, s + 1, 3)]
    for q in spans:
        for k in spans:
            want = bool(visible(torch.arange(*q), torch.arange(*k), Chunk(c)).any())
            assert ranges_meet(q, k, Chunk(c)) == want, (q, k, c)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: int | None) -> torch.Tensor:
    """[b, heads, s, d]: each query's softmax over exactly the keys of `rule` (None: causal)."""
    s, out = q.shape[2], torch.empty_like(q)
    for i in range(s):
        keys = [j for j in range(i + 1) if c is None or rule(i, j, c)]
        scores = q[:, :, i:i + 1] @ k[:, :, keys].transpose(-1, -2) / math.sqrt(q.shape[-1])
        out[:, :, i] = (scores.softmax(-1) @ v[:, :, keys])[:, :, 0]
    return out


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("c", [5, 8, None])
@pytest.mark.parametrize(("rope", "eps"), [(True, 1e-5), (False, None), (True, None)])
def test_gqa_with_chunks_nope_and_the_l2_norm_is_the_naive_attention(flash: bool, c: int | None, rope: bool,
                                                                     eps: float | None) -> None:
    """Rotary (unless NoPE) THEN the L2 norm of q and k (qk_positions.py: the order), then the chunks."""
    gen = torch.Generator().manual_seed(3)
    b, s, kv_heads, group, d = 2, 16, 2, 2, 8
    qkv = torch.randn(b, s, kv_heads * (group + 2) * d, generator=gen, dtype=F64)
    g = qkv.view(b, s, kv_heads, group + 2, d)
    q = g[..., :group, :].reshape(b, s, kv_heads * group, d).transpose(1, 2)
    k = g[..., group, :].transpose(1, 2).repeat_interleave(group, dim=1)
    v = g[..., group + 1, :].transpose(1, 2).repeat_interleave(group, dim=1)
    if rope:
        cos, sin = rotary_tables(s, d, 500000.0, qkv)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
    if eps is not None:
        q, k = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) for t in (q, k))
    want = naive_attention(q, k, v, c).transpose(1, 2).reshape(b, s, -1)
    got = gqa_attention(qkv, kv_heads, group, QKPositions(500000.0, rope, eps), flash,
                        window=None if c is None else Chunk(c))
    assert rel_err(got, want) < 1e-12


def test_l2_norm_is_megatron_cores() -> None:
    """fp32 (megatron-core's L2Norm computes in fp32): the same ops, equal within fp32's rounding (1e-6 relative: a
    fused kernel may order the mean's sum differently)."""
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    assert rel_err(l2_norm(x, 1e-5), L2Norm(16, eps=1e-5)(x)) < 1e-6


def test_each_block_takes_its_mask_and_positions_by_its_global_index() -> None:
    """RRRN over 4 blocks: blocks 0-2 chunked, rotary, L2-normed; block 3 NoPE, full causal, no norm (HF: the norm
    only where use_rope)."""
    model = build_model(L4, Mesh.single(), seed=5)
    windows = [blk.attn.window for blk in model.blocks]
    assert windows == [8, 8, 8, None] and all(isinstance(w, Chunk) for w in windows[:3])
    assert [blk.attn.theta for blk in model.blocks] == [QKPositions(L4.rope_theta, True, L4.rms_eps)] * 3 + [
        QKPositions(L4.rope_theta, False, None)]


def _loss(spec: ModelSpec, fa: int) -> torch.Tensor:
    model = build_model(spec, Mesh.single(parse_layout(f"dp=1,fa={fa}")), seed=5)
    gen = torch.Generator().manual_seed(8)
    ids, labels = (torch.randint(0, spec.vocab, (2, spec.seq_len), generator=gen) for _ in range(2))
    return model(ids, labels)[0].detach()


@pytest.mark.parametrize("fa", [1, 0])
def test_each_feature_is_applied_and_a_chunk_covering_the_sequence_is_bit_identical_to_none(fa: int) -> None:
    loss = _loss(L4, fa)
    for off in ({"attention_chunk": None}, {"rope_pattern": None}, {"qk_l2_norm": False}):
        assert not torch.equal(_loss(replace(L4, **off), fa), loss), off
    plain = _loss(replace(L4, attention_chunk=None), fa)
    assert all(torch.equal(_loss(replace(L4, attention_chunk=c), fa), plain) for c in (32, 100))


def swiglu_ref(y: torch.Tensor) -> torch.Tensor:
    """Gate and up interleaved in the fused columns (executor/layers/llama.py)."""
    return F.silu(y[..., 0::2]) * y[..., 1::2]


@pytest.mark.parametrize("on_input", [True, False])
def test_router_scores_on_the_experts_input_are_llama4s(on_input: bool) -> None:
    """Llama4TextMoe (top-1, sigmoid, unnormalized): out = shared(x) + expert_e(x * sigmoid(logit_e)); scores on the
    output (top-1 normalized: a weight of 1): out = shared(x) + expert_e(x)."""
    spec = replace(L4_MOE, moe=replace(L4_MOE.moe, probs_on_input=on_input))
    mlp = build_model(spec, Mesh.single(), seed=5, dtype=F64).blocks[0].mlp
    x = torch.randn(2, 8, spec.hidden, generator=torch.Generator().manual_seed(6), dtype=F64)
    with torch.no_grad():
        xf = x.reshape(-1, spec.hidden)
        logits = xf @ mlp.router.weight
        e = logits.argmax(-1)
        score = torch.sigmoid(logits.gather(1, e[:, None]))
        routed_in = xf * score if on_input else xf
        routed = torch.stack([swiglu_ref(routed_in[n] @ mlp.experts.w1[e[n]]) @ mlp.experts.w2[e[n]]
                              for n in range(xf.shape[0])])
        want = (routed + mlp.shared.fc2(swiglu_ref(mlp.shared.fc(xf)))).view_as(x)
        assert rel_err(mlp(x), want) < 1e-12
