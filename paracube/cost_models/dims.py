"""Model dimensions the cost formulas need, and the exact parameter count each rank stores.

Linears of one block (h_in, h_out, has_bias), fused as the executor fuses them:
- gpt:   qkv [h, 3h], proj [h, h], fc [h, f], fc2 [f, h], all with biases; 2 LayerNorms (gamma, beta).
- llama: qkv [h, h + 2 kv] (GQA: kv = kv_heads * head_dim), proj [h, h], gate+up [h, 2f], down [f, h],
  no biases; 2 RMSNorms (gamma only). Cost only: the executor trains gpt.
The vocabulary is padded up to a multiple of the vocab split for cost purposes (`padded_vocab`); the
executor itself requires exact divisibility (see validity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.workload import ModelSpec, TrainingSpec

DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Dims:
    L: int  # layers
    h: int
    f: int
    V: int
    s: int  # training sequence length (tokens per sequence)
    s_model: int  # positions of the learned position table (gpt)
    heads: int
    kv: int  # kv_heads * head_dim (== h without GQA)
    family: str
    c: int  # compute dtype bytes
    dtype: str  # torch dtype name of the compute dtype
    recompute: str
    global_batch: int
    activations: str = "paracube"  # TrainingSpec.activations: whose saved tensors memory.py counts

    @property
    def linears(self) -> tuple[tuple[str, int, int, bool], ...]:
        h, f = self.h, self.f
        if self.family == "gpt":
            return (("qkv", h, 3 * h, True), ("proj", h, h, True), ("fc", h, f, True), ("fc2", f, h, True))
        return (
            ("qkv", h, h + 2 * self.kv, False),
            ("proj", h, h, False),
            ("fc", h, 2 * f, False),
            ("fc2", f, h, False),
        )

    @property
    def norm_vectors(self) -> int:
        """Parameter vectors of length h per norm (gamma, beta for LayerNorm; gamma for RMSNorm)."""
        return 2 if self.family == "gpt" else 1

    @property
    def stat_width(self) -> int:
        """Statistics per token a distributed norm reduces (sum, sum of squares; RMSNorm: sum of squares)."""
        return 2 if self.family == "gpt" else 1

    @property
    def pos_params(self) -> int:
        return self.s_model * self.h if self.family == "gpt" else 0

    @property
    def row_bias(self) -> int:
        """Bias elements of the two row-parallel linears (replicated in 1D)."""
        return 2 * self.h if self.family == "gpt" else 0

    def sum_hin(self) -> int:
        return sum(li[1] for li in self.linears)

    def sum_hout(self) -> int:
        return sum(li[2] for li in self.linears)

    def sum_w(self) -> int:
        return sum(li[1] * li[2] for li in self.linears)

    def sum_bias(self) -> int:
        return sum(li[2] for li in self.linears if li[3])

    def layer_params(self) -> int:
        return self.sum_w() + self.sum_bias() + 2 * self.norm_vectors * self.h


def dims_of(model: ModelSpec, training: TrainingSpec) -> Dims:
    return Dims(
        L=model.layers,
        h=model.hidden,
        f=model.ffn_hidden,
        V=model.vocab,
        s=training.sequence_length(model),
        s_model=model.seq_len,
        heads=model.heads,
        kv=model.num_kv_heads * model.head_dim,
        family=model.family,
        c=training.dtype_bytes,
        dtype=DTYPE_NAMES[training.dtype],
        recompute=training.recompute,
        global_batch=training.global_batch,
        activations=training.activations,
    )


def vocab_split(mode: str, t: int, q: int) -> int:
    """Ways the vocabulary (embedding rows, head columns) is split inside the tensor group."""
    return {"none": 1, "1d": t, "2d": q, "2.5d": q, "3d": q * q}[mode]


def padded_vocab(V: int, split: int) -> int:
    return -(-V // split) * split


def local_params(d: Dims, mode: str, t: int, q: int, layers: int, first: bool, last: bool) -> int:
    """Closed form of the parameters one rank stores (one pipeline stage of `layers` blocks).

    none: everything. 1d (p = t): weights and column biases / p; LayerNorms, row-parallel biases and pos_emb
    replicated. 2d / 2.5d: every parameter once per q x q grid -> total / q^2. 3d: total / q^3.
    """
    V = padded_vocab(d.V, vocab_split(mode, t, q))
    h = d.h
    emb = V * h + d.pos_params if first else 0
    head = V * h + d.norm_vectors * h if last else 0
    total = layers * d.layer_params() + emb + head
    if mode == "none":
        return total
    if mode == "1d":
        rep_layer = 2 * d.norm_vectors * h + d.row_bias
        split_layer = d.layer_params() - rep_layer
        rep = layers * rep_layer + (d.pos_params if first else 0) + (d.norm_vectors * h if last else 0)
        split = layers * split_layer + (V * h if first else 0) + (V * h if last else 0)
        return rep + split // t
    div = q * q if mode in ("2d", "2.5d") else q**3
    return total // div
