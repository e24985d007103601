"""Megatron-core as NeMo and Megatron-LM run it (megatron-core 0.16; docs/exports.md).

1D tensor parallelism (+ sequence parallelism), pipelines with interleaving (virtual stages), the distributed
optimizer (zero=1; --use-distributed-optimizer) and Megatron-FSDP / torch FSDP2 (zero=3; --use-torch-fsdp2,
not with pipelines), recompute none / selective / full, bf16 / fp16 (fp8 via Transformer Engine: not in our
dtypes). Overlaps, on by default in NeMo's recipes: --overlap-grad-reduce (buckets during backward, pipelines
too), --overlap-param-gather (the distributed optimizer's / FSDP's parameter all-gather prefetched),
--tp-comm-overlap (Transformer Engine userbuffers: ring-exchange collective matmul; needs sp), p2p overlap of
pipeline sends (--overlap-p2p-comm). Context parallelism: --context-parallel-size with --cp-comm-type p2p (the
ring, overlapped with attention; its default) or all_gather (megatron-core TransformerConfig.cp_comm_type; the
a2a / a2a+p2p variants are Ulysses-style head scatters, not priced).
Sliding-window attention: --window-size (w - 1, 0) and --window-attn-skip-freq (TransformerConfig.window_size /
window_attn_skip_freq; megatron-core 0.16.1 passes window_size to Transformer Engine's DotProductAttention,
extensions/transformer_engine.py, with no context-parallel check of its own). Transformer Engine's
attn_forward_func_with_cp runs sliding windows only with cp_comm_type a2a, or all_gather (as we know its
context_parallel.py; Transformer Engine is not installed here to check): with cp > 1, cpc=ag only.
Chunked attention (Llama 4) over more than one chunk: none. megatron-core 0.16.1's TransformerConfig has no chunk
field; its one `attention_chunk` (transformer/attention.py) is flash-attn's argument in the inference decode path,
set to 0: sequences up to one chunk only (plain causal attention; attention_chunk.chunk_refusal).
"""

from __future__ import annotations

from paracube.engine_options import MoEHostOps
from paracube.recompute_modules import MODULES
from paracube.runtimes.base import MEGATRON_STYLE, Runtime
from paracube.runtimes.offload import Offload

RUNTIME = Runtime(
    name="megatron",
    title="Megatron-core / NeMo",
    modes=MEGATRON_STYLE,
    pipeline=True,
    interleave=True,
    sequence_parallel=True,
    zeros=(0, 1, 3),
    zeros_with_pp=(0, 1),
    hybrid_shard=False,
    recomputes=("none", "selective", "full"),
    dtypes=("bf16", "fp16", "fp32", "fp8"),  # fp8: Transformer Engine, --fp8-format hybrid
    grad_overlap=True,
    grad_overlap_default=True,
    grad_overlap_pp=True,
    param_gather_overlap=True,
    param_gather_overlap_default=True,
    param_gather_16bit=True,  # the distributed optimizer all-gathers its bf16 param buffer (param_and_grad_buffer.py)
    tpo=True,
    tpo_default=True,
    tpo_needs_sp=True,
    p2p_overlap=True,
    export_target="megatron",
    expert_parallel=True,  # --expert-model-parallel-size, --expert-tensor-parallel-size
    expert_tensor_parallel=True,
    etp_expert_biases=False,  # transformer_config.py l.1588-1591: "Bias in Moe is only supported when ETP==1"
    # dropless MoE as NVIDIA's Hopper recipes run it: the flex dispatcher on DeepEP (cost_models/moe_dispatch.py; a
    # capacity factor falls back to alltoall, which Megatron-core requires for padding to capacity)
    moe_dispatch="deepep",
    # its alltoall dispatcher sends the routing weights by a second all_to_all (token_dispatcher.py l.647-673), with
    # --moe-apply-probs-on-input too (experts.py l.657-665 applies them after the dispatch); DeepEP / HybridEP carry
    # them inside their own dispatch (cost_models/moe_dispatch.sends_probs)
    moe_probs="always",
    # --recompute-granularity selective --recompute-modules ... (TransformerConfig.recompute_modules, megatron-core
    # 0.16.1 transformer_config.py; transformer_layer.py:379-450): every module (recompute_modules.py)
    recompute_modules=tuple(MODULES),
    # the Transformer Engine spec (models/gpt/gpt_layer_specs.py): standard attention's input norm inside linear_qkv
    # (TELayerNormColumnParallelLinear, :279; input_layernorm left IdentityOp, transformer/transformer_layer.py:224), a
    # dense MLP's pre-MLP norm inside linear_fc1 (:265, :291 IdentityOp without experts; :492-497); MLA's input norm
    # (:248) and a MoE block's pre-MLP norm (the router reads it) are TENorm modules; transformer_layer.py:379-444
    # recomputes only a norm that is no IdentityOp (cost_models/recompute_modules_cost.py)
    fused_norms=True,
    # under cp its core_attn checkpoint re-runs TE's attention, the cp exchange inside (Runtime.cp_core_recompute:
    # transformer/attention.py l.328-331, 381-420, 1134-1143; extensions/transformer_engine.py l.1228-1242)
    cp_core_recompute=True,
    # --overlap-moe-expert-parallel-comm (combined 1F1B, pipeline_parallel/combined_1f1b.py): runs, opt-in
    # (megatron-core 0.16 ModelParallelConfig.overlap_moe_expert_parallel_comm = False)
    moe_a2a_overlap=True,
    moe_a2a_overlap_default=False,
    # dropless MoE copies the expert counts to the host every forward (token_dispatcher.py cuda_sync_point, HybridEP's
    # blocking dispatch, TEGroupedMLP's tokens_per_expert.tolist()); no CUDA graph of moe_preprocess (host_sync.py)
    moe_host_sync=True,
    # a capacity factor runs drop_and_pad (its export writes --moe-pad-expert-input-to-capacity with it, as NVIDIA's
    # token-drop recipes do: NeMo's MegatronTokenDropCallback), the buffers sized from the capacity, no host wait
    moe_capacity="pad",
    # the aten ops of one Megatron-core 0.16.1 transformer layer with a MoE MLP as it runs them (local spec: RMSNorm, qk
    # norms, rotary, the fused attention core as one op, the router with its aux loss, the alltoall dispatcher's
    # permute, SequentialMLP's experts), forward and backward, counted at 2 / 4 / 8 / 16 local experts:
    # 145 + 12 L and 169 + 20 L exactly (benchmarks/host_ops.py; cost_models/host_issue.py); experts with biases
    # (GPT-OSS) add TEGroupedMLP._apply_bias's (experts.py l.609-626: fc2's bias weighted per token, expert by expert):
    # 5 + 2 L forward, 4 + 7 L backward (host_ops.py --bias)
    moe_host_ops=MoEHostOps(fwd=145, fwd_expert=12, bwd=169, bwd_expert=20, bias=(5, 2, 4, 7)),
    fp8_param_gather=True,  # --fp8-param-gather: NeMo's FP8 recipes (bf16_with_fp8_mixed) hold and gather FP8 weights
    fp8_experts=True,  # TEGroupedLinear under fp8_autocast: the routed experts' GEMMs in FP8 (megatron-core experts.py)
    source="Megatron-LM arguments.py; NeMo 2 recipes (docs/exports.md)",
    cp_comms=("p2p", "ag"),
    window_cp_comms=("ag",),  # Transformer Engine: no sliding window on the p2p ring (module docstring)
    chunk_note=" (megatron-core 0.16.1 has no chunked attention mask in training)",
    # --cpu-offloading --cpu-offloading-num-layers N: the first N < layers layers, no pipelines, no recomputation
    # (runtimes/offload.py; transformer_config.py:1137-1152), Transformer Engine's copies on their own stream
    offload=Offload(("none",), keep_last=True, overlap=True, flags="--cpu-offloading --cpu-offloading-num-layers N",
                    source="megatron-core 0.16.1 transformer_config.py:1137-1152, model_parallel_config.py:370-389"),
)
