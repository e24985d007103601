"""The MoE block's MLP as the executor runs it (paracube/moe_spec.py describes it; modes/experts.py declares its
traffic; executor/layers/experts.py runs the exchanges): modes none and 1D with sp, experts split ep ways over the
folded expert group, each split etp ways (executor/layers/expert_tensor.py: the etp gathers and reduce-scatters),
cp >= 1 (each cp rank routes its load-balanced chunks: moe_sequence.py).

Per block and micro-batch, a rank's N local tokens x [N, h] (1D + sp: its sequence shards):
- router: scores = softmax(x W_r) (Mixtral, Qwen3-MoE) or sigmoid(x W_r) (DeepSeek-V3, its top-k chosen on
  scores + a score-correction bias, a zero buffer here: the bias-update rule of auxiliary-loss-free balancing is
  not run), in fp32 (fp64 for fp64 copies); the top-k experts per token, their weights the chosen scores
  normalized to sum 1 (HF norm_topk_prob); with MoESpec.probs_on_input (Llama 4) the chosen scores unnormalized,
  multiplying the expert's input instead of its output (transformers' Llama4TextMoe: routed_in = x * sigmoid of
  the top-k logits, in x's dtype; megatron-core 0.16.1 experts.py moe_apply_probs_on_input: permuted_probs *
  hidden_states, cast back, the output then unweighted). `route` (set_routing): an explicit hook choosing the
  experts instead, `route(block index, scores) -> [N, k]` indices (deterministic routing for tests; no patching).
- capacity (spec.capacity_factor c): each expert keeps at most ceil(c N k / E) of the rank's copies, earlier
  tokens first (Megatron-core's drop policy per rank); the dropped copies contribute nothing (their token keeps
  the shared expert and the residual). None: dropless.
- dispatch (sorted by expert) all-to-all over ep, and the copies' weights beside them by a second all-to-all
  ("moe.dispatch_probs", the router's dtype; megatron-core 0.16.1 token_dispatcher.py l.647-673), the rank's E / ep
  experts (SwiGLU MLPs of expert_ffn, gate and up interleaved as executor/layers/llama.py) weighting their
  activation (routed_experts.py, weighted_glu.py: Megatron-core's TEGroupedMLP), combine all-to-all back, an
  unweighted sum per token. probs_on_input: the weights multiply the copies before the dispatch; none is sent.
- shared expert: a SwiGLU of shared_ffn through the mode's linears (1D: column / row split, with sp the sequence
  gathered and reduce-scattered as the dense MLP), times sigmoid(x W_g) where spec.shared_gate (Qwen2-MoE).
- auxiliary load-balancing loss, per sequence (DeepSeek-V3's sequence-wise balance loss, Megatron-core's
  seq_aux_loss): L = aux_loss x sum_e f_e P_e, f_e = E / (k s) x copies routed to e, P_e = mean over the
  sequence's s tokens of the (normalized) scores. Per sequence so that it is the same function in every layout
  (a sequence is whole on a rank, or split over cp and / or tp with sp: the counts are summed over those ranks,
  one all_reduce of [b, E], "moe.aux_counts", moe_sequence.py: Megatron-core's tp_cp group). The training
  objective is mean token loss + mean over the step's sequences of the blocks' L: each block adds s L's gradient
  with the step's loss scale / tokens (set_aux_grad_scale, called by train_step) in backward, Megatron-core's
  MoEAuxLossAutoScaler, so pipelines need no extra loss plumbing. The reported loss is the language-model loss
  alone, as Megatron logs it.

Gradients: router and gate are replicated over tp (1D: summed over tp with sp, Mode1D.sequence_parallel_params);
the experts' are reduced over the expert-data-parallel group (`edp`, parameters tagged `grad_axes`,
data_parallel/grad_sync.py; zero=1 shards their buckets over it), and, zero=0, their squared norm summed over ep and
etp (its shards are distinct elements) for clipping (expert_norm_sq; zero=1: their shards' squares enter the
distributed optimizer's norm over dp x tp, every expert element once, the stage's ranks being edp x ep x etp).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paracube.executor.comm import all_reduce
from paracube.executor.layers.discard import region
from paracube.executor.layers.expert_tensor import ETP, local_experts
from paracube.executor.layers.experts import EP, all_to_all, exchange_counts
from paracube.executor.layers.functional import main_grad, upcast
from paracube.executor.layers.llama import swiglu
from paracube.executor.layers.serial import Mode, SerialLinear
from paracube.executor.layers.shards import make_spec
from paracube.executor.mesh import Mesh
from paracube.executor.model.moe_sequence import sequence_split
from paracube.executor.model.routed_experts import Experts
from paracube.workload import ModelSpec

Route = Callable[[int, Tensor], Tensor]


def is_moe_block(spec: ModelSpec, index: int | None) -> bool:
    return spec.moe is not None and index is not None and spec.moe.is_moe_layer(index)


class _AuxLossScaler(torch.autograd.Function):
    """Identity on the block's output; in backward the aux loss gets `scale` as its gradient (Megatron-core)."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, aux: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def _replicated_linear(mode: Mode, h_in: int, h_out: int, bias: bool = False) -> SerialLinear:
    """A linear every tensor rank holds whole, used on its tokens (1D + sp: sequence shards, its gradient then summed
    over tp with the mode's other sequence-parallel parameters)."""
    lin = SerialLinear(mode.mesh, h_in, h_out, bias)
    lin.fp8 = False  # type: ignore[attr-defined]  # router and gate: no FP8 GEMM (Megatron-core's are not TE linears)
    tensor = mode.mesh.tensor_axes
    for name, shape in (("weight", (h_in, h_out)), ("bias", (h_out,)))[:2 if bias else 1]:
        lin.shard_specs[name] = make_spec(mode.mesh, shape, {}, replicated_axes=tensor)
        if getattr(mode, "sp", False):
            mode.sequence_parallel_params.append(getattr(lin, name))  # type: ignore[attr-defined]
    return lin


class MoEMLP(nn.Module):
    """`modules` (recompute_modules.py): `moe` checkpoints the whole layer (region: router, counts, dispatch, experts,
    combine, aux loss, shared experts all run again in backward; megatron-core moe_layer.py l.432-450), and then
    supersedes moe_act and shared_experts (it drops their tensors already; a discard inside a region's recompute
    would free the recomputed copy, not the one the graph reads); else `shared_experts` checkpoints the shared
    experts (region, their gate included: Megatron's SharedExpertMLP holds it) and `moe_act` discards each expert's
    activation output (Experts._one)."""

    def __init__(self, mode: Mode, index: int, modules: frozenset[str] = frozenset()):
        super().__init__()
        spec, moe = mode.spec, mode.spec.moe
        assert moe is not None
        self.whole = "moe" in modules
        self.shared_region = "shared_experts" in modules and not self.whole
        self.moe, self.mesh, self.index, self.h = moe, mode.mesh, index, spec.hidden
        self.seq_axes, self.seq_ways = sequence_split(mode)  # the ranks holding parts of a sequence (cp x tp with sp)
        self.router = _replicated_linear(mode, spec.hidden, moe.experts, moe.expert_bias)  # GPT-OSS: with a bias
        self.experts = Experts(mode.mesh, moe.experts, spec.hidden, moe.expert_ffn, moe,
                               "moe_act" in modules and not self.whole)
        if moe.router == "sigmoid":  # DeepSeek-V3's score-correction bias (chooses, does not weight)
            self.register_buffer("score_bias", torch.zeros(moe.experts), persistent=False)
        if moe.shared_ffn:
            self.shared = nn.Module()
            self.shared.fc = mode.linear("fc", spec.hidden, 2 * moe.shared_ffn, False)
            self.shared.fc2 = mode.linear("fc2", moe.shared_ffn, spec.hidden, False)
        if moe.shared_gate:
            self.shared_gate = _replicated_linear(mode, spec.hidden, 1)
        self.route: Route | None = None
        self.aux_grad_scale = 0.0  # the step's loss scale / tokens (set_aux_grad_scale); 0: aux loss not trained
        # set to [] to log each forward's copies per expert [E] (a recompute, rc=full, routes alike: not logged)
        self.routing_log: list[Tensor] | None = None

    def _choose(self, scores: Tensor) -> Tensor:
        if self.route is not None:
            return self.route(self.index, scores.detach())
        choice = scores + self.score_bias if self.moe.router == "sigmoid" else scores
        return choice.detach().topk(self.moe.top_k, dim=-1).indices

    def _aux(self, scores: Tensor, idx: Tensor, b: int) -> Tensor:
        """The local part of sum over this rank's sequences of L (module docstring)."""
        E, k = self.moe.experts, self.moe.top_k
        s = scores.shape[0] // b * self.seq_ways
        with torch.no_grad():
            counts = F.one_hot(idx, E).sum(1).view(b, -1, E).sum(1).to(scores.dtype)  # [b, E]
            if self.seq_ways > 1:  # Megatron-core's tp_cp group (moe_sequence.py)
                counts = all_reduce(counts, self.mesh, self.seq_axes, label="moe.aux_counts")
        probs = scores / scores.sum(-1, keepdim=True) if self.moe.router == "sigmoid" else scores
        partial = probs.view(b, -1, E).sum(1) / s
        return self.moe.aux_loss * (counts * E / (k * s) * partial).sum()

    def forward(self, x: Tensor) -> Tensor:
        return region(self._layer, x) if self.whole else self._layer(x)

    def _shared(self, x: Tensor) -> Tensor:
        shared = self.shared.fc2(swiglu(self.shared.fc(x)))
        if self.moe.shared_gate:
            shared = shared * torch.sigmoid(upcast(self.shared_gate(x))).to(shared.dtype)
        return shared

    def _layer(self, x: Tensor) -> Tensor:
        shape, h, moe = x.shape, self.h, self.moe
        xf = x.reshape(-1, h)
        N, E, k = xf.shape[0], moe.experts, moe.top_k
        logits = upcast(xf) @ upcast(self.router.weight)
        if moe.expert_bias:
            logits = logits + upcast(self.router.bias)
        scores = logits.softmax(-1) if moe.router == "softmax" else logits.sigmoid()
        idx = self._choose(scores)
        top = scores.gather(1, idx)
        weights = (top if moe.probs_on_input else top / top.sum(-1, keepdim=True)).reshape(-1)
        flat = idx.reshape(-1)
        keep = torch.ones_like(flat, dtype=torch.bool)
        if moe.capacity_factor is not None:
            capacity = math.ceil(moe.capacity_factor * N * k / E)
            onehot = F.one_hot(flat, E)
            keep = ((onehot.cumsum(0) * onehot).sum(1) - 1) < capacity
        sel = keep.nonzero().squeeze(1)
        sel = sel[torch.argsort(flat[sel], stable=True)]
        counts = torch.bincount(flat[sel], minlength=E)
        if self.routing_log is not None and self.mesh.recorder.current_phase != "bwd":  # not a recompute's
            self.routing_log.append(counts.detach().clone())
        tokens = torch.div(sel, k, rounding_mode="floor")
        w = weights[sel][:, None]  # the chosen copies' weights: on the input (Llama 4) or inside the experts
        if moe.probs_on_input:
            routed = self._experts(xf[tokens] * w.to(xf.dtype), counts, None)
        else:  # weighted inside the activation (routed_experts.py), the weights sent beside the tokens
            routed = self._experts(xf[tokens], counts, w)
        # the unweighted sum per token (the experts weighted their outputs); index_put's accumulate keeps only the
        # token index for backward (index_add keeps its source too: R h), as megatron-core's unpermute does
        # (moe_utils.py l.463-466, scatter_add_ of the permuted tokens; its fused one alike)
        out = xf.new_zeros(N, h).index_put((tokens,), routed, accumulate=True)
        if moe.aux_loss and torch.is_grad_enabled():
            out = _AuxLossScaler.apply(out, self._aux(scores, idx, shape[0]), self.aux_grad_scale * shape[1]
                                       * self.seq_ways)
        out = out.view(shape)
        if moe.shared_ffn:
            out = out + (region(self._shared, x) if self.shared_region else self._shared(x))
        return out

    def _experts(self, routed: Tensor, counts: Tensor, w: Tensor | None) -> Tensor:
        """Copies sorted by expert (and their weights w [R, 1], None where applied already) -> their weighted expert
        outputs, in the same order (dispatch, experts and their etp exchanges: expert_tensor.py, combine)."""
        ep = self.mesh.size(EP)
        if ep * self.mesh.size(ETP) == 1:
            return self.experts(routed, counts.tolist(), w)
        local = counts.view(ep, -1)
        got = exchange_counts(local, self.mesh) if ep > 1 else local  # [source, local expert]
        send, recv = local.sum(1).tolist(), got.sum(1).tolist()
        received = all_to_all(routed, send, recv, self.mesh, "moe.dispatch")
        # the weights beside the tokens, in the router's dtype (megatron-core token_dispatcher.py l.647-673: a second
        # all_to_all of permuted_probs); its backward carries their gradients home
        probs = None if w is None else all_to_all(w, send, recv, self.mesh, "moe.dispatch_probs")
        y = local_experts(self.experts, received, got, probs, self.mesh)
        return all_to_all(y, recv, send, self.mesh, "moe.combine")


# --- model-level hooks ------------------------------------------------------------------------------------
def moe_blocks(model: nn.Module) -> Iterator[MoEMLP]:
    return (m for m in model.modules() if isinstance(m, MoEMLP))


def set_routing(model: nn.Module, route: Route | None) -> None:
    """Explicit routing hook for every MoE block (tests: deterministic routing; None: top-k of the scores)."""
    for block in moe_blocks(model):
        block.route = route


def set_aux_grad_scale(model: nn.Module, scale: float) -> None:
    """The gradient of the loss sum's 1 (train_step: loss scale / tokens per step), given to the aux losses."""
    for block in moe_blocks(model):
        block.aux_grad_scale = scale


def is_expert(p: Tensor) -> bool:
    return hasattr(p, "grad_axes")


def expert_norm_sq(model: nn.Module, mesh: Mesh, device: torch.device) -> Tensor | None:
    """The experts' squared gradient norm, summed over ep (each expert counted once per stage: the edp replicas
    hold the same sums), on the ranks with tensor coordinates 0 (elsewhere 0), so that the step's all_reduce of the
    norm over (pp, tensor axes) adds it once per stage; None without experts (a dense step dispatches no extra op:
    the local-cpu per-op pricing counts them, tests/test_calibration.py)."""
    params = [(n, p) for n, p in model.named_parameters() if is_expert(p)]
    if not params:
        return None
    sq = torch.zeros(1, dtype=torch.float32, device=device)
    for n, p in params:  # etp replicas (GPT-OSS's b2, routed_experts.py) counted on etp index 0
        if all(mesh.coord(a) == 0 for a in model.shard_specs[n].replicated_axes):  # type: ignore[index, union-attr]
            sq += main_grad(p).float().pow(2).sum()
    sq = all_reduce(sq, mesh, EP, label="grad_norm.experts")
    sq = all_reduce(sq, mesh, ETP, label="grad_norm.experts")  # etp > 1: each rank's shards are distinct elements
    return sq if all(mesh.coord(a) == 0 for a in mesh.tensor_axes) else torch.zeros_like(sq)


def moe_init_tensors(spec: ModelSpec, seed: int) -> Iterator[tuple[str, Tensor]]:
    """The MoE blocks' serial initialization (their own generator, so dense tensors keep their draws): normal 0.02,
    output projections 0.02 / sqrt(2 L), as the dense MLP."""
    moe = spec.moe
    if moe is None:
        return
    gen = torch.Generator().manual_seed(seed + 7919)
    h, L, E, fe, fs = spec.hidden, spec.layers, moe.experts, moe.expert_ffn, moe.shared_ffn
    resid = 0.02 / math.sqrt(2 * L)

    def normal(*shape: int, std: float = 0.02) -> Tensor:
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    for i in range(L):
        if not moe.is_moe_layer(i):
            continue
        p = f"blocks.{i}.mlp."
        yield p + "router.weight", normal(h, E)
        yield p + "experts.w1", normal(E, h, 2 * fe)
        yield p + "experts.w2", normal(E, fe, h, std=resid)
        if moe.expert_bias:  # GPT-OSS: drawn after the block's weights (models without keep their draws)
            yield p + "router.bias", normal(E)
            yield p + "experts.b1", normal(E, 2 * fe)
            yield p + "experts.b2", normal(E, h)
        if fs:
            yield p + "shared.fc.weight", normal(h, 2 * fs)
            yield p + "shared.fc2.weight", normal(fs, h, std=resid)
        if moe.shared_gate:
            yield p + "shared_gate.weight", normal(h, 1)


__all__ = ["Experts", "MoEMLP", "expert_norm_sq", "is_expert", "is_moe_block", "moe_init_tensors", "set_aux_grad_scale",
           "set_routing"]
