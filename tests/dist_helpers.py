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


# What the test ranks' forkserver imports once, beyond the launcher's own PRELOAD: the modules (nearly) every test
# module imports, so that a rank unpickling `fn` imports only its test module itself. Measured on a 2-core VM:
# importing a test module in a fresh rank cost 0.15-0.84 CPU-s (test_fidelity 0.71: pytest, networkx, numpy,
# yaml, the cost models) with the launcher's preload alone and 0.01-0.17 CPU-s with this one; an 8-rank launch
# of a no-op went from ~6 to ~1.6 CPU-s. The test modules themselves cannot be preloaded: Python 3.11's
# forkserver ignores the parent's sys.path (tests/ is not on its path). Honoured by the first launch of a pytest
# process (the one that starts the forkserver).
TEST_PRELOAD = ("pytest", "numpy", "networkx", "yaml", "paracube.cost_models", "paracube.topologies",
                "paracube.executor", "paracube.planner", "paracube.runtimes", "paracube.estimate", "paracube.plan")


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240.0) -> list[Any]:
    """Results of fn on every rank, in rank order. Raises AssertionError on any worker failure or timeout."""
    try:
        return run_on_ranks(_without_device, world_size, (fn, *args), "gloo", timeout, "distributed run",
                            preload=TEST_PRELOAD)
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
TOL_FP64 = 1e-5
"""Relative error bound of an equivalence test whose serial and sharded copies both run in fp64
(build_model(..., dtype=torch.float64)): loss, gradients and parameters after AdamW steps.

Why fp64: in fp32 the two copies sum in different orders, so they differ by rounding (~1e-7 relative), and
AdamW divides by sqrt(v) + eps: where a gradient is zero in exact arithmetic (the key bias of attention:
softmax is invariant to adding q.b_k to every score of a row) its computed value is pure rounding noise δ,
and the update lr * δ / (|δ| + eps) differs between the copies by up to lr per step. With δ ~ 1e-9 (fp32
noise of O(1e-2) gradients) and eps = 1e-6 that is ~1e-3 lr per element, which exceeded 1e-5 of a bias's
norm on some CPUs (different BLAS kernels, different noise). In fp64 the noise is ~1e-17 absolute, so the
amplified difference is ~1e-11 lr and the bound no longer depends on the CPU. What stays fp32 by design
bounds the rest: the gradient buckets and the optimizer's master weights and moments (grad_sync.py,
optim.py; the same code on both sides) and the fp32 collectives the cost model prices (functional.fp32),
which round different summation orders to ~1e-7 relative; 1e-5 leaves two orders of magnitude above that,
while a wrong shard, a missing or doubled reduction, or a wrong optimizer shard gives errors of order 1.
Tests about a 16-bit or fp32 dtype itself (precision, loss scaling) state their own bounds."""


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Norm-wise relative error ||a - e|| / ||e|| (absolute when e is all zeros)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff


def layout_from(text: str) -> Any:
    from paracube.layout_parse import parse_layout

    return parse_layout(text)

F64 = torch.float64  # the equivalence copies' dtype (TOL_FP64)


def fp64_optimizer(model: Any, **adamw: Any) -> torch.optim.Optimizer:
    """The executor's optimizer for an fp64 copy (MasterAdamW: fp32 masters stepped with the fp32 reduced
    gradients, as for any non-fp32 compute dtype; torch's AdamW would see no p.grad, only main_grad).
    Default settings: the equivalence tests' AdamW (lr 1e-3, weight decay 0.1, eps 1e-6)."""
    from paracube.executor.data_parallel.optim import build_optimizer
    from paracube.modes.buckets import BUCKET_BYTES

    return build_optimizer(model, model.mesh, 0, BUCKET_BYTES, **({"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}
                                                                   | adamw))


def one_step_events(model: Any, micro: list, tokens: int, max_norm: float, opt: Any = None) -> list:
    """The collectives (CommEvent keys) of one train_step of an fp32 `model` (with `opt`, default torch's AdamW):
    the payloads the cost model prices for an fp32 plan (an fp64 copy would move 8-byte elements)."""
    from paracube.executor import train_step

    opt = opt if opt is not None else torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-6)
    model.mesh.recorder.reset()
    train_step(model, opt, model.mesh, micro, tokens, max_norm)
    return [e.key() for e in model.mesh.recorder.events]


def steps_against_serial(model: Any, opt: Any, ref: Any, ref_opt: Any, micro: list, ref_micro: list, tokens: int,
                         steps: int, max_norm: float) -> tuple[dict[str, float], list]:
    """`steps` train_steps of the sharded model (its replica's `micro`) and of the serial reference (every
    replica's micro-batches `ref_micro`): relative errors of each step's loss and gradient norm and of every
    parameter block after them, and the collectives (CommEvent keys) the sharded model recorded in step 0.
    zero=1 runs with its parameter all-gathers overlapped with the next forward (param_gather.py), as `paracube
    run` does; the parameters are compared once the last step's gathers are finished (`wait_params`)."""
    from paracube.executor import train_step

    errors: dict[str, float] = {}
    events: list = []
    for step in range(steps):
        model.mesh.recorder.reset()
        res = train_step(model, opt, model.mesh, micro, tokens, max_norm, param_overlap=True)
        ref_res = train_step(ref, ref_opt, ref.mesh, ref_micro, tokens, max_norm)
        if step == 0:
            events = [e.key() for e in model.mesh.recorder.events]
        errors[f"step{step}.loss"] = abs(res.loss - ref_res.loss) / ref_res.loss
        errors[f"step{step}.grad_norm"] = abs(res.grad_norm - ref_res.grad_norm) / ref_res.grad_norm
    if hasattr(opt, "wait_params"):
        opt.wait_params()
    if getattr(opt, "units", None) is not None:  # zero=3: the parameters whole again (resharded after backward)
        opt.units.gather_all()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errors[f"param:{name}"] = rel_err(p, model.block_of(name, ref_params[name]))
    return errors, events


__all__ = ["F64", "TOL_FP64", "fp64_optimizer", "in_process_rendezvous", "layout_from", "one_step_events", "rel_err",
           "run_distributed", "steps_against_serial"]


def sharded_memory(model: torch.nn.Module, opt: Any) -> dict[str, int]:
    """Bytes per rank a zero=2/3 step holds, measured on the executor's tensors (ShardedAdamW: its parameter shards,
    gradient shards, fp32 masters and moments; the peak of the gathered units and of the unit gradient buffers)."""
    units = getattr(opt, "units", None)
    params = units.shard_bytes() if units is not None else sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "parameters": params,
        "gradients": sum(u.shard.numel() * 4 for u in opt.sync.buckets),
        "optimizer": sum(m.numel() * m.element_size() for m in opt.masters)
        + sum(s[k].numel() * s[k].element_size() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")),
        "gathered_params": units.peak_bytes if units is not None else 0,
        "gradient_buffers": opt.sync.peak_grad_bytes,
    }


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
