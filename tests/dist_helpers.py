"""Multi-process test harness: run `fn(rank, world_size, *args)` on `world_size` gloo ranks.

The same launcher as `paracube calibrate` and `validate` (paracube.executor.local_ranks.run_on_ranks:
forkserver with torch preloaded, 127.0.0.1 and a free port, ranks bound to cores as the executor binds
them, a timeout that fails the test instead of hanging it); failures become AssertionErrors carrying the
failing rank's whole traceback. `fn` must be importable (module level) and return something picklable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from paracube.executor.local_ranks import RanksFailed, free_port, run_on_ranks


def _without_device(rank: int, world_size: int, device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(rank, world_size, *args)


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240.0) -> list[Any]:
    """Results of fn on every rank, in rank order. Raises AssertionError on any worker failure or timeout."""
    try:
        return run_on_ranks(_without_device, world_size, (fn, *args), "gloo", timeout, "distributed run")
    except RanksFailed as exc:
        raise AssertionError(f"{exc}\n{exc.details}") from None


# --- comparison helpers shared by the equivalence tests --------------------------------------------------
def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Norm-wise relative error ||a - e|| / ||e|| (absolute when e is all zeros)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff


def layout_from(text: str) -> Any:
    from paracube.layout import parse_layout

    return parse_layout(text)

__all__ = ["free_port", "layout_from", "rel_err", "run_distributed"]


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The model's local loss sum on one micro-batch, and the bytes of the distinct storages autograd saves for
    backward during that forward (parameters excluded): the executor's activation memory."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = max(saved.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        local_sum, _ = model(ids, labels)
    return local_sum, sum(saved.values())
