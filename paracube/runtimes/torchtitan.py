"""torchtitan 0.3 (docs/exports.md): FSDP2 and DDP over data parallelism, DTensor 1D tensor parallelism.

FSDP2 (zero=3; HSDP as data_parallel_replicate_degree x data_parallel_shard_degree, Layout.shard; prefetching
the next block's parameter all-gather, reshard_after_forward), DDP (zero=0; buckets during backward), 1D tensor
parallelism with sequence parallelism on by default (enable_sequence_parallel) and async TP
(enable_async_tensor_parallel: collective matmul through torch's SymmetricMemory; needs sp), pipelines from
torch.distributed.pipelining (1F1B, Interleaved1F1B, ...), activation checkpointing none / selective / full,
where selective is its per-op SelectiveAC (distributed/activation_checkpoint.py; selective "op", recompute.py): the
outputs of the compute-intensive ops saved, every second bf16 matmul of a block and all of its cheap ops re-run in
backward, the attention core and FP8's torch._scaled_mm outputs always saved (0.3.0 has no layer-level selective
mode: `activation_checkpoint:selective` is the op rule),
bf16, fp32 and fp8: torchao's Float8Linear as a model converter (`Float8LinearConverter.Config(recipe_name=
"rowwise")` in 0.3.0's config registry; no tensorwise recipe, no CLI flag), dynamic scaling (fp8_scaling
"dynamic": each tensor scaled from its own amax at every cast, no amax history or reduction, the weights cast at
every use; cost_models/fp8.py). No distributed optimizer (zero=1) or zero=2 of its own.
With pipelines its FSDP is ZeRO-1 (zero=1, torchtitan_limits.fsdp_shard): torch.distributed.pipelining's stage
turns FSDP2's reshard after backward and its gradient sync off for every micro-batch but the step's last
(pipelining/stage.py: backward_maybe_with_nosync, set_reshard_after_backward(False), set_requires_gradient_sync(
False); perform_reduce_grad once a step), so the parameters stay unsharded from the first backward on and the
gradients accumulate unsharded in the reduce dtype (fp32): its memory is ZeRO-1's, its traffic one all-gather and
one reduce-scatter a step (with fsdp_reshard_after_forward `always` one gather more per micro-batch, saving no
memory: torchtitan's default with pipelines is `never`). zero=3 with pp > 1 would price sharded parameters and
gradients it does not hold, so it is refused with that reason.
Async TP is not on by default (a flag): the search still offers it, as `tpo` in the layout it records.
Context parallelism: parallelism.context_parallel_degree, torch's context_parallel with the head-tail load
balancer (context_parallel_load_balancer="headtail": the chunks i and 2 cp - 1 - i of modes/context.py) and torch's
default rotate method "allgather" (the keys and values all-gathered over cp): cpc=ag.
Sliding-window attention: 0.3.0's gpt_oss module only (models/gpt_oss/__init__.py: a 128-key window at even
blocks, "WF"; its llama3 / qwen3 modules have none: export/torchtitan.py refuses other windows); with cp > 1
its FlexAttention backend all-gathers keys and values (distributed/context_parallel/api.py apply_cp_to_forward;
the varlen backend raises NotImplementedError): cpc=ag, as above.
Chunked attention (Llama 4) over more than one chunk: none. 0.3.0 has no llama4 module (models/: llama3, qwen3,
gpt_oss, deepseek_v3, ...); models/common/attention.get_fixed_block_mask_mod (q_idx // size == kv_idx // size, a
FlexAttention mask to AND with the causal one) is there, built by no model: sequences up to one chunk only.
"""

from __future__ import annotations

from paracube.runtimes.base import MEGATRON_STYLE, Runtime
from paracube.runtimes.torchtitan_limits import fold_refusal, split_refusal

RUNTIME = Runtime(
    name="torchtitan",
    title="FSDP2 + DTensor TP",
    modes=MEGATRON_STYLE,
    pipeline=True,
    interleave=True,
    sequence_parallel=True,
    zeros=(0, 3),
    zeros_with_pp=(0, 1),  # its FSDP with pipelines: ZeRO-1 (module docstring)
    zeros_pp_note=(": torch.distributed.pipelining keeps FSDP2's parameters unsharded and its gradients accumulated"
                   " unsharded across micro-batches, so with pipelines its FSDP is ZeRO-1"),
    hybrid_shard=True,
    recomputes=("none", "selective", "full"),
    dtypes=("bf16", "fp32", "fp8"),
    fp8_scaling="dynamic",
    selective="op",  # SelectiveAC: per-op selective activation checkpointing (cost_models/recompute.py)
    # no rcm= (recompute_modules empty), so fused_norms is never read; its norms are modules of their own anyway
    # (attention_norm / ffn_norm, torchtitan 0.3.0 models/llama3/model.py:39-40)
    fused_norms=False,
    grad_overlap=True,
    grad_overlap_default=True,
    grad_overlap_pp=True,
    param_gather_overlap=True,
    param_gather_overlap_default=True,
    tpo=True,
    tpo_default=True,
    tpo_needs_sp=True,
    p2p_overlap=True,
    export_target="torchtitan",
    sp_default=True,
    # parallelism.expert_parallel_degree (efsdp = dp_shard cp tp / ep: the folding); torchtitan 0.3.0 has no
    # expert tensor parallelism (ParallelismConfig)
    expert_parallel=True,
    expert_tensor_parallel=False,
    moe_check=fold_refusal,  # ep over dp_shard x cp x tp only (runtimes/torchtitan_limits.py)
    pipeline_split=split_refusal,  # its layers_per_stage split (runtimes/torchtitan_limits.py)
    moe_host_sync=True,  # its dropless dispatch reads the all_to_all's splits on the host (input_splits.tolist())
    # moe_capacity "none" (the default): torchtitan 0.3.0's MoE has no capacity factor (models/moe: dropless)
    source="torchtitan ParallelismConfig (docs/exports.md)",
    cp_comms=("ag",),
    chunk_note=" (torchtitan 0.3.0 has no llama4 module; no model builds its fixed-block mask)",
    # offload=None: no activation offloading in 0.3.0's trainer (enable_cpu_offload is FSDP's parameters, gradients
    # and optimizer state; runtimes/offload.py)
)
