"""Mixture-of-experts blocks and multi-head latent attention: what a ModelSpec's `moe` and `mla` describe.

MoE block (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Mixtral, Jiang et al. 2024; DeepSeek-V3,
arXiv 2412.19437): a router [h, E] scores each token, the top-k of `experts` routed experts (SwiGLU MLPs of
`expert_ffn`) process it, weighted by the router's softmax (Mixtral, Qwen3-MoE) or sigmoid (DeepSeek-V3)
scores, and `shared_ffn` is the intermediate size of the shared expert(s) every token passes (DeepSeek:
n_shared_experts x moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size, with a sigmoid gate
[h, 1] when `shared_gate`). Block i (0-based) is an MoE block when i >= `first_dense` and (i + 1) is a
multiple of `sparse_step` (HF first_k_dense_replace, decoder_sparse_step); the others keep the dense MLP of
the model's `ffn_hidden`. `capacity_factor` None: dropless (every routed token is processed); else each
expert processes at most capacity_factor x tokens x top_k / experts tokens. `aux_loss`: the coefficient of
the load-balancing loss (Switch Transformer's, HF router_aux_loss_coef). `imbalance`: the ratio of the most
loaded expert's tokens to the balanced share the cost model prices (1.0 = force-balanced routing, as
published benchmarks run it). `groups` / `group_topk`: group-limited (node-limited) routing, DeepSeek-V3's
(arXiv 2412.19437 Section 2.1.2: each token to at most 4 nodes; HF n_group / topk_group): the experts form `groups`
equal groups and a token's top-k lie in the `group_topk` best (1 / 1: no limit). `probs_on_input`: the router's
score multiplies the token before its expert (Llama 4: Llama4TextMoe scales routed_in by sigmoid of the top-1 logit,
unnormalized; Megatron --moe-apply-probs-on-input, top-1 only), not the expert's output: a multiply of the same
[tokens, h] size moved, the same FLOPs and bytes, a different model (SwiGLU is not linear).
GPT-OSS's experts (gpt_oss_spec.py): `expert_bias` (router bias [E], each expert's gate+up bias [2 f_e] and down
bias [h]), `swiglu_limit` / `swiglu_alpha` (the clamped SwiGLU; None: plain silu(gate) x up).

Parameters of one MoE block's MLP part: router h E (+ E for sigmoid routing's score-correction bias),
E x 3 h f_e routed, 3 h f_s shared (+ h for the shared gate); expert_bias: + E (router) + E (2 f_e + h). Active
per token: router, k x 3 h f_e (+ k (2 f_e + h) biases), shared.

MLA (DeepSeek-V2, arXiv 2405.04434, Section 2.1): q = W_uq norm(W_dq x) (or W_q x without `q_lora_rank`),
[c_kv, k_rope] = W_dkv x (kv_lora_rank + qk_rope_head_dim columns), [k_nope, v] = W_ukv norm(c_kv);
per head qk_nope_head_dim + qk_rope_head_dim query/key columns and v_head_dim value columns; the output
projection [heads v_head_dim, h]. The KV cache per token is kv_lora_rank + qk_rope_head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from paracube.errors import ParacubeError, check, divisors_text
from paracube.gpt_oss_spec import SWIGLU_ALPHA, validate_experts

Router = Literal["softmax", "sigmoid"]


def _positive(where: str, obj: Any, attrs: tuple[str, ...]) -> None:
    for attr in attrs:
        value = getattr(obj, attr)
        check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
              f"{where}: {attr}={value!r} must be a positive integer")


# What a runtime does with a capacity factor (Runtime.moe_capacity): pad every expert to it, drop beyond it without
# padding, or run dropless only (MoESpec.load)
CAPACITY_RULES = ("pad", "drop", "none")


@dataclass(frozen=True)
class MoESpec:
    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int = 0
    shared_gate: bool = False
    router: Router = "softmax"
    first_dense: int = 0
    sparse_step: int = 1
    capacity_factor: float | None = None
    aux_loss: float = 0.0
    imbalance: float = 1.0
    groups: int = 1  # routing groups of experts (HF deepseek_v3 n_group; Megatron-core moe_router_num_groups)
    group_topk: int = 1  # groups a token's experts may lie in (HF topk_group; moe_router_group_topk)
    probs_on_input: bool = False  # the score scales the expert's input (Llama 4), not its output
    expert_bias: bool = False  # GPT-OSS: router and experts' linears have biases (gpt_oss_spec.py)
    swiglu_limit: float | None = None  # GPT-OSS's clamped SwiGLU (gpt_oss_spec.py); None: plain SwiGLU
    swiglu_alpha: float = SWIGLU_ALPHA  # its gate's sigmoid slope (read only with swiglu_limit)

    def validate(self, where: str) -> None:
        _positive(where, self, ("experts", "top_k", "expert_ffn", "sparse_step"))
        check(self.top_k <= self.experts,
              f"{where}: top_k={self.top_k} > experts={self.experts}; valid: 1..{self.experts}")
        check(isinstance(self.shared_ffn, int) and self.shared_ffn >= 0,
              f"{where}: shared_ffn={self.shared_ffn!r} must be a non-negative integer")
        check(not self.shared_gate or self.shared_ffn > 0,
              f"{where}: shared_gate needs a shared expert (shared_ffn > 0)")
        check(isinstance(self.probs_on_input, bool),
              f"{where}: probs_on_input={self.probs_on_input!r} must be true or false")
        validate_experts(self, where)
        check(self.router in ("softmax", "sigmoid"), f"{where}: router={self.router!r}; valid: softmax, sigmoid")
        check(isinstance(self.first_dense, int) and self.first_dense >= 0,
              f"{where}: first_dense={self.first_dense!r} must be a non-negative integer")
        check(self.capacity_factor is None or (isinstance(self.capacity_factor, (int, float))
                                               and self.capacity_factor > 0),
              f"{where}: capacity_factor={self.capacity_factor!r} must be a positive number or null (dropless)")
        check(isinstance(self.aux_loss, (int, float)) and self.aux_loss >= 0,
              f"{where}: aux_loss={self.aux_loss!r} must be a non-negative number")
        _positive(where, self, ("groups", "group_topk"))
        if self.experts % self.groups:
            raise ParacubeError(f"{where}: groups={self.groups} must divide the {self.experts} experts; valid: "
                                f"{divisors_text(self.experts)}")
        check(self.group_topk <= self.groups,
              f"{where}: group_topk={self.group_topk} > groups={self.groups}; valid: 1..{self.groups}")
        check(self.top_k <= self.group_topk * self.experts // self.groups,
              f"{where}: top_k={self.top_k} exceeds the {self.group_topk * self.experts // self.groups} experts of "
              f"group_topk={self.group_topk} groups; raise group_topk")
        check(isinstance(self.imbalance, (int, float)) and 1.0 <= self.imbalance <= self.experts,
              f"{where}: imbalance={self.imbalance!r} must be in [1, experts={self.experts}] "
              "(1.0 = balanced routing)")

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_dense and (i + 1) % self.sparse_step == 0

    def moe_layers(self, layers: int) -> int:
        return sum(self.is_moe_layer(i) for i in range(layers))

    def mlp_parameters(self, h: int) -> int:
        """Router, routed experts, shared expert (and gate) of one MoE block."""
        bias = self.experts if self.router == "sigmoid" else 0
        return h * self.experts + bias + self.bias_parameters(h, self.experts) \
            + self.experts * 3 * h * self.expert_ffn + 3 * h * self.shared_ffn + (h if self.shared_gate else 0)

    def active_mlp_parameters(self, h: int) -> int:
        """What one token's forward multiplies by: router, its top_k experts, the shared expert."""
        return h * self.experts + self.bias_parameters(h, self.top_k) + self.top_k * 3 * h * self.expert_ffn \
            + 3 * h * self.shared_ffn + (h if self.shared_gate else 0)

    def bias_parameters(self, h: int, experts: int) -> int:
        """expert_bias: the router's E and `experts` experts' 2 f_e + h (0 without)."""
        return self.experts + experts * (2 * self.expert_ffn + h) if self.expert_bias else 0

    def load(self, capacity_rule: str) -> float:
        """The busiest expert's tokens over the balanced share, as the cost models price them under a runtime's
        capacity rule (CAPACITY_RULES; Runtime.moe_capacity): dropless, `imbalance`; with a capacity factor, "pad"
        gives every expert exactly its capacity (dropped beyond it, padded up to it), "drop" (and "none") the
        imbalance capped at the capacity."""
        if not self.capacity_factor:
            return self.imbalance
        return self.capacity_factor if capacity_rule == "pad" else min(self.imbalance, self.capacity_factor)

    def expert_tokens(self, tokens: int, capacity_rule: str) -> float:
        """Tokens the most loaded expert processes out of `tokens` routed ones (imbalance, capacity)."""
        return tokens * self.top_k / self.experts * self.load(capacity_rule)


@dataclass(frozen=True)
class MLASpec:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def validate(self, where: str) -> None:
        _positive(where, self, ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
        check(self.q_lora_rank is None or (isinstance(self.q_lora_rank, int) and self.q_lora_rank > 0),
              f"{where}: q_lora_rank={self.q_lora_rank!r} must be a positive integer or null (no query compression)")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def linears(self, h: int, heads: int) -> tuple[tuple[str, int, int], ...]:
        """(name, h_in, h_out) of the attention's linears (norms aside)."""
        q = ((("q_a", h, self.q_lora_rank), ("q_b", self.q_lora_rank, heads * self.qk_head_dim))
             if self.q_lora_rank else (("q", h, heads * self.qk_head_dim),))
        return (*q, ("kv_a", h, self.kv_lora_rank + self.qk_rope_head_dim),
                ("kv_b", self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim)),
                ("o", heads * self.v_head_dim, h))

    def attention_parameters(self, h: int, heads: int) -> int:
        norms = self.kv_lora_rank + (self.q_lora_rank or 0)
        return sum(a * b for _, a, b in self.linears(h, heads)) + norms

    def kv_per_token(self) -> int:
        """Cached elements per token and layer (the compressed latent and the shared rotary key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _from_dict(cls: type, data: Any, where: str, key: str, required: tuple[str, ...], why: str = "") -> Any:
    """`data` (a mapping of cls's fields, or already a cls, or None) as a cls; one line naming what is wrong."""
    if data is None or isinstance(data, cls):
        return data
    fields = sorted(cls.__dataclass_fields__)
    check(isinstance(data, dict), f"{where}: {key} must be a mapping of {fields}")
    bad = sorted(set(data) - set(fields))
    check(not bad, f"{where}: unknown {key} fields {bad}; valid: {fields}")
    missing = sorted(set(required) - set(data))
    check(not missing, f"{where}: {key} is missing {missing}{why}")
    return cls(**data)


def moe_from_dict(data: Any, where: str) -> MoESpec | None:
    return _from_dict(MoESpec, data, where, "moe", ("experts", "top_k", "expert_ffn"),
                      " (a routed-expert block needs its sizes)")


def mla_from_dict(data: Any, where: str) -> MLASpec | None:
    return _from_dict(MLASpec, data, where, "mla",
                      ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
