"""paracube's own executor (`paracube run`): derived from what the executor runs, so it grows as the executor does.

Tensor modes, pipelines, sp and zero come from each mode's ExecutorSupport (paracube/modes; modes.executor_runs
is the per-mode check, the same one executor/sizes.py applies before any rank starts). Gradient buckets overlap
each stage's (chunk's) last backward (executor/data_parallel/grad_sync.py), under pipelines too; zero=1's
parameter all-gathers overlap the next step's forward (executor/data_parallel/param_gather.py; `--no-overlap` turns
both off). tpo where a mode's ExecutorSupport says so (1D with sp: modes' `tpo_needs_sp`; 2D, 2.5D, 3D): its tagged
collectives run as rings overlapped with their GEMMs (executor/layers/collective_matmul.py); offered, not on by
default: on gloo CPU ranks the ring's p2p steps are not measured faster than one collective
(benchmarks/executor_step.py --overlap-tp), so the planner takes it only when a layout pins it. Context parallelism
(cp, both exchanges) where ExecutorSupport.context_parallel lists them (none, 1D: executor/layers/context_parallel.py).
Dtypes per mode (ExecutorSupport.dtypes): fp8 (Transformer Engine's hybrid delayed scaling, executor/layers/fp8.py)
in none and 1D, with every zero stage (FSDP gathers the bf16 shards, the layer casts them) and with tpo (1D's ring
chunk GEMMs are the linear's FP8 GEMMs). MoE blocks (executor/model/moe.py) with expert parallelism folded over
each stage's dp x cp x tp ranks, in the modes, zero stages and layouts modes/experts.executor_refusal allows (none,
1D with sp; every zero stage, zero=2/3 sharding the experts over edp: data_parallel/sharded.py; etp >= 1:
executor/layers/expert_tensor.py; any cp: executor/model/moe_sequence.py); MLA with
dense MLPs and MoE blocks (executor/layers/mla.py), with cp too (both exchanges: its core is context_parallel.py's, k
and v of their own widths) and every zero stage; not with tpo (executor/sizes.check_mla).
Llama 4's chunked attention over sequences longer than one chunk, in every path (executor/layers/attention_mask.py).
"""

from __future__ import annotations

from paracube.layout_checks import RECOMPUTES
from paracube.modes import MODES, executor_runs, runnable_modes
from paracube.modes.experts import EXECUTOR_PROBS, executor_refusal
from paracube.recompute_modules import MODULES
from paracube.runtimes.base import Runtime
from paracube.runtimes.offload import Offload


def _check(mode: str, pp: int, sp: bool, zero: int, tied: bool, family: str) -> str | None:
    """None where the executor runs it (modes.executor_runs), else what it runs in this mode."""
    if executor_runs(mode, pp, sequence_parallel=sp, zero=zero, tied_embeddings=tied, family=family):
        return None
    support = MODES[mode].executor
    if support is None:
        return f"its executor does not run tp={mode}; valid: tp={'/'.join(runnable_modes())}"
    runs = [f"families {'/'.join(support.families)}", "pipelines" if support.pipeline else "pp=1 only",
            "sp" if support.sequence_parallel else "no sp",
            f"zero={'/'.join(map(str, support.zero_stages))} (zero=2/3 with pp > 1: untied)"]
    if not MODES[mode].ties_embeddings:
        runs.append("untied embeddings only")
    return f"its executor runs tp={mode} with {', '.join(runs)}"


def _dtype_check(mode: str, dtype: str) -> str | None:
    """None where the executor trains in `dtype` in this mode (ExecutorSupport.dtypes; fp8: none and 1D)."""
    support = MODES[mode].executor
    if support is None or dtype in support.dtypes:
        return None
    where = [n for n, m in MODES.items() if m.executor is not None and dtype in m.executor.dtypes]
    return f"its executor trains tp={mode} in {'/'.join(support.dtypes)}; {dtype} in tp={'/'.join(where)}"


_SUPPORT = [m.executor for m in MODES.values() if m.executor is not None]
# Every dtype some mode runs (fp8: FP8 GEMMs in none and 1D, executor/layers/fp8.py; emulated on CPU ranks)
_DTYPES = tuple(dict.fromkeys(d for s in _SUPPORT for d in s.dtypes))
_ZEROS = tuple(sorted({z for s in _SUPPORT for z in s.zero_stages}))
_ZEROS_PP = _ZEROS  # zero=2/3 run with pipelines too, untied (modes.executor_runs, data_parallel/sharded.py)

RUNTIME = Runtime(
    name="paracube",
    title="paracube run",
    modes=runnable_modes(),
    pipeline=any(s.pipeline for s in _SUPPORT),
    interleave=any(s.pipeline for s in _SUPPORT),  # executor/pipeline.py runs interleaved 1F1B
    sequence_parallel=any(s.sequence_parallel for s in _SUPPORT),
    zeros=_ZEROS,
    zeros_with_pp=_ZEROS_PP,
    hybrid_shard=any(z >= 2 for z in _ZEROS),  # shard=N with zero=2/3 (executor/data_parallel/sharded.py)
    recomputes=RECOMPUTES,
    dtypes=_DTYPES,
    grad_overlap=True,
    grad_overlap_default=True,
    grad_overlap_pp=any(s.pipeline and s.grad_overlap_pp for s in _SUPPORT),  # data_parallel/grad_sync.py
    param_gather_overlap=True,  # zero=1: async per bucket, finished by the next forward (data_parallel/param_gather.py)
    param_gather_overlap_default=True,
    tpo=any(s.tpo for s in _SUPPORT),
    tpo_default=False,
    tpo_needs_sp=False,
    p2p_overlap=False,
    export_target=None,
    families=tuple(sorted({f for s in _SUPPORT for f in s.families})),
    mode_check=_check,
    dtype_check=_dtype_check,
    fp8_zeros=None,  # every zero stage: zero=2/3 gather the bf16 shards, the layer casts after (layers/fp8.py)
    fp8_tpo=True,  # 1D's ring chunk GEMMs are the linear's FP8 GEMMs (collective_matmul.py)
    tied_pp_zero0=False,  # tied copies summed before zero=1's reduce-scatter (data_parallel/grad_sync.py)
    # MoE blocks with ep over the folded expert group (executor/model/moe.py); what it does not run of them
    # (zero >= 2, 2D/2.5D/3D, 1D without sp) is modes/experts.executor_refusal; etp > 1 runs
    # (executor/layers/expert_tensor.py), cp > 1 too (executor/model/moe_sequence.py)
    expert_parallel=True,
    expert_tensor_parallel=True,
    moe_blocks=True,
    moe_check=executor_refusal,
    recompute_modules=tuple(MODULES),  # rcm=: every module in every mode (executor/, branch exec_rcm)
    fused_norms=False,  # its norms are modules of their own, rcm=layernorm re-runs both (executor/model/blocks.py)
    # under cp the core stays out of core_attn's region (executor/layers/llama.py, mla.py `_context`): kept, not re-run
    cp_core_recompute=False,
    moe_probs=EXECUTOR_PROBS,  # the routing weights' own all_to_all beside the dispatch (executor/model/moe.py)
    moe_host_sync=True,  # the split sizes and expert counts read on the host (executor/model/moe.py `.tolist()`)
    moe_capacity="drop",  # the copies beyond an expert's capacity dropped, none padded (executor/model/moe.py)
    mla=any(s.mla for s in _SUPPORT),  # none and 1D (executor/layers/mla.py): the MLA search's modes
    mla_with_moe=True,  # MLA + MoE blocks in one model (DeepSeek-V2/V3), tests/test_moe_run.py
    source="paracube/modes (ExecutorSupport), executor/grad_sync.py",
    # context parallelism as the executor runs it (ExecutorSupport.context_parallel: none and 1D, p2p and ag)
    cp_comms=tuple(dict.fromkeys(c for s in _SUPPORT for c in s.context_parallel)),
    cp_note=" (paracube's executor does not run it yet)",
    # chunked attention beyond one chunk in every tensor mode and cp exchange (executor/layers/attention_mask.py)
    chunked_attention=True,
    # torch.autograd.graph.save_on_cpu around the first N blocks (executor/model/gpt.py): copies in line on the compute
    # stream, pp = 1, without full recomputation (runtimes/offload.py)
    offload=Offload(("none", "selective"), keep_last=False, overlap=False, flags="off=N (save_on_cpu)",
                    modules=("core_attn",),
                    source="torch/autograd/graph.py:400-420 (save_on_cpu); executor/model/gpt.py"),
)
