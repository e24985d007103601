"""The plan file: the contract between planner and executor.

A plan is schema-versioned, human-readable JSON:
```json
{
  "schema_version": 1,
  "paracube_version": "0.1.0",
  "model": {"name": "tiny", "layers": 2, "hidden": 64, ...},
  "training": {"global_batch": 8, "seq_len": null, "dtype": "fp32", "recompute": "none", "optimizer": "adamw"},
  "cluster": "local-cpu",
  "gpus": 8,
  "layout": "dp=1,tp=3d:2x2x2,mb=4",
  "runtime": "paracube",
  "launch": {"backend": "auto", "nnodes": 1, "nproc_per_node": 8},
  "prediction": {"step_time_s": ..., "memory_per_gpu_bytes": ..., ...}
}
```
`load_plan` validates every field and reports the file, the field and what was expected.
Schema 2 added `runtime` (paracube/runtimes: the training stack the plan is made for; `paracube run` runs
runtime paracube, `paracube export --to T` runtime T); a schema-1 file reads as runtime paracube.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from paracube import __version__
from paracube.errors import ParacubeError, check
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)  # 1: before `runtime` (read as paracube)
Backend = Literal["auto", "gloo", "nccl"]


@dataclass(frozen=True)
class LaunchSpec:
    """How the ranks start: torchrun with `nnodes` x `nproc_per_node` processes. `auto`: NCCL on CUDA, else gloo."""

    nproc_per_node: int
    nnodes: int = 1
    backend: Backend = "auto"


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    training: TrainingSpec
    layout: Layout
    cluster: str
    gpus: int
    launch: LaunchSpec
    prediction: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default=())
    runtime: str = "paracube"  # the training stack it is made for (names checked by paracube.runtimes)

    def __post_init__(self) -> None:
        check(self.layout.world_size == self.gpus,
              f"layout {self.layout} needs {self.layout.world_size} ranks but the plan has gpus={self.gpus}")
        check(not self.layout.offload or self.layout.offload <= self.model.layers,
              f"layout {self.layout}: off={self.layout.offload} offloads more blocks than the model's "
              f"{self.model.layers}; valid: off=N with N in [0, {self.model.layers}]")
        check(self.launch.nnodes * self.launch.nproc_per_node == self.gpus,
              f"launch nnodes={self.launch.nnodes} x nproc_per_node={self.launch.nproc_per_node} "
              f"!= gpus={self.gpus}")

    @property
    def seq_len(self) -> int:
        return self.training.sequence_length(self.model)

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch per data-parallel replica (the layout's, else the largest that fits)."""
        if self.layout.micro_batch is not None:
            return self.layout.micro_batch
        return self.training.global_batch // self.layout.dp

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "paracube_version": __version__,
            "model": self.model.to_dict(),
            "training": self.training.to_dict(),
            "cluster": self.cluster,
            "gpus": self.gpus,
            "layout": str(self.layout),
            "runtime": self.runtime,
            "launch": {"backend": self.launch.backend, "nnodes": self.launch.nnodes,
                       "nproc_per_node": self.launch.nproc_per_node},
            "prediction": self.prediction,
            "notes": list(self.notes),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)
        return path

    def with_layout(self, layout: Layout) -> Plan:
        gpus = layout.world_size
        per_node = min(gpus, self.launch.nproc_per_node) if self.launch.nnodes > 1 else gpus
        launch = replace(self.launch, nproc_per_node=per_node, nnodes=gpus // per_node)
        return replace(self, layout=layout, gpus=gpus, launch=launch, prediction=None)


@lru_cache(maxsize=1)
def _file_models() -> tuple[type, type]:
    """(_PlanFile, _LaunchFile): the pydantic models a plan file is read with, built on first use: pydantic takes
    ~50 ms to import, and `paracube plan` only writes plans (the models are the same on every call)."""
    from pydantic import BaseModel, ConfigDict, PositiveInt

    class _LaunchFile(BaseModel):
        model_config = ConfigDict(extra="forbid")
        backend: Backend = "auto"
        nnodes: PositiveInt = 1
        nproc_per_node: PositiveInt

    class _PlanFile(BaseModel):
        model_config = ConfigDict(extra="forbid")
        schema_version: int
        paracube_version: str = ""
        model: dict[str, Any]
        training: dict[str, Any]
        cluster: str
        gpus: PositiveInt
        layout: str
        runtime: str = "paracube"
        launch: _LaunchFile
        prediction: dict[str, Any] | None = None
        notes: list[str] = []

    return _PlanFile, _LaunchFile


def __getattr__(name: str) -> type:
    """`_PlanFile` / `_LaunchFile` (schemas.py subclasses them), built on first use (PEP 562)."""
    if name in ("_PlanFile", "_LaunchFile"):
        return _file_models()[name == "_LaunchFile"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plan_from_dict(data: Any, source: str = "plan") -> Plan:
    check(isinstance(data, dict), f"{source}: expected a JSON object (a paracube plan), got {type(data).__name__}")
    version = data.get("schema_version")
    check(version in READ_VERSIONS,
          f"{source}: schema_version={version!r} is not supported; this paracube reads schema_version "
          f"{' or '.join(map(str, READ_VERSIONS))}")
    check(version != 1 or "runtime" not in data, f"{source}: field 'runtime' needs schema_version 2 (got 1)")
    from pydantic import ValidationError

    try:
        raw = _file_models()[0].model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ParacubeError(f"{source}: field {where!r}: {err['msg']} (got {err.get('input')!r})") from None
    try:
        model = ModelSpec.from_dict(raw.model, source=f"{source}: model")
        training = TrainingSpec.from_dict(raw.training, source=f"{source}: training")
        layout = parse_layout(raw.layout)
        launch = LaunchSpec(nproc_per_node=raw.launch.nproc_per_node, nnodes=raw.launch.nnodes,
                            backend=raw.launch.backend)
        return Plan(model, training, layout, raw.cluster, raw.gpus, launch, raw.prediction, tuple(raw.notes),
                    raw.runtime)
    except ParacubeError as exc:
        msg = str(exc)
        raise ParacubeError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    except TypeError as exc:
        raise ParacubeError(f"{source}: {exc}") from None


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ParacubeError(f"plan file {str(path)!r} does not exist "
                            f"(make one with `paracube plan -o {path}`)") from None
    except OSError as exc:
        raise ParacubeError(f"cannot read plan file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParacubeError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return plan_from_dict(data, source=str(path))


def is_cluster_file(cluster: str) -> bool:
    """A cluster named by a YAML file path (presets are plain names)."""
    return "/" in cluster or cluster.endswith((".yaml", ".yml"))


def recorded_cluster(cluster: str) -> str:
    """What a plan records for `--cluster`: a preset name as given, a file as its absolute path (so that
    validate / simulate / export reload it from any directory)."""
    path = Path(cluster)
    return str(path.resolve()) if is_cluster_file(cluster) and path.is_file() else cluster


def plan_cluster(plan: Plan, override: str | None = None, source: str = "plan") -> str:
    """The cluster to use for a plan: `override` (--cluster) if given, else the plan's own. A file the plan
    records must still exist (one line naming it)."""
    if override:
        return override
    check(not is_cluster_file(plan.cluster) or Path(plan.cluster).is_file(),
          f"{source}: its cluster file {plan.cluster!r} does not exist (moved or deleted?); "
          "pass --cluster FILE to use another")
    return plan.cluster


DEFAULT_LAYOUT = "dp=1,tp=3d:2x2x2,mb=4"


def default_plan(layout: str | Layout = DEFAULT_LAYOUT, model: ModelSpec | None = None,
                 training: TrainingSpec | None = None) -> Plan:
    """The embedded default: the tiny GPT, a 2x2x2 cube on 8 local CPU ranks, 2 micro-batches of 4 sequences."""
    lay = parse_layout(layout) if isinstance(layout, str) else layout
    return Plan(
        model=model or PRESETS["tiny"],
        training=training or TrainingSpec(global_batch=8),
        layout=lay,
        cluster="local-cpu",
        gpus=lay.world_size,
        launch=LaunchSpec(nproc_per_node=lay.world_size),
    )
