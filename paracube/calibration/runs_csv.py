"""A runs CSV (published or your own training runs) read into `Run` rows.

A runs CSV has one row per measured run. Columns (one line of error naming row and field on bad input):
    run            a name
    cluster        a preset name (topologies/presets.py), e.g. dgx-a100
    gpus           world size (the layout's dp x pp x tensor ranks must equal it)
    model          a model preset (model_presets.resolve_model) -- or hidden, heads, layers, vocab (gpt, ffn = 4h) and
                   optionally kv_heads (grouped-query attention), ffn, family (gpt | llama)
    seq, global_batch, dtype, recompute (none | selective | full)
    layout         layout text (layout.parse_layout); fields it leaves open (mb, v) the planner chooses
    measured_step_s  measured seconds per optimizer step
    split          optional: fit | held_out (default fit)
    runtime        optional: the runtime the row is planned for (paracube/runtimes, e.g. torchtitan for FSDP
                   runs); empty or absent: the caller's (`predict(..., runtime)`, the benchmark's --runtime).
                   Saved activations are counted as Megatron kept them (TrainingSpec.activations="megatron")
                   unless the row names a runtime other than megatron ("paracube": flash attention, no dropout)
    grad_bucket    optional: the gradient bucket the run's stack used; empty: 25 MiB (torch DDP's default, what
                   paracube's executor and exports use, modes/buckets.py); `mcore`: Megatron-core's default,
                   max(40M, 1M x dp x cp) fp32 elements (megatron/core/distributed/distributed_data_parallel.py:
                   the bucket grows with the data-parallel size so that the ring's (n - 1) latency steps stay
                   amortized; NeMo 2 recipes leave it unset); or a number of elements
    grad_reduce    optional: fp32 (default) | bf16, the gradient buffers' dtype, which the data-parallel
                   reduction sends and memory holds (Megatron-core's grad_reduce_in_fp32; NeMo's performance
                   scripts set it False for FP8 runs, scripts/performance/llm/pretrain_*.py, and keep
                   bf16_mixed's True for bf16 ones; Megatron-Bridge's Qwen3-MoE and DeepSeek-V3 recipes set it
                   False in every precision, 0.1.0rc4 recipes/qwen/qwen3_30b_a3b.py:175)
    capacity_factor  optional, MoE rows: the experts' capacity factor of a token-drop run (Megatron-Bridge's
                   "tokendrop": 1.0, padded to capacity); empty: the preset's (dropless). It also sets the dispatcher:
                   Megatron-core runs DeepEP dropless only (cost_models/moe_dispatch.py)
    dispatcher     optional, MoE rows: the token dispatcher the run used (moe_dispatch.DISPATCHERS): alltoall,
                   deepep or hybridep (Megatron-core's flex dispatcher backends); empty: the runtime's
                   (Runtime.moe_dispatch)
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from paracube.cost_models.moe_dispatch import DISPATCHERS
from paracube.errors import ParacubeError, check
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import resolve_model
from paracube.modes.buckets import GRAD_BYTES
from paracube.runtimes import RUNTIMES
from paracube.workload import ModelSpec, TrainingSpec

REQUIRED = ("run", "cluster", "gpus", "seq", "global_batch", "dtype", "recompute", "layout", "measured_step_s")
SHAPE = ("hidden", "heads", "layers", "vocab")


@dataclass(frozen=True)
class Run:
    name: str
    cluster: str
    gpus: int
    model: ModelSpec
    training: TrainingSpec
    layout: Layout
    measured_s: float
    split: str = "fit"
    runtime: str | None = None  # the row's own runtime (None: the caller's)
    bucket_bytes: int | None = None  # the run's gradient bucket in bytes (None: modes/buckets.BUCKET_BYTES)
    grad_bytes: int = 4  # the run's gradient element (grad_reduce column: fp32 4, bf16 2)
    dispatcher: str | None = None  # the run's MoE token dispatcher (None: the runtime's)


def _int(where: str, value: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ParacubeError(f"{where}={value!r} must be a positive integer") from None
    if out < 1:
        raise ParacubeError(f"{where}={value!r} must be a positive integer")
    return out


def _float(where: str, value: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ParacubeError(f"{where}={value!r} must be a positive number of seconds") from None
    if not out > 0:
        raise ParacubeError(f"{where}={value!r} must be a positive number of seconds")
    return out


def _model(where: str, row: dict[str, str], seq: int) -> ModelSpec:
    if row.get("model"):
        try:
            return resolve_model(row["model"])
        except ParacubeError as e:
            raise ParacubeError(f"{where}: model: {e}") from None
    missing = [k for k in SHAPE if not row.get(k)]
    if missing:
        raise ParacubeError(f"{where}: missing column {missing[0]!r} (give model=PRESET or {', '.join(SHAPE)})")
    h, heads, layers, vocab = (_int(f"{where}: {k}", row[k]) for k in SHAPE)
    try:
        kv = _int(f"{where}: kv_heads", row["kv_heads"]) if (row.get("kv_heads") or "").strip() else None
        ffn = _int(f"{where}: ffn", row["ffn"]) if (row.get("ffn") or "").strip() else 4 * h
        family = (row.get("family") or "").strip() or "gpt"
        return ModelSpec(row["run"] or "run", layers, h, heads, ffn, vocab, seq, family=family,  # type: ignore[arg-type]
                         kv_heads=kv)
    except ParacubeError as e:
        raise ParacubeError(f"{where}: {e}") from None


def parse_row(i: int, row: dict[str, str], clusters: tuple[str, ...]) -> Run:
    """One CSV row (line i of the file) -> Run; one ParacubeError line naming the row and the field."""
    where = f"row {i} ({row.get('run') or '?'})"
    for key in REQUIRED:
        if not (row.get(key) or "").strip():
            raise ParacubeError(f"{where}: missing {key!r}; columns needed: {', '.join(REQUIRED)}")
    if row["cluster"] not in clusters:
        raise ParacubeError(f"{where}: cluster={row['cluster']!r} is not a preset; valid: {', '.join(clusters)}")
    gpus, seq, batch = (_int(f"{where}: {k}", row[k]) for k in ("gpus", "seq", "global_batch"))
    model = _model(where, row, seq)
    cap = (row.get("capacity_factor") or "").strip()
    if cap:
        check(model.moe is not None, f"{where}: capacity_factor={cap!r} for {model.name}, which has no experts")
        model = replace(model, moe=replace(model.moe, capacity_factor=_float(f"{where}: capacity_factor", cap)))
    dispatcher = (row.get("dispatcher") or "").strip() or None
    if dispatcher is not None:
        check(model.moe is not None, f"{where}: dispatcher={dispatcher!r} for {model.name}, which has no experts")
        check(dispatcher in DISPATCHERS, f"{where}: dispatcher={dispatcher!r}; valid: {', '.join(DISPATCHERS)}")
        check(dispatcher != "deepep" or not cap, f"{where}: dispatcher=deepep with capacity_factor={cap}: "
              "Megatron-core runs DeepEP dropless only (leave one empty)")
    runtime = (row.get("runtime") or "").strip() or None
    if runtime is not None and runtime not in RUNTIMES:
        raise ParacubeError(f"{where}: runtime={runtime!r}; valid: {', '.join(RUNTIMES)}")
    # Saved activations as Megatron kept them (dropout, unfused attention's s x s) unless the row names another
    # runtime: those (torchtitan: SDPA flash, no dropout) save what paracube's executor does.
    acts = "megatron" if runtime in (None, "megatron") else "paracube"
    try:
        training = TrainingSpec(global_batch=batch, seq_len=seq, dtype=row["dtype"],  # type: ignore[arg-type]
                                recompute=row["recompute"], activations=acts)  # type: ignore[arg-type]
        layout = parse_layout(row["layout"])
    except ParacubeError as e:
        raise ParacubeError(f"{where}: {e}") from None
    if layout.world_size != gpus:
        raise ParacubeError(f"{where}: layout={row['layout']!r} has {layout.world_size} ranks, gpus={gpus}")
    split = (row.get("split") or "fit").strip()
    if split not in ("fit", "held_out"):
        raise ParacubeError(f"{where}: split={split!r}; valid: fit, held_out")
    return Run(row["run"], row["cluster"], gpus, model, training, layout,
               _float(f"{where}: measured_step_s", row["measured_step_s"]), split, runtime,
               _bucket(where, (row.get("grad_bucket") or "").strip(), layout),
               _grad_bytes(where, (row.get("grad_reduce") or "").strip()), dispatcher)


GRAD_REDUCE = {"": 4, "fp32": 4, "bf16": 2}


def _grad_bytes(where: str, value: str) -> int:
    check(value in GRAD_REDUCE, f"{where}: grad_reduce={value!r}; valid: fp32, bf16 (empty: fp32)")
    return GRAD_REDUCE[value]


MCORE_BUCKET_MIN, MCORE_BUCKET_PER_DP = 40_000_000, 1_000_000  # elements (Megatron-core DDP's default)


def _bucket(where: str, value: str, layout: Layout) -> int | None:
    """The grad_bucket column as bytes of fp32 gradients (None: the default bucket)."""
    if not value:
        return None
    if value == "mcore":
        return GRAD_BYTES * max(MCORE_BUCKET_MIN, MCORE_BUCKET_PER_DP * layout.dp * layout.cp)
    return GRAD_BYTES * _int(f"{where}: grad_bucket (mcore or a number of elements)", value)


def read_runs(path: str | Path, clusters: tuple[str, ...]) -> list[Run]:
    p = Path(path)
    if not p.is_file():
        raise ParacubeError(f"runs file {str(p)!r} does not exist")
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [k for k in REQUIRED if k not in (reader.fieldnames or ())]
        if missing:
            raise ParacubeError(f"{p}: missing column {missing[0]!r}; columns needed: {', '.join(REQUIRED)}")
        return [parse_row(i, row, clusters) for i, row in enumerate(reader, start=2)]
