"""Sizes a layout must divide, checked before any rank starts (docs/algorithms.md "Sizes that must divide")."""

from __future__ import annotations

from paracube.errors import ParacubeError, divisors
from paracube.executor.moe_sizes import check_moe
from paracube.layout import Layout
from paracube.modes import MODES, runnable_modes
from paracube.modes.base import tokens_split_ok
from paracube.modes.stages import split_ok
from paracube.recompute_modules import DEFAULT, modules_text, violations
from paracube.runtimes import RUNTIMES
from paracube.runtimes.offload import offload_refusal
from paracube.workload import ModelSpec


def check_dtype(dtype: str, layout: Layout) -> None:
    """Refuse a dtype the executor does not train in with this layout's tensor mode (ExecutorSupport.dtypes:
    fp8 in none and 1D), before any rank starts."""
    support = MODES[layout.mode].executor
    dtypes = support.dtypes if support is not None else ()
    if dtype not in dtypes:
        where = [n for n, m in MODES.items() if m.executor is not None and dtype in m.executor.dtypes]
        also = f"; {dtype} runs in tp={'/'.join(where)}" if where else ""
        raise ParacubeError(f"dtype {dtype} is not run by paracube's executor with tensor mode {layout.mode} (in "
                            f"{layout}); valid there: {', '.join(dtypes)}{also}; or export the plan "
                            "(`paracube export`)")
    # fp8 with zero=2/3 (the layer casts the gathered bf16 weight) and with tpo (the rings' chunk GEMMs are the
    # linear's FP8 GEMMs): both run (executor/layers/fp8.py), so nothing more to refuse here.


def check_divisibility(spec: ModelSpec, layout: Layout, micro_batch: int | None, global_batch: int,
                       seq_len: int) -> None:
    """Raise ParacubeError naming the first size the layout cannot split (before any rank starts).
    micro_batch None checks the model's sizes only."""
    mode, q = layout.mode, layout.q
    support = MODES[mode].executor  # what the executor runs: paracube/modes (ExecutorSupport)
    if support is None:
        raise ParacubeError(f"tensor mode {mode!r} is not supported by the executor; "
                            f"valid: {', '.join(runnable_modes())}")
    if layout.sequence_parallel and not support.sequence_parallel:
        raise ParacubeError(f"sequence parallelism (sp) is not implemented by the executor; drop sp from {layout}")
    if layout.tpo and not support.tpo:
        raise ParacubeError(f"tpo with tensor mode {mode!r} is not implemented by the executor; drop tpo from {layout}")
    if layout.tpo and MODES[mode].tpo_needs_sp and not layout.sequence_parallel:
        raise ParacubeError(f"tpo in tp={mode} overlaps sequence-parallel collectives: add sp ({layout},sp) or drop "
                            "tpo")
    if layout.zero not in support.zero_stages:
        why = " (its parameters are not FSDP units: executor/data_parallel/sharded.py)" if layout.zero >= 2 else ""
        raise ParacubeError(f"zero={layout.zero} with tensor mode {mode!r} is not implemented by the executor{why}; "
                            f"valid there: zero={', '.join(map(str, support.zero_stages))} (in {layout})")
    if layout.zero >= 2 and layout.pp > 1 and spec.tied_embeddings:  # the two stages' copies: not in units yet
        raise ParacubeError(f"zero={layout.zero} with pp={layout.pp} and tied embeddings: the executor shards the "
                            f"stages' tied copies at zero=0/1 only; untie them, or use zero=0/1 or pp=1 in {layout}")
    if layout.hybrid and layout.zero < 2:
        raise ParacubeError(f"shard={layout.shard} (hybrid sharding) runs with zero=2 or 3 in the executor; "
                            f"use zero=2/3 or drop shard= in {layout}")
    if layout.cp > 1:
        check_context_parallel(spec, layout, seq_len, support.context_parallel)  # the exchanges it runs
    if layout.pp != 1 and not support.pipeline:
        raise ParacubeError(f"pp={layout.pp}: the executor runs pp=1 only for tensor mode {mode}")
    if layout.pp > 1 and not split_ok(spec.layers, layout.pp, layout.interleave):
        raise ParacubeError(f"layers={spec.layers} do not split over pp={layout.pp} x v={layout.interleave} "
                            "virtual stages (even, or one block less on the first and/or last); change pp or v")
    n_micro = global_batch // (layout.dp * micro_batch) if micro_batch else 0
    if layout.interleave > 1 and n_micro % layout.pp:
        raise ParacubeError(f"interleaved 1F1B needs the micro-batch count ({n_micro}) to be a multiple of "
                            f"pp={layout.pp}; change the global batch or mb")
    if spec.family not in support.families:
        raise ParacubeError(f"model family {spec.family!r} is not run by the executor in tensor mode {mode}; "
                            f"valid there: {', '.join(support.families)}")
    if spec.tied_embeddings and not MODES[mode].ties_embeddings:
        raise ParacubeError(f"tied embeddings (tie_word_embeddings) with tensor mode {mode}: its head is not laid "
                            "out as the embedding; untie them or use a mode that ties them ("
                            f"{', '.join(n for n, m in MODES.items() if m.ties_embeddings)})")
    check_moe(spec, layout)  # MoE blocks and expert parallelism: executor/moe_sizes.py
    if spec.mla is not None:
        check_mla(spec, layout, support.mla)
    if seq_len > spec.seq_len:
        raise ParacubeError(f"seq_len={seq_len} exceeds the model's positions ({spec.seq_len})")
    s, h, f, V, H = spec.seq_len, spec.hidden, spec.ffn_hidden, spec.vocab, spec.heads
    rules = MODES[mode].executor_rules(s, h, f, V, H, q, micro_batch)
    if layout.sequence_parallel:  # with cp: the cp rank's s / cp tokens split over tp
        rules.append(("seq_len / cp (sequence parallelism)" if layout.cp > 1 else "seq_len (sequence parallelism)",
                      seq_len // layout.cp, layout.tensor_size))
    if spec.head_size is not None and spec.mla is None:  # the attention's widths split as the hidden size does
        qw, kvw = spec.heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        rules += [(f"heads x head_dim ({spec.heads} x {spec.head_dim})", qw, n) for name, _, n in list(rules)
                  if name == "hidden"]
        rules += [(f"qkv width ({spec.heads} + 2 x {spec.num_kv_heads}) x {spec.head_dim}", qw + 2 * kvw, n)
                  for name, _, n in list(rules) if name == "hidden"]
    if MODES[mode].axes:  # a rank's query heads read whole kv groups (executor/layers/llama.py): the heads' split
        rules.insert(1, ("kv_heads", spec.num_kv_heads, q))
    if micro_batch is not None:
        split = layout.token_split  # the tensor group's split of a micro-batch's b x s tokens (2.5D: q * depth)
        if not tokens_split_ok(micro_batch, seq_len, split):
            raise ParacubeError(token_split_refusal(micro_batch, seq_len, split, global_batch // layout.dp, layout))
        rules.append(("global_batch", global_batch, layout.dp * micro_batch))
    for name, value, divisor in rules:
        if value % divisor:
            raise ParacubeError(f"{name}={value} is not divisible by {divisor} (needed by {layout}); "
                                f"use a multiple of {divisor}")


def check_mla(spec: ModelSpec, layout: Layout, runs: bool) -> None:
    """Multi-head latent attention (executor/layers/mla.py) runs in the modes whose ExecutorSupport says `mla`
    (none, 1D with or without sp), with dp, pp, cp (its core: context_parallel.py) and every zero stage (zero=2/3:
    its parameters in the blocks' units, data_parallel/sharded.py; tests/test_mla_run.py); not with tpo (its
    latent's gather and output's reduce-scatter have no collective-matmul form here yet)."""
    where = "/".join(n for n, m in MODES.items() if m.executor is not None and m.executor.mla)
    if not runs:
        raise ParacubeError(f"model {spec.name}: multi-head latent attention with tensor mode {layout.mode} is not run "
                            f"by the executor; valid there: tp={where} (in {layout})")
    if layout.tpo:
        raise ParacubeError(f"model {spec.name}: multi-head latent attention with tpo is not run by the executor yet "
                            f"(in {layout}); valid there: drop tpo")


def check_context_parallel(spec: ModelSpec, layout: Layout, seq_len: int, comms: tuple[str, ...]) -> None:
    """cp > 1: the mode runs it (ExecutorSupport.context_parallel: its exchanges), the sequence splits into
    2 x cp load-balanced chunks, and the attention is the one executor/layers/context_parallel.py computes
    (flash-style, no attention dropout)."""
    if layout.cp_comm is not None and comms and layout.cp_comm not in comms:
        raise ParacubeError(f"cpc={layout.cp_comm} is not run by the executor in tensor mode {layout.mode}; "
                            f"valid: cpc={'/'.join(comms)}")
    if not comms:
        raise ParacubeError(f"cp={layout.cp} (context parallelism) with tensor mode {layout.mode} is not run by the "
                            f"executor; valid there: cp=1 (runs cp: "
                            f"{', '.join(n for n, m in MODES.items() if m.executor and m.executor.context_parallel)})")
    if seq_len % (2 * layout.cp):
        raise ParacubeError(f"seq_len={seq_len} does not split into 2 x cp = {2 * layout.cp} chunks (context "
                            f"parallelism's load balance, in {layout}); use a seq_len divisible by {2 * layout.cp} "
                            "or another cp")
    if layout.flash == 0:
        raise ParacubeError(f"fa=0 with cp={layout.cp}: context parallelism runs flash-style blockwise attention "
                            f"(online softmax); drop fa=0 from {layout}")
    if spec.attention_dropout > 0:
        raise ParacubeError(f"attention_dropout={spec.attention_dropout} with cp={layout.cp}: the ring attention "
                            "runs without dropout on the probabilities; set attention_dropout 0 or use cp=1")


def check_offload(spec: ModelSpec, layout: Layout, recompute: str) -> None:
    """Activation offloading (off=N) as the executor runs it (runtimes/paracube.py's Offload: pp = 1, N in [0, layers],
    no full recomputation): one line naming the bad value and what is valid."""
    rt = RUNTIMES["paracube"]
    why = offload_refusal(rt.name, rt.offload, layout, spec.layers, recompute)
    if layout.offload and (spec.moe is not None or spec.mla is not None or spec.head_size is not None):
        why = ("offloads the activations of dense blocks of hidden / heads attention only (as the model prices); "
               "valid: off=0")
    if why:
        raise ParacubeError(f"layout {layout}: paracube's executor {why}")


def recomputed_modules(recompute: str, layout: Layout) -> frozenset[str]:
    """The modules the executor recomputes (recompute_modules.MODULES' names): the layout's `rcm=` (rc=selective
    implied), else DEFAULT under rc=selective (Megatron-core's default, the executor's selective of before), else
    none (rc=none; rc=full recomputes whole blocks instead: model/gpt.py)."""
    if layout.recompute_modules is not None:
        return frozenset(layout.recompute_modules)
    return frozenset(DEFAULT) if recompute == "selective" else frozenset()


def check_recompute_modules(spec: ModelSpec, layout: Layout, recompute: str) -> None:
    """`rcm=` as the executor runs it: with selective recomputation (not rc=full), each module re-running something
    in this model (recompute_modules.violations), no activation offloading next to modules other than core_attn
    (off=N's host copies would keep what they discard); one line naming the bad value and what is valid."""
    mods = layout.recompute_modules
    if mods is None:
        return
    if recompute == "full":
        raise ParacubeError(f"rcm={modules_text(mods)} with recompute full: rcm= names the modules of selective "
                            "recomputation; valid: recompute selective (or none: rcm= implies it), or drop rcm=")
    bad = violations(mods, spec)
    if bad:
        raise ParacubeError(bad[0])
    if layout.offload and set(mods) - set(DEFAULT):
        raise ParacubeError(f"layout {layout}: off={layout.offload} with rcm={modules_text(mods)}: the executor "
                            f"offloads activations with rcm=core_attn only; valid: off=0 or rcm=core_attn")


def token_split_refusal(micro_batch: int, seq_len: int, split: int, per_replica: int, layout: Layout) -> str:
    """One line: the micro-batch's tokens, the split they miss, and the nearest micro-batch sizes whose tokens
    split (modes.base.tokens_split_ok), dividing the replica's batch `per_replica` when some do."""
    def runs(m: int) -> bool:
        return bool(tokens_split_ok(m, seq_len, split))

    valid = [m for m in divisors(per_replica) or () if runs(m)] if per_replica else []
    near = [m for m in valid if m < micro_batch][-1:] + [m for m in valid if m > micro_batch][:1]
    tail = f" (dividing the replica's batch of {per_replica} sequences)"
    if not near:
        below = [m for m in range(micro_batch - 1, 0, -1) if runs(m)][:1]
        near = below + [m for m in range(micro_batch + 1, micro_batch + 4 * split) if runs(m)][:1]
        tail = (f" (none divides the replica's batch of {per_replica} sequences: change the global batch too)"
                if per_replica else "")
    return (f"micro_batch={micro_batch}: its {micro_batch} x {seq_len} = {micro_batch * seq_len} tokens do not split "
            f"{split} ways (needed by {layout}); nearest valid micro-batch sizes: {', '.join(map(str, near))}{tail}")


__all__ = ["check_context_parallel", "check_divisibility", "check_offload", "check_recompute_modules",
           "recomputed_modules", "token_split_refusal"]
