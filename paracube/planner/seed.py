"""The seed paper's experiments (Bian et al. 2021) as data: tensor-only scaling runs and the (tokens, hidden) map.

Every GPU sits in one tensor group (dp = pp = 1), as in the paper. For each mode the planner picks the
micro-batch and the placement of the mesh axes (`search` with the mode and shape fixed); 2.5D tries every
q x q x d with d >= 2. A mode with no valid layout (sizes that do not divide, memory over the device's)
is absent from the result. Model shape: a GPT with f = 4h, 64 heads (1D over p > 64 ranks: p heads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.planner.search import search
from paracube.planner.theory import MODES, exact_shapes
from paracube.workload import ModelSpec, TrainingSpec

Best = dict[str, tuple[Layout, StepEstimate]]


def gpt(hidden: int, layers: int = 12, seq: int = 512, gpus: int = 64, vocab: int = 51200) -> ModelSpec:
    """A GPT of this hidden size whose head count every mode over `gpus` ranks divides."""
    heads = max(64, gpus) if hidden % max(64, gpus) == 0 else 64
    return ModelSpec(f"gpt-{layers}x{hidden}", layers=layers, hidden=hidden, heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, seq_len=seq)


def shapes(mode: str, gpus: int) -> list[tuple[int, ...]]:
    """Every shape of the mode with all `gpus` devices in the tensor group (2.5D: each q x q x d, d >= 2)."""
    return exact_shapes(mode, gpus)


def tensor_only_best(model: ModelSpec, training: TrainingSpec, topo: object, gpus: int,
                     modes: Sequence[str] = MODES) -> Best:
    """The fastest layout of each mode with all `gpus` devices in the tensor group."""
    best: Best = {}
    for mode in modes:
        for shape in shapes(mode, gpus):
            try:
                found = search(model, training, topo, gpus, fixed=Layout(mode=mode, shape=shape), top_k=1)  # type: ignore[arg-type]
            except ParacubeError:
                continue
            lay, est = found.ranked[0]
            if mode not in best or est.step_time_s < best[mode][1].step_time_s:
                best[mode] = (lay, est)
    return best


@dataclass(frozen=True)
class Point:
    cluster: str
    gpus: int
    mode: str
    layout: str
    hidden: int
    tokens: int
    step_time_s: float
    memory_bytes: float
    bytes_per_gpu: float


def scaling(clusters: Sequence[str], counts: Sequence[int], model_of: Callable[[int], ModelSpec],
            training_of: Callable[[int], TrainingSpec], load: Callable[[str, int], object]) -> list[Point]:
    """One Point per (cluster, GPU count, mode with a valid layout); model and training may grow with p."""
    out: list[Point] = []
    for cluster in clusters:
        for n in counts:
            model, training = model_of(n), training_of(n)
            for mode, (lay, est) in tensor_only_best(model, training, load(cluster, n), n).items():
                out.append(Point(cluster, n, mode, str(lay), model.hidden,
                                 training.global_batch * training.sequence_length(model), est.step_time_s,
                                 est.memory.total, est.comm_bytes_per_gpu))
    return out


def win_map(topo: object, gpus: int, batches: Sequence[int], hiddens: Sequence[int], seq: int = 512,
            layers: int = 12, dtype: str = "fp16") -> dict[str, np.ndarray]:
    """Step time [len(hiddens), len(batches)] per mode (NaN: no valid layout) over global batch x hidden."""
    times = {m: np.full((len(hiddens), len(batches)), np.nan) for m in MODES}
    for i, h in enumerate(hiddens):
        for j, b in enumerate(batches):
            best = tensor_only_best(gpt(h, layers, seq, gpus), TrainingSpec(global_batch=b, dtype=dtype),  # type: ignore[arg-type]
                                    topo, gpus)
            for mode, (_, est) in best.items():
                times[mode][i, j] = est.step_time_s
    return times


__all__ = ["Point", "gpt", "scaling", "shapes", "tensor_only_best", "win_map"]
