"""DeepSpeed 0.19 with Megatron-DeepSpeed for tensor and pipeline parallelism (docs/exports.md).

1D tensor parallelism with Megatron's sequence parallelism (Megatron-DeepSpeed's --sequence-parallel), pipelines
without interleaving (DeepSpeed's PipelineEngine), ZeRO 1 / 2 / 3 (ZeRO-2 and -3 not with pipelines), ZeRO++'s
hpZ as hybrid sharding (zero_hpz_partition_size), overlap_comm (gradient reduction during backward; on by default
for ZeRO-3, and for stage 1 / 2 where set: the ds_config paracube exports sets it), stage-3 parameter prefetch,
fp16 / bf16, activation checkpointing full (Megatron-DeepSpeed also runs selective). No tensor-parallel
comm overlap. Gradients in the 16-bit training dtype (ZeRO's partitioned gradients; Rajbhandari et al. 2020:
16, 4 + 12/d, 2 + 14/d, 16/d bytes per parameter for zero=0..3).
comm overlap. No context parallelism: DeepSpeed-Ulysses splits the sequence too, but exchanges q, k, v by
all-to-alls over the heads (each rank then attends whole sequences for heads / N), not the ring / all-gather of
keys and values that Layout cp=N declares (modes/context.py). No sliding-window attention: Megatron-DeepSpeed's
GPT model has no window argument (as far as we know; it is not installed here); nor chunked attention (Llama 4
over more than one chunk: refused, attention_chunk.chunk_refusal); nor multi-head latent attention, Llama 4's NoPE
blocks, L2 q / k norm or router scores on the experts' input (its export refused them, export/deepspeed.py, while
the planner wrote such plans until 2026-12-04: runtimes/refusals.model_refusal now refuses the model up front).
"""

from __future__ import annotations

from paracube.runtimes.base import MEGATRON_STYLE, Runtime
from paracube.runtimes.offload import Offload

RUNTIME = Runtime(
    name="deepspeed",
    title="DeepSpeed + Megatron-DeepSpeed",
    modes=MEGATRON_STYLE,
    pipeline=True,
    interleave=False,
    sequence_parallel=True,
    zeros=(0, 1, 2, 3),
    zeros_with_pp=(0, 1),
    hybrid_shard=True,
    recomputes=("none", "selective", "full"),
    dtypes=("fp16", "bf16", "fp32"),
    grad_overlap=True,
    grad_overlap_default=True,
    grad_overlap_pp=False,
    param_gather_overlap=True,
    param_gather_overlap_default=True,
    tpo=False,
    tpo_default=False,
    tpo_needs_sp=False,
    p2p_overlap=False,
    export_target="deepspeed",
    param_gather_16bit=True,
    grad_bytes=2,  # ZeRO keeps 16-bit gradients (the ZeRO paper's 2 + 2 + 12 bytes per parameter)
    expert_parallel=True,  # DeepSpeed-MoE ep_size; no tensor parallelism inside experts
    # its gate sizes the dispatch buffers on the host every MoE forward: dropless, the capacity is the largest expert
    # count (all-reduced over ep), then int(C) (deepspeed 0.19.8 moe/sharded_moe.py l.467-475, l.665-667; with a
    # capacity factor int(C) syncs too, not priced: host_sync.py counts dropless blocks). No host op counts declared.
    moe_host_sync=True,
    # its gate dispatches [experts, capacity] buffers (deepspeed 0.19.8 moe/sharded_moe.py top2gating / topkgating:
    # the dispatch mask's capacity dimension): every expert padded to its capacity
    moe_capacity="pad",
    expert_tensor_parallel=False,
    source="DeepSpeed config docs; Megatron-DeepSpeed arguments (docs/exports.md)",
    cp_note=" (DeepSpeed-Ulysses is not context parallelism: it all-to-alls heads, not a key / value ring)",
    chunk_note=" (Megatron-DeepSpeed has no chunked attention)",
    # no rcm= (recompute_modules empty), so fused_norms is never read (Megatron-DeepSpeed's norms are modules of
    # their own, as far as we know; it is not installed here)
    fused_norms=False,
    sliding_window=False,  # Megatron-DeepSpeed has no window argument (module docstring)
    attention_sinks=False,  # nor GPT-OSS's sinks (export/oss_flags.py)
    mla=False,  # nor multi-head latent attention (DeepSeek-V2/V3's), with or without MoE blocks
    mla_with_moe=False,
    llama4_blocks=False,  # nor Llama 4's NoPE blocks, L2 q / k norm or router scores on the experts' input
    # activation_checkpointing.cpu_checkpointing: with full recomputation, every layer's checkpoint but the last on
    # the host, copied by an asynchronous engine on its own stream (runtimes/offload.py)
    offload=Offload(("full",), keep_last=True, overlap=True, all_but_last=True,
                    flags='ds_config activation_checkpointing {"cpu_checkpointing": true}',
                    source="deepspeed 0.19.8 activation_checkpointing/checkpointing.py:65-69, 501-510"),
)
