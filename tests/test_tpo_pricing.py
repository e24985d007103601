"""tpo priced as the executor runs its rings (cost_models/tpo.py): the declared schedules against the executor's,
and both engines on the rings of 2D / 2.5D / 3D (the weight gathers, dA's and 3D's Y reduce-scatters included).

No ranks: the schedules are derived here from the executor's own block order (ring.py: index r holds block
(r - s) mod n at step s; a reduce-scatter's step i produces chunk (r - 1 - i) mod n) and, for 3D, from its term
bookkeeping (collective_matmul_3d._Terms), then priced per rank; the declaration must be the slowest rank's.
Engines: the 2% bound of tests/test_runtimes.py (the two engines price the same decomposition; the residue is
the event engine's pipeline / bucket timing, not tpo). Bytes and events are compared exactly (zero difference).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from paracube.cost_models import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.tpo import hidden, program_gemm_steps, ring_hidden, runs
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes import MODES
from paracube.modes.base import chunks, coll
from paracube.modes.three_d import cube_out_ring, cube_ring, cube_wgrad_ring
from paracube.modes.two_d import summa_ring
from paracube.plan import TrainingSpec
from paracube.topologies import load_topology

RATIOS = (0.05, 0.3, 0.9, 1.7, 4.0, 20.0)  # exchange time / GEMM time: compute-bound to comm-bound


def _exposed(fractions: list[float] | tuple[float, ...], e: float, gemm: float) -> float:
    """sum_s max(0, e - f_s G): a rank's ring time beyond its GEMM (tpo.py)."""
    return sum(max(0.0, e - f * gemm) for f in fractions)


def _slowest(per_rank: list[list[float]], declared: tuple[float, ...]) -> None:
    """The declared schedule exposes what the slowest rank's does, at every exchange / GEMM ratio."""
    for ratio in RATIOS:
        worst = max(_exposed(f, ratio, 1.0) for f in per_rank)
        assert _exposed(declared, ratio, 1.0) == pytest.approx(worst, rel=1e-12, abs=1e-12), (ratio, declared)


@pytest.mark.parametrize("q", [2, 3, 4, 5, 6])
def test_2d_forward_schedule_is_the_slowest_ranks(q: int) -> None:
    """Rank (i, j): X's ring over col (index j) and A's over row (index i) in lock step; term k runs at the first
    step holding X block k and A block k (collective_matmul_2d.RingLinear2D), 1/q of the GEMM each; exchanges at
    steps 0..q-2. Kept weight (kw=1): every A block here, one term per step (`chunks`)."""
    per_rank = []
    for i, j in itertools.product(range(q), repeat=2):
        xs, ws, done, steps = set(), set(), set(), []
        for s in range(q):
            xs.add((j - s) % q)
            ws.add((i - s) % q)
            ready = (xs & ws) - done
            done |= ready
            steps.append(len(ready) / q)
        assert done == set(range(q))
        per_rank.append(steps[:-1])  # the last step has no exchange in flight
    _slowest(per_rank, summa_ring(q, True))
    assert summa_ring(2, True) == (0.0,)  # q = 2: the off-diagonal ranks' one exchange hides nothing
    _slowest([[1.0 / q] * (q - 1)], summa_ring(q, False))


@pytest.mark.parametrize("q", [2, 3, 4])
def test_3d_forward_and_y_schedules_are_the_slowest_ranks(q: int) -> None:
    """The executor's _Terms fed the blocks rank (r_I, r_W) receives (paired: both rings; kept: X's alone), the
    last step's terms deferred; Y's ring over O (index r_O) then produces chunk (r_O - 1 - i) mod q at step i,
    finished by the deferred terms (a row's count / q^2 of the GEMM), exchanges at steps 1..q-1."""
    from paracube.executor.layers.collective_matmul_3d import _Terms

    tl, sb, width = 1, 1, 1
    xs = [torch.zeros(tl, q * sb, dtype=torch.float64) for _ in range(q)]
    a = torch.zeros(q * sb, width, dtype=torch.float64)
    for paired in (True, False):
        fwd, out = [], []
        for r_i, r_w in itertools.product(range(q), repeat=2):
            terms = _Terms(q, sb, width, torch.float64)
            if not paired:
                terms.a.update({k: a[k * sb:(k + 1) * sb] for k in range(q)})
            steps = []
            for s in range(q):
                before = len(terms.seen)
                blocks = [((r_i - s) % q, xs[(r_i - s) % q])]
                if paired:
                    blocks.append(((r_w - s) % q, a[((r_w - s) % q) * sb:][:sb]))
                terms.arrive(blocks, defer=s == q - 1 and q > 1)
                steps.append((len(terms.seen) - before) / q**2)
            fwd.append(steps[:-1])
            deferred = {k: len(v) / q**2 for k, v in terms.pending.items()}
            assert sum(steps[:-1]) + sum(deferred.values()) == pytest.approx(1.0)  # every term once
            for r_o in range(q):
                out.append([deferred.get((r_o - 1 - i) % q, 0.0) for i in range(1, q)])
        _slowest(fwd, cube_ring(q, paired))
        _slowest(out, cube_out_ring(q, paired))
    # dA over W: each chunk finishes its sub-block (1/q of h_in's rows) with the last dY block's term (1/q of the
    # tokens): (1/q)(1/q) of the dA GEMM per chunk, exchanges at steps 1..q-1
    assert cube_wgrad_ring(q, False) == pytest.approx((1.0 / q**2,) * (q - 1))


def test_lockstep_rings_share_their_chunks_by_bytes() -> None:
    """program_gemm_steps (event engine) and ring_hidden (analytic) on one 2D forward at q = 4: X and A split each
    chunk by their exchange's bytes; unpaired (A kept from an earlier micro-batch) X takes the whole chunk. The
    chunks handed out never exceed the GEMM. The default schedule (1D) prices as the closed form tpo.hidden."""
    x = coll("all_gather", "col", "compute", lambda z: 0, "qkv.X", tpo="qkv.f", ring=summa_ring, lockstep=True)
    w = coll("all_gather", "row", "compute", lambda z: 0, "qkv.A", kept=True, tpo="qkv.f", ring=summa_ring,
             lockstep=True)
    gx, ga = program_gemm_steps([(x, 4, 1.0, 8.0), (w, 4, 3.0, 8.0)])
    assert gx == pytest.approx((0.0, 0.0, 1.0)) and ga == pytest.approx((0.0, 0.0, 3.0))  # 2/4 of 8 s, 1 : 3
    assert float(ring_hidden(x, 3.0, 4, 8.0, True, 0.25)) == pytest.approx(1.0)  # min(e = 1, 1) at the last
    (alone,) = program_gemm_steps([(x, 4, 1.0, 8.0)])
    assert alone == pytest.approx((2.0, 2.0, 2.0)) and sum(alone) <= 8.0
    assert runs((0.0, 0.0, 2.0, 2.0)) == [(2, 0.0), (2, 2.0)]
    one_d = coll("all_gather", "tp", "compute", lambda z: 0, "attn.in", tpo="qkv.f")  # the default schedule
    for ab, n, gemm in ((3.0, 4, 1.0), (3.0, 4, 5.0), (3.0, 2, 5.0), (7.0, 8, 2.0)):
        assert float(ring_hidden(one_d, ab, n, gemm, False)) == pytest.approx(float(hidden(ab, n, gemm)))
    assert chunks(4, True) == (0.25,) * 3


ENGINES = [  # q = 4 and 2; kept weights over several micro-batches (paired and unpaired forwards); pipelines;
    # full recomputation (the recomputed forward's rings)
    "dp=4,tp=2d:4x4,mb=4", "dp=2,tp=2.5d:4x4x2,mb=4,rc=full", "dp=1,tp=3d:4x4x4,mb=8,kw=1", "dp=2,pp=2,tp=2d:4x4,mb=4",
    "dp=16,tp=2d:2x2,mb=1,kw=1", "dp=8,tp=2.5d:2x2x2,mb=2", "dp=8,tp=3d:2x2x2,mb=1,kw=1", "dp=4,pp=2,tp=3d:2x2x2,mb=2",
]
WEIGHT_AXIS = {"2d": "row", "2.5d": "row", "3d": "x"}  # the weight rings' axis (3D: W = x for all four linears)


@pytest.mark.parametrize("text", ENGINES)
def test_engines_agree_on_every_ring(text: str) -> None:
    """GPU preset (dgx-h100), gpt3-1.3b bf16: the same bytes and events with tpo on and off, tpo faster (at
    q = 2 too: 2D's forward hides nothing there, its backward rings and all of 3D's do), the event engine within
    2% of the analytic model, and the weight rings (A's gathers, dA's reduce-scatters) credited: the event
    engine's exposed time on the weight's axis drops with tpo."""
    topo, model = load_topology("dgx-h100", gpus=64), PRESETS["gpt3-1.3b"]
    lay = parse_layout(text)
    train = TrainingSpec(global_batch=64, dtype="bf16", recompute=lay.recompute or "none")
    lay = lay.with_(recompute=None)
    off = estimate(model, train, lay, topo, with_events=True)
    on = estimate(model, train, lay.with_(tpo=True), topo, with_events=True)
    assert on.events == off.events and on.comm_bytes_per_gpu == off.comm_bytes_per_gpu
    assert on.step_time_s < off.step_time_s and on.compute_time_s == off.compute_time_s
    ev_on = estimate_event(model, train, lay.with_(tpo=True), topo, with_events=False)
    ev_off = estimate_event(model, train, lay, topo, with_events=False)
    assert ev_on.step_time_s == pytest.approx(on.step_time_s, rel=0.02)
    assert ev_on.comm_bytes_per_gpu == on.comm_bytes_per_gpu and ev_on.step_time_s < ev_off.step_time_s
    axis = WEIGHT_AXIS[lay.mode]
    assert MODES[lay.mode].axes and ev_on.comm_time_by_axis[axis] < ev_off.comm_time_by_axis[axis]
