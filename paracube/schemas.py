"""JSON Schemas of what paracube writes: the plan file, `simulate --json` (a StepEstimate) and
`validate --json`, exported from pydantic models (`paracube schema plan|estimate|validate`,
docs/plan-schema.md). The models forbid unknown keys; tests check real outputs against them, so a field
added to a writer without its schema fails a test.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PositiveInt

from paracube.plan import SCHEMA_VERSION, _LaunchFile, _PlanFile
from paracube.workload import ModelSpec, TrainingSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanSchema(_PlanFile):
    """A plan file (paracube/plan.py): what `paracube plan -o` writes and run / validate / export read."""

    schema_version: Literal[2] = SCHEMA_VERSION  # type: ignore[assignment]
    model: ModelSpec  # type: ignore[assignment]
    training: TrainingSpec  # type: ignore[assignment]
    cluster: str  # a topology preset name, or the absolute path of a topology YAML file
    layout: str  # dp=N,pp=N,tp=MODE:SHAPE[,mb=N][,v=N][,sp][,zero=0|1|3][,place=...] (paracube/layout_parse.py)
    runtime: str = "paracube"  # paracube | megatron | torchtitan | deepspeed (paracube/runtimes)
    launch: _LaunchFile


class MemorySchema(_Strict):
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    temporaries: float
    total: float


class EventSchema(_Strict):
    kind: str
    axes: list[str]
    group_size: int
    payload_bytes: int
    dtype: str
    phase: str
    label: str


class EstimateSchema(_Strict):
    """One step of one layout as a cost model predicts it (paracube/estimate.py StepEstimate.to_dict)."""

    layout: str
    engine: str
    step_time_s: float
    compute_time_s: float
    comm_time_s: float
    exposed_comm_time_s: float
    bubble_time_s: float
    memory_per_gpu_bytes: float
    memory_breakdown_bytes: MemorySchema
    comm_bytes_per_gpu: float
    flops_per_gpu: float
    mfu: float
    comm_time_by_axis: dict[str, float]
    comm_time_by_kind: dict[str, float]
    notes: list[str]
    events: list[EventSchema] | None = None  # with `simulate --events`


class ValidateStepSchema(_Strict):
    step: PositiveInt
    step_time_s: float
    comm_time_s: float
    comm_cpu_s: float
    bytes_sent_per_rank: float
    memory_bytes: float


class ComparisonSchema(_Strict):
    name: str
    predicted: float
    measured: float
    rel_err: float  # (predicted - measured) / measured
    band: float  # relative uncertainty of the prediction


class ValidateSchema(_Strict):
    """`paracube validate --json` (paracube/validation/validate.py)."""

    layout: str
    steps: list[ValidateStepSchema]
    measured_steps: list[int]
    comparisons: list[ComparisonSchema]
    bytes_equal: bool
    cluster: str
    calibrated: bool
    within_band: bool | None = None  # None: no band (uncalibrated); paracube/validation/verdict.py
    verdict: str = ""


SCHEMAS: dict[str, type[BaseModel]] = {"plan": PlanSchema, "estimate": EstimateSchema, "validate": ValidateSchema}


def json_schema(name: str) -> dict[str, Any]:
    from paracube.errors import unknown

    if name not in SCHEMAS:
        raise unknown("schema", name, SCHEMAS)
    schema = SCHEMAS[name].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


__all__ = ["SCHEMAS", "EstimateSchema", "PlanSchema", "ValidateSchema", "json_schema"]
