"""What one runtime (training stack) declares: the layouts it runs and what it overlaps, with its defaults.

A runtime is a frozen `Runtime` in its own module (paracube.py, megatron.py, torchtitan.py, deepspeed.py),
registered by one line in paracube/runtimes/__init__.py. Pure declarations (it reads paracube.layout and
paracube.modes only): the CLI refuses a layout a runtime cannot run (`refusal`, one line naming the runtime and
what is valid), the planner enumerates only what it runs (`runs`) and takes the searched dimensions' values
from it (planner/dimensions.py), the plan records its name and `paracube export --to` re-checks it.

Overlaps (what the cost models price, cost_models/analytic.py and event_program.py):
- `grad_overlap`: the data-parallel gradient buckets reduced during the last micro-batch's backward (torch DDP /
  FSDP2, Megatron's --overlap-grad-reduce, DeepSpeed's overlap_comm); `grad_overlap_pp`: also with pipelines (the
  search chooses overlap under pipelines only there; a layout that pins `overlap` with pp > 1 is not refused:
  paracube's executor then reduces after the backward, as it always did, and the estimate is optimistic).
- `param_gather_overlap`: zero's parameter all-gather prefetched under compute (Megatron --overlap-param-gather,
  FSDP2's prefetch, DeepSpeed stage-3 prefetch); priced for zero=1 (the gather after the optimizer step hidden
  under the next forward: cost_models/analytic.py, planner/dimensions.PARAM_OVERLAP).
- `fsdp_prefetch`: zero=2/3 (FSDP) as the stacks run it: each unit's parameter all_gather prefetched while the
  previous unit computes, forward and backward, its gradient reduce_scatter asynchronous under the backward of
  the units before it (FSDP2 / torchtitan, DeepSpeed stage-3 prefetch, Megatron-FSDP, paracube's
  executor/data_parallel/fsdp.py; cost_models/fsdp_overlap.py prices it).
- `tpo`: tensor-parallel collectives overlapped with the GEMMs that produce / consume them (collective matmul:
  Megatron --tp-comm-overlap with Transformer Engine userbuffers, torchtitan async TP); `tpo_needs_sp`.
- `cp_comms`: context parallelism (Layout cp=N) and the key / value exchanges it runs (modes/context.py: "p2p"
  ring, "ag" all-gather; first = its default, what an unpinned cpc records); () = no context parallelism
  (`cp_note` says why, e.g. DeepSpeed-Ulysses is not this). The ring is priced overlapped with attention, the
  all-gather exposed (cost_models/context_parallel.py).
- `expert_parallel` / `expert_tensor_parallel`: MoE layouts with ep > 1 / etp > 1 (Layout's folding);
  `etp_expert_biases`: with experts that have biases (GPT-OSS) too.
- `fp8_scaling`: how it scales FP8 tensors (workload.FP8_SCALINGS): "delayed" (Transformer Engine's amax history,
  Megatron-core and paracube's executor) or "dynamic" (torchao's Float8Linear, torchtitan): both engines price the
  amax reduction, the held FP8 weight copies and the weight casts by it (cost_models/fp8.py).
- `moe_dispatch`: how its MoE layers send tokens to experts (cost_models/moe_dispatch.py): "alltoall", one copy per
  (token, expert) pair in one all_to_all (paracube's executor, torchtitan, DeepSpeed-MoE, Megatron-core's alltoall
  dispatcher), or "deepep", one copy per remote node over the NICs forwarded over NVLink once per GPU (Megatron-core's
  flex dispatcher on DeepEP, as NVIDIA's Hopper recipes run dropless MoE; a model with a capacity factor falls back to
  alltoall, Megatron-core's rule), or "hybridep" (the flex dispatcher's HybridEP backend: DeepEP's bytes, its kernels
  permuting the tokens; no runtime declares it, a published row names it); both engines price it. `moe_probs`: where
  its alltoall dispatcher sends the routing weights by an all_to_all of their own (modes/experts.PROBS_RULES).
- `selective`: what `rc=selective` recomputes (workload.SELECTIVE_RULES): "attention" (Megatron's: the attention
  core re-run in backward; Megatron-core, DeepSpeed, paracube's executor) or "op" (torchtitan's per-op selective
  activation checkpointing); both engines price its recomputed forward work and memory its saved tensors
  (cost_models/recompute.py).
- `cp_core_recompute`: with cp > 1, rc=selective's attention-core re-run (the "attention" rule, rcm= naming core_attn)
  runs the core again with its context-parallel exchange inside (Megatron-core: its core_attn checkpoint wraps
  Transformer Engine's attention, which runs the cp exchange: transformer/attention.py l.328-331 sets the checkpoint
  whatever cp, l.381-420 `_checkpointed_attention_forward` checkpoints `self.core_attention`, l.1134-1143 calls it;
  extensions/transformer_engine.py l.1228-1242 hands TE the cp group and cp_comm_type; MLA alike,
  multi_latent_attention.py l.279-280); False: the core is kept under cp, neither re-run nor exchanged again
  (paracube's executor: executor/layers/context_parallel.py's core is outside the region, llama.py / mla.py
  `_context`). Both engines price it (recompute_modules_cost.core_recomputed: the core's re-run and its memory,
  context_parallel.ring_again: its exchange again).
- `recompute_modules`: the modules a layout's `rcm=` may name (paracube/recompute_modules.py: Megatron-core's
  --recompute-modules; Megatron-core and paracube's executor all seven, the others none); `refusal` names them; both
  engines price each (cost_models/recompute_modules_cost.py), the search tries them on layouts that do not fit.
- `fused_norms`: its dense norms run inside the next linear (Transformer Engine's LayerNormLinear: Megatron-core's TE
  spec), so rcm=layernorm recomputes only latent attention's input norm and a MoE block's pre-MLP norm; both engines
  price it (recompute_modules_cost.py), `refusal` refuses rcm=layernorm where it recomputes nothing.
- `moe_a2a_overlap`: the MoE dispatch / combine all_to_alls of one micro-batch overlapped with another's compute
  (Layout `a2ao`; Megatron-core's --overlap-moe-expert-parallel-comm, opt-in: `moe_a2a_overlap_default` False), with
  its constraints (`a2a_overlap_refusal`: ep > 1, pp = 1 or interleaved, no full recomputation, 16-bit training);
  both engines price it (cost_models/moe_a2a_overlap.py).
- `moe_host_sync`: its dropless MoE blocks copy the expert counts to the host and wait for them every forward
  (the buffers are sized from them; no CUDA graph captures the dispatch's preprocessing): the GPU idles for the
  device's DeviceSpec.sync_s per MoE block forward; both engines price it (cost_models/host_sync.py).
- `moe_capacity`: what it does with a capacity factor (MoESpec.capacity_factor, token-drop runs; CAPACITY_RULES):
  "pad" drops the copies beyond an expert's capacity and pads every expert's input to it (Megatron-core's
  drop_and_pad, as NVIDIA's token-drop recipes run it: the buffers sized from the capacity, no host wait; DeepSpeed-
  MoE's [experts, capacity] dispatch), "drop" drops them without padding (paracube's executor: the busiest expert's
  tokens min(imbalance, capacity factor) x its balanced share, the counts still read on the host), "none" runs MoE
  dropless only (a model with a capacity factor is refused in one line); both engines price it (MoESpec.load,
  cost_models/moe.py; host_sync.py).
- `moe_host_ops`: the ops its host issues per MoE block forward and backward (engine_options.MoEHostOps, counted from
  its own code), or None (not counted): between two of its waits the GPU runs no faster than the host issues them,
  max(GPU work, ops x the host's seconds per op) per segment; both engines price it (cost_models/host_issue.py).
- `sliding_window`: it trains models with sliding-window attention (ModelSpec.sliding_window); `window_cp_comms`: the
  context-parallel exchanges it runs them with (None: all of cp_comms; `cp_comms_for`), e.g. Transformer Engine
  refuses sliding windows with its p2p ring. The search offers only those (planner/search.py); `refusal` names them.
- `chunked_attention`: it trains chunked attention (Llama 4, ModelSpec.attention_chunk) over sequences longer than
  one chunk, with every cp exchange it runs (`chunk_note` says why not); without it such sequences are refused in
  one line before any search (attention_chunk.chunk_refusal), sequences up to one chunk being plain causal.
- `p2p_overlap`: pipeline sends overlapped with compute (every stack here; the cost models' 1F1B already
  assumes it: a send costs only its wire time on the critical path).
`engine_options()` is the one place the engines' overlap options are read from (plan, simulate, sweep, compare,
validate). Each overlap has `*_default`: whether the stack turns it on without a flag (what the search assumes when the
layout does not pin it; `Layout.overlap` / `Layout.tpo` record the choice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from paracube.engine_options import EngineOptions, MoEHostOps
from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.experts import PROBS_RULES
from paracube.moe_spec import CAPACITY_RULES
from paracube.runtimes.describe import runtime_dict
from paracube.runtimes.offload import Offload, offload_refusal
from paracube.runtimes.refusals import (
    a2a_refusal,
    context_refusal,
    expert_refusal,
    model_refusal,
    rcm_refusal,
    tpo_refusal,
)
from paracube.workload import FP8_SCALINGS, SELECTIVE_RULES

# Per-mode check of a stack whose support differs by mode (paracube's executor: modes.executor_runs):
# (mode, pp, sequence_parallel, zero, tied_embeddings, family) -> None where it runs, else what it runs instead
ModeCheck = Callable[[str, int, bool, int, bool, str], str | None]
# (mode, dtype) -> None where the stack trains in dtype in that mode, else why not (paracube's: fp8 in none / 1D)
DtypeCheck = Callable[[str, str], str | None]
# The tensor layouts Megatron-LM, DeepSpeed and torchtitan run: no tensor parallelism, or the modes declaring
# themselves Megatron-style (TensorMode.megatron_style: 1D column / row-parallel linears).
MEGATRON_STYLE: tuple[str, ...] = tuple(n for n, m in MODES.items() if not m.axes or m.megatron_style)


@dataclass(frozen=True)
class Runtime:
    name: str
    title: str  # the stack, as a user knows it
    modes: tuple[str, ...]  # tensor modes it runs (paracube.modes names)
    pipeline: bool  # pipeline parallelism (1F1B)
    interleave: bool  # interleaved 1F1B (virtual stages, v > 1)
    sequence_parallel: bool  # Megatron-style sp with 1D tensor parallelism
    zeros: tuple[int, ...]  # zero stages (0 none, 1 optimizer state, 2 + gradients, 3 + parameters / FSDP)
    zeros_with_pp: tuple[int, ...]  # the zero stages it runs with pipelines
    hybrid_shard: bool  # HSDP: zero's shard group smaller than dp (Layout.shard)
    recomputes: tuple[str, ...]
    dtypes: tuple[str, ...]  # training dtypes (paracube names: fp32, fp16, bf16)
    grad_overlap: bool
    grad_overlap_default: bool
    grad_overlap_pp: bool
    param_gather_overlap: bool
    param_gather_overlap_default: bool
    tpo: bool
    tpo_default: bool
    tpo_needs_sp: bool
    p2p_overlap: bool
    export_target: str | None  # `paracube export --to` name of this stack (None: `paracube run` runs it)
    families: tuple[str, ...] = ("gpt", "llama")
    fsdp_prefetch: bool = True  # zero=2/3: gathers prefetched, reduce-scatters asynchronous (all four stacks)
    grad_bytes: int = 4  # bytes per gradient element it keeps: fp32 (Megatron's main_grad, FSDP2's fp32 reduce)
    # zero=1's parameter all_gather after the step sends the 16-bit parameters (Megatron-core's distributed
    # optimizer gathers its bf16 param buffer, DeepSpeed ZeRO-1/2 its fp16 ones), not fp32 master shards
    # (paracube's executor, executor/data_parallel/optim.py)
    param_gather_16bit: bool = False
    sp_default: bool = False  # sp on whenever tensor parallelism is (torchtitan)
    tied_pp_zero0: bool = False  # tied embeddings with pipelines only at zero=0 (paracube's executor)
    mode_check: ModeCheck | None = None  # finer per-mode support (paracube's executor)
    dtype_check: DtypeCheck | None = None  # per-mode dtypes (paracube's executor: ExecutorSupport.dtypes)
    # Mixture-of-experts (Layout ep= / etp=, cost_models/moe.py): expert parallelism (ep > 1) and tensor
    # parallelism inside an expert (etp > 1, Megatron-core's --expert-tensor-parallel-size)
    expert_parallel: bool = False
    expert_tensor_parallel: bool = False
    etp_expert_biases: bool = True  # experts with biases (GPT-OSS) split over etp > 1 (runtimes/refusals.py)
    moe_blocks: bool = True  # it trains models with MoE blocks
    mla: bool = True  # it trains multi-head latent attention with dense MLPs (paracube's executor: ExecutorSupport.mla)
    mla_with_moe: bool = True  # it trains MLA and MoE blocks in one model (DeepSeek-V2/V3)
    llama4_blocks: bool = True  # it trains Llama 4's NoPE blocks, L2 q / k norm, router scores on the experts' input
    # What it does not run of a layout with MoE blocks (one line), or None: it runs every such layout it runs
    moe_check: Callable[[Layout], str | None] | None = None
    # Why it cannot build paracube's pipeline split of L blocks over pp x v (modes/stages.py; a phrase), or None: it
    # builds every split (Megatron-core's --pipeline-model-parallel-layout, paracube's executor)
    pipeline_split: Callable[[int, int, int], str | None] | None = None
    source: str = ""  # where the facts come from
    offload: Offload | None = None  # activation offloading (Layout off=N; runtimes/offload.py); None: none
    cp_comms: tuple[str, ...] = ()  # context parallelism's exchanges it runs, its default first (module docstring)
    cp_note: str = ""  # why it has no context parallelism (cp_comms empty)
    fp8_zeros: tuple[int, ...] | None = None  # zero stages it trains fp8 with (None: every zero stage it runs)
    fp8_tpo: bool = True  # it runs tpo with fp8 GEMMs
    fp8_scaling: str = "delayed"  # how it scales FP8 tensors (module docstring; workload.FP8_SCALINGS)
    fp8_experts: bool = False  # with fp8, the routed experts' grouped GEMMs run FP8 too (TE's grouped linear)
    # with fp8, the block linears' weights held and zero=1-gathered as FP8 (Megatron-core --fp8-param-gather)
    fp8_param_gather: bool = False
    moe_dispatch: str = "alltoall"  # how it dispatches tokens to experts (module docstring; moe_dispatch.DISPATCHERS)
    moe_probs: str = "none"  # where it sends the routing weights by their own all_to_all (modes/experts.PROBS_RULES)
    selective: str = "attention"  # what rc=selective recomputes (module docstring; workload.SELECTIVE_RULES)
    recompute_modules: tuple[str, ...] = ()  # what a layout's rcm= may name (module docstring; recompute_modules.py)
    fused_norms: bool = False  # its dense norms run inside the next linear (module docstring)
    cp_core_recompute: bool = False  # under cp, rc=selective re-runs the core and its cp exchange (module docstring)
    moe_a2a_overlap: bool = False  # it runs Layout `a2ao` (module docstring)
    moe_host_sync: bool = False  # its dropless MoE forward waits on the host for the expert counts (module docstring)
    moe_host_ops: MoEHostOps | None = None  # ops its host issues per MoE block (module docstring)
    moe_capacity: str = "none"  # what it does with a capacity factor: pad, drop or none (module docstring)
    moe_a2a_overlap_default: bool = False  # and turns it on without a flag
    sliding_window: bool = True  # it trains sliding-window attention (module docstring)
    window_cp_comms: tuple[str, ...] | None = None  # the cp exchanges it runs windowed models with (None: cp_comms)
    chunked_attention: bool = False  # it trains chunked attention beyond one chunk (module docstring)
    chunk_note: str = ""  # why it does not
    zeros_pp_note: str = ""  # why its zero stages differ with pipelines (a clause of the refusal)
    attention_sinks: bool = True  # it trains GPT-OSS's attention sinks (ModelSpec.attention_sinks; DeepSpeed: no)

    def __post_init__(self) -> None:
        if self.fp8_scaling not in FP8_SCALINGS:
            raise ValueError(f"runtime {self.name}: fp8_scaling {self.fp8_scaling!r}; valid: {', '.join(FP8_SCALINGS)}")
        if self.selective not in SELECTIVE_RULES:
            raise ValueError(f"runtime {self.name}: selective {self.selective!r}; valid: {', '.join(SELECTIVE_RULES)}")
        if self.moe_probs not in PROBS_RULES:
            raise ValueError(f"runtime {self.name}: moe_probs {self.moe_probs!r}; valid: {', '.join(PROBS_RULES)}")
        if self.moe_capacity not in CAPACITY_RULES:
            raise ValueError(f"runtime {self.name}: moe_capacity {self.moe_capacity!r}; valid: "
                             f"{', '.join(CAPACITY_RULES)}")

    def __repr__(self) -> str:
        return f"<runtime {self.name}>"

    def engine_options(self) -> EngineOptions:
        """How the cost models price this stack's runs (engine_options.py: each field and where it is priced);
        planner/dimensions.PARAM_OVERLAP / FSDP_PREFETCH read the same fields."""
        return EngineOptions(param_overlap=self.param_gather_overlap and self.param_gather_overlap_default,
                             fsdp_prefetch=self.fsdp_prefetch, grad_bytes=self.grad_bytes,
                             gather_16bit=self.param_gather_16bit, fp8_param_gather=self.fp8_param_gather,
                             fp8_scaling=self.fp8_scaling, fp8_experts=self.fp8_experts, moe_dispatch=self.moe_dispatch,
                             moe_probs=self.moe_probs, selective=self.selective, fused_norms=self.fused_norms,
                             cp_core_recompute=self.cp_core_recompute,
                             moe_host_sync=self.moe_host_sync, moe_host_ops=self.moe_host_ops,
                             moe_capacity=self.moe_capacity,
                             offload_overlap=self.offload is not None and self.offload.overlap)

    def cp_comms_for(self, windowed: bool) -> tuple[str, ...]:
        """The context-parallel exchanges it runs for a model with (`windowed`) or without sliding windows."""
        if not windowed or self.window_cp_comms is None:
            return self.cp_comms
        return tuple(c for c in self.cp_comms if c in self.window_cp_comms)

    # --- what it runs ------------------------------------------------------------------------------------
    @property
    def all_zeros(self) -> tuple[int, ...]:
        """Every zero stage it runs, with or without pipelines (the search's values; each row keeps those of its pp)."""
        return tuple(sorted(set(self.zeros) | set(self.zeros_with_pp)))

    def zeros_at(self, pp: int) -> tuple[int, ...]:
        """The zero stages it runs at this pipeline depth."""
        return self.zeros if pp == 1 else self.zeros_with_pp

    def runs(self, mode: str, pp: int = 1, sequence_parallel: bool = False, zero: int = 0,
             tied_embeddings: bool = False, family: str = "gpt") -> bool:
        """It runs this mode with these options (the planner enumerates only these)."""
        ok = (mode in self.modes and (pp == 1 or self.pipeline) and (not sequence_parallel or self.sequence_parallel)
              and zero in self.zeros_at(pp) and family in self.families)
        if ok and self.mode_check is not None:
            ok = self.mode_check(mode, pp, sequence_parallel, zero, tied_embeddings, family) is None
        return ok

    def overlaps_grad(self, pp: int) -> bool:
        """It overlaps the dp gradient reduction with backward at this pipeline depth, by default."""
        return self.grad_overlap and self.grad_overlap_default and (pp == 1 or self.grad_overlap_pp)

    def offers_tpo(self, mode: str, sequence_parallel: bool) -> bool:
        """It runs tpo in this mode (its tensor collectives overlapped with their GEMMs)."""
        return (self.tpo and mode in self.modes and bool(MODES[mode].axes)
                and (sequence_parallel or not (self.tpo_needs_sp or MODES[mode].tpo_needs_sp)))

    def refusal(self, layout: Layout, family: str = "gpt", tied_embeddings: bool = False,
                dtype: str | None = None, moe: bool = False, windowed: bool = False, sinks: bool = False,
                model: object | None = None) -> str | None:
        """Why this runtime cannot run `layout` (one line naming the runtime and what is valid), else None; `moe`:
        MoE blocks (moe_check); `windowed`: sliding windows (window_cp_comms); `sinks`: attention sinks; `model`
        (workload.ModelSpec, where known): rcm= modules it has no block for (recompute_modules.violations)."""
        who = f"runtime {self.name} ({self.title})"
        why_model = model_refusal(self, model) if model is not None else None
        if why_model:
            return f"{who} {why_model}"
        tensor = "tp=" + "/".join(self.modes)
        if layout.mode not in self.modes:
            return f"{who} does not run tp={layout.mode}; valid: {tensor}"
        if layout.pp > 1 and not self.pipeline:
            return f"{who} does not run pipelines (pp={layout.pp}); valid: pp=1"
        if layout.interleave > 1 and not self.interleave:
            return f"{who} does not run interleaved pipelines (v={layout.interleave}); valid: v=1"
        if layout.sequence_parallel and not self.sequence_parallel:
            return f"{who} does not run sequence parallelism (sp); drop sp"
        zeros = self.zeros_at(layout.pp)
        if layout.zero not in zeros:
            where = "" if layout.pp == 1 else " with pipelines (pp > 1)"
            note = self.zeros_pp_note if layout.pp > 1 else ""
            return f"{who} does not run zero={layout.zero}{where}{note}; valid: zero={'/'.join(map(str, zeros))}"
        if layout.shard is not None and not self.hybrid_shard:
            return f"{who} does not run hybrid sharding (shard={layout.shard}); drop shard="
        if layout.recompute is not None and layout.recompute not in self.recomputes:
            return f"{who} does not run rc={layout.recompute}; valid: rc={'/'.join(self.recomputes)}"
        why_rcm = rcm_refusal(self.recompute_modules, layout, model, self.fused_norms)
        if why_rcm:
            return f"{who} {why_rcm}"
        if dtype is not None and dtype not in self.dtypes:
            return f"{who} does not train in {dtype}; valid: {', '.join(self.dtypes)}"
        why_dtype = self.dtype_check(layout.mode, dtype) if dtype is not None and self.dtype_check else None
        if why_dtype:
            return f"{who} does not train {layout} in {dtype}: {why_dtype}"
        if dtype == "fp8" and self.fp8_zeros is not None and layout.zero not in self.fp8_zeros:
            return (f"{who} does not train fp8 with zero={layout.zero}; valid: "
                    f"zero={'/'.join(map(str, self.fp8_zeros))}")
        if family not in self.families:
            return f"{who} does not run the {family} family; valid: {', '.join(self.families)}"
        if layout.overlap and not self.grad_overlap:
            return f"{who} does not overlap the gradient reduction with backward; drop overlap"
        why_seq = tpo_refusal(self, layout, dtype) or context_refusal(self, layout, windowed, sinks)
        if why_seq:
            return f"{who} {why_seq}"
        why_experts = expert_refusal(self.expert_parallel, self.expert_tensor_parallel, self.etp_expert_biases,
                                     layout, model)
        if why_experts:
            return f"{who} {why_experts}"
        if layout.a2ao:
            why_a2a = self.a2a_overlap_refusal(layout, dtype)
            if why_a2a:
                return f"{who} {why_a2a}"
        why_off = offload_refusal(self.name, self.offload, layout)
        if why_off:
            return f"{who} {why_off}"
        why_moe = self.moe_check(layout) if moe and self.moe_check is not None else None
        if why_moe:
            return f"{who} does not run {layout}: {why_moe}"
        layers = getattr(model, "layers", None)
        why_split = self.split_refusal(layers, layout.pp, layout.interleave) if layers else None
        if why_split:
            return f"{who} {why_split}"
        if self.mode_check is not None:
            why = self.mode_check(layout.mode, layout.pp, layout.sequence_parallel, layout.zero, tied_embeddings,
                                  family)
            if why:
                return f"{who} does not run {layout}: {why}"
        return None

    def split_refusal(self, layers: int, pp: int, v: int) -> str | None:
        """Why it cannot build paracube's split of `layers` blocks over pp x v (`pipeline_split`), else None."""
        return self.pipeline_split(layers, pp, v) if pp > 1 and self.pipeline_split is not None else None

    def a2a_overlap_refusal(self, layout: Layout, dtype: str | None = None) -> str | None:
        """Why it cannot run `a2ao` on this layout (after "runtime NAME (TITLE)"), else None (runtimes/refusals.py)."""
        return a2a_refusal(self.moe_a2a_overlap, layout, dtype)

    def to_dict(self) -> dict[str, object]:
        """Every declaration as JSON-ready data (runtimes/describe.py)."""
        return runtime_dict(self)


__all__ = ["MEGATRON_STYLE", "DtypeCheck", "ModeCheck", "Runtime"]
