"""gpu_check.py's GEMM checks (2 and 4): bf16 GEMMs at the cost model's local shapes, timed on the device.

check_gemms (2): the forward GEMM X [m, k] x A [k, n] of every linear of a block and of the head at
compute.local_shape for one micro-batch of mb x seq tokens (layout dp=1): measured TFLOP/s against
GemmModel.gemm_time's prediction for the topology's device (peak x eff(m, n, k), cost_models/compute.py).
check_tpo (4): each block linear's bf16 forward GEMM at the local shape of 1D + sp (tp=8; CPU tp=2), 2D (q=2) and
3D (q=2) timed whole and as the ring's n chunks (1D and 3D: n row blocks of X; 2D: n blocks of the contraction,
accumulated; executor/layers/collective_matmul*.py), back to back with no communication: chunked / whole is the
GEMM time the decomposition costs (cost_models/tpo.py prices the chunks at the whole GEMM's time: 1.0).
Each GEMM: 2 warm-up runs (kernel selection, caches), then the mean of 20 runs (CUDA; 3 on CPU), synchronized.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_gemms(spec: Any, cfg: dict, device: Any) -> list[dict[str, Any]]:
    """2: bf16 forward GEMMs of one micro-batch at the cost model's local shapes, measured vs predicted."""
    import numpy as np
    import torch

    from paracube.cost_models.compute import local_shape
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.dims import dims_of, padded_vocab
    from paracube.cost_models.validity import layout_arrays
    from paracube.layout_parse import parse_layout
    from paracube.modes import MODES
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    layout = parse_layout(f"dp=1,mb={cfg['mb']}")
    d = dims_of(spec, TrainingSpec(global_batch=cfg["mb"], dtype="bf16"))
    g = gemm_model(load_topology(cfg["topology"], gpus=1), "bf16")
    b = layout_arrays(layout, cfg["mb"])
    T = np.array([float(cfg["mb"] * d.s)])
    linears = [(name, h_in, h_out, n in (0, 2)) for n, (name, h_in, h_out, _) in enumerate(d.linears)]
    linears.append(("head", d.h, padded_vocab(d.V, int(MODES["none"].vocab_split(1, 1))), True))
    rows = []
    for name, h_in, h_out, column in linears:
        m, n, k = (int(np.asarray(x).reshape(-1)[0]) for x in local_shape("none", T, h_in, np.array([h_out]),
                                                                          column, b))
        x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        a = torch.randn(k, n, dtype=torch.bfloat16, device=device)
        reps = 20 if device.type == "cuda" else 3
        for _ in range(2):
            x @ a  # warm-up: kernel selection, caches
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            x @ a
        _sync(device)
        seconds = (time.perf_counter() - t0) / reps
        predicted = float(g.gemm_time(m, n, k))
        flops = 2.0 * m * n * k
        rows.append({"gemm": name, "m": m, "n": n, "k": k, "tflops": flops / seconds / 1e12,
                     "predicted_tflops": flops / predicted / 1e12, "ratio": predicted / seconds})
    return rows


def _contraction_chunks(xs: Any, as_: Any) -> None:
    import torch

    y = torch.zeros(xs[0].shape[0], as_[0].shape[1], dtype=torch.float32, device=xs[0].device)
    for xj, aj in zip(xs, as_, strict=True):
        y.add_(xj @ aj)


def _row_chunks(xs: Any, a: Any) -> None:
    import torch

    rows = sum(xj.shape[0] for xj in xs)
    out = torch.empty(rows, a.shape[1], dtype=a.dtype, device=a.device)
    start = 0
    for xj in xs:
        out[start:start + xj.shape[0]].copy_(xj @ a)
        start += xj.shape[0]

TPO_SHAPES = {"cuda": {"1d": 8, "2d": 2, "3d": 2}, "cpu": {"1d": 2, "2d": 2, "3d": 2}}  # ranks per ring


def check_tpo(spec: Any, cfg: dict, device: Any) -> list[dict[str, Any]]:
    """4: a block's forward GEMMs at the local shapes of 1D + sp, 2D and 3D, whole vs in the ring's chunks."""
    import numpy as np
    import torch

    from paracube.cost_models.compute import local_shape
    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.validity import layout_arrays
    from paracube.layout_parse import parse_layout
    from paracube.workload import TrainingSpec

    d = dims_of(spec, TrainingSpec(global_batch=cfg["mb"], dtype="bf16"))
    reps = 20 if device.type == "cuda" else 3
    rows = []
    for mode, n in TPO_SHAPES[device.type].items():
        shape = {"1d": f"1d:{n},sp", "2d": f"2d:{n}x{n}", "3d": f"3d:{n}x{n}x{n}"}[mode]
        b = layout_arrays(parse_layout(f"tp={shape},mb={cfg['mb']}"), cfg["mb"])
        T = np.array([float(cfg["mb"] * d.s)])
        for i, (name, h_in, h_out, _) in enumerate(d.linears):
            m, nn_, k = (int(np.asarray(x).reshape(-1)[0])
                         for x in local_shape(mode, T, h_in, np.array([h_out]), i in (0, 2), b))
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            a = torch.randn(k, nn_, dtype=torch.bfloat16, device=device)
            if mode == "2d":  # Y = sum_j X[:, block j] A[block j, :] (RingLinear2D)
                chunked = partial(_contraction_chunks, x.chunk(n, dim=1), a.chunk(n, dim=0))
            else:  # row blocks X_j A into the output (RingGatherLinear, RingLinear3D)
                chunked = partial(_row_chunks, x.chunk(n, dim=0), a)
            timings = []
            for fn in (partial(torch.matmul, x, a), chunked):
                for _ in range(2):
                    fn()  # warm-up
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                _sync(device)
                timings.append((time.perf_counter() - t0) / reps)
            rows.append({"mode": shape, "gemm": name, "m": m, "n": nn_, "k": k, "chunks": n,
                         "whole_us": timings[0] * 1e6, "chunked_us": timings[1] * 1e6,
                         "ratio": timings[1] / timings[0]})
    return rows
