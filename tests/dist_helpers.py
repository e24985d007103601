"""Multi-process test harness: run `fn(rank, world_size, *args)` on `world_size` gloo ranks.

The same launcher as `paracube calibrate` and `validate` (paracube.executor.launch.local_ranks.run_on_ranks:
forkserver with torch preloaded, the rendezvous store hosted by this process on 127.0.0.1, bound on port 0 by
the store itself (launch/rendezvous.py: no free-port race with other jobs), ranks bound to cores as the executor binds
them, a timeout that fails the test instead of hanging it); failures become AssertionErrors carrying the
failing rank's whole traceback. `fn` must be importable (module level) and return something picklable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from paracube.executor.launch.local_ranks import RanksFailed, run_on_ranks
from paracube.executor.launch.rendezvous import agent_env, launcher_store


def _without_device(rank: int, world_size: int, device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(rank, world_size, *args)


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240.0) -> list[Any]:
    """Results of fn on every rank, in rank order. Raises AssertionError on any worker failure or timeout."""
    try:
        return run_on_ranks(_without_device, world_size, (fn, *args), "gloo", timeout, "distributed run")
    except RanksFailed as exc:
        raise AssertionError(f"{exc}\n{exc.details}") from None


@contextmanager
def in_process_rendezvous(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """For a rank run in this process (train(plan, 0, 1, ...)): a store hosted here on port 0 and the environment
    with which env:// joins it as a client (no free port chosen and bound later); yields its port."""
    store = launcher_store()
    for key, value in agent_env("127.0.0.1", store.port).items():
        monkeypatch.setenv(key, value)
    try:
        yield store.port
    finally:
        del store


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

def steps_against_serial(model: Any, opt: Any, ref: Any, ref_opt: Any, micro: list, ref_micro: list, tokens: int,
                         steps: int, max_norm: float) -> tuple[dict[str, float], list]:
    """`steps` train_steps of the sharded model (its replica's `micro`) and of the serial reference (every
    replica's micro-batches `ref_micro`): relative errors of each step's loss and gradient norm and of every
    parameter block after them, and the collectives (CommEvent keys) the sharded model recorded in step 0."""
    from paracube.executor import train_step

    errors: dict[str, float] = {}
    events: list = []
    for step in range(steps):
        model.mesh.recorder.reset()
        res = train_step(model, opt, model.mesh, micro, tokens, max_norm)
        ref_res = train_step(ref, ref_opt, ref.mesh, ref_micro, tokens, max_norm)
        if step == 0:
            events = [e.key() for e in model.mesh.recorder.events]
        errors[f"step{step}.loss"] = abs(res.loss - ref_res.loss) / ref_res.loss
        errors[f"step{step}.grad_norm"] = abs(res.grad_norm - ref_res.grad_norm) / ref_res.grad_norm
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errors[f"param:{name}"] = rel_err(p, model.block_of(name, ref_params[name]))
    return errors, events


__all__ = ["in_process_rendezvous", "layout_from", "rel_err", "run_distributed", "steps_against_serial"]


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
