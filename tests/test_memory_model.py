"""Memory per device: exact parameter counts per rank, Korthikanti et al. (2022) activations, pipelines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paracube.cost_models.analytic import estimate
from paracube.cost_models.block_acts import megatron_block_bytes as _block_acts
from paracube.cost_models.comm import stage_layers_params
from paracube.cost_models.dims import dims_of, padded_vocab
from paracube.cost_models.local_parameters import local_parameter_count
from paracube.cost_models.memory import in_flight, stage_memory
from paracube.cost_models.uniform_topology import DeviceSpec, UniformTopology
from paracube.cost_models.validity import layout_arrays
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

TINY = PRESETS["tiny"]
ONE = np.array([1])


def topo(gpus: int) -> UniformTopology:
    dev = DeviceSpec("fake", {"fp32": 1e13, "fp16": 1e14, "bf16": 1e14}, 1e12, 1e12)
    return UniformTopology(dev, gpus, 8, 100e9, 2e-6, 10e9, 10e-6)


def _params(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    d = dims_of(model, TrainingSpec())
    closed = int(stage_layers_params(d, layout.mode, layout_arrays(layout, 1), ONE, ONE)[0])
    return closed, local_parameter_count(layout, d)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.integers(1, 3), st.integers(1, 3), st.sampled_from(["gpt", "llama"]))
def test_3d_and_2d_parameters_per_rank_exact(q: int, k: int, layers: int, family: str) -> None:
    """docs/algorithms.md: 2d and 3d store every parameter exactly once: per rank total/q^2, total/q^3
    (2.5d: once per q x q grid, total/q^2)."""
    h = q**3 * k * q  # divisible by q^3 and by heads = q
    m = ModelSpec(
        "m",
        layers=layers,
        hidden=h,
        heads=q,
        ffn_hidden=4 * h,
        vocab=128 * q * q,  # a multiple of Megatron's padding unit (128 x the vocab split): no padding
        seq_len=q * q * 3,
        family=family,
    )
    total = m.num_parameters()
    assert _params(m, Layout(mode="3d", shape=(q, q, q))) == (total // q**3, total // q**3)
    assert total % q**3 == 0
    assert _params(m, Layout(mode="2d", shape=(q, q))) == (total // q**2, total // q**2)
    # 2.5d: the 2d grid's shards, replicated over depth
    assert _params(m, Layout(mode="2.5d", shape=(q, q, 2))) == (total // q**2, total // q**2)


def test_1d_parameters_by_hand() -> None:
    """tiny, p=2: per block norms 4h = 256 and row biases 2h = 128 are replicated, the other
    49984 - 384 = 49600 split -> 24800 + 384 = 25184; tok_emb 256*64/2 = 8192, pos_emb 64*64 = 4096
    replicated, ln_f 128, head 8192 -> 20608. Total 2 * 25184 + 20608 = 70976."""
    assert _params(TINY, Layout(mode="1d", shape=(2,))) == (70976, 70976)


def test_static_memory_is_16_bytes_per_local_parameter() -> None:
    est = estimate(
        TINY, TrainingSpec(global_batch=8), parse_layout("tp=3d:2x2x2,mb=4"), topo(8), with_events=False
    )
    n = replace(TINY, vocab=padded_vocab(TINY.vocab, 4)).num_parameters() // 8  # vocab padded as Megatron pads
    assert (est.memory.parameters, est.memory.gradients, est.memory.optimizer) == (4 * n, 4 * n, 8 * n)


def test_static_memory_in_bf16_is_18_bytes_per_local_parameter() -> None:
    """bf16 parameters (2) + fp32 gradient buckets (4) + fp32 masters and Adam moments (12), as Megatron;
    zero=1 over dp=2 shards the 12 (tests/test_grad_sync.py measures the executor holding exactly this)."""
    training = TrainingSpec(global_batch=8, dtype="bf16")
    est = estimate(TINY, training, parse_layout("tp=3d:2x2x2,mb=4"), topo(8), with_events=False)
    lay = parse_layout("tp=3d:2x2x2,mb=4")  # the vocabulary padded as Megatron pads it (128 x the split q^2)
    vocab = int(padded_vocab(TINY.vocab, lay.tensor_mode.vocab_split(lay.tensor_size, lay.q)))
    n = replace(TINY, vocab=vocab).num_parameters() // 8
    assert (est.memory.parameters, est.memory.gradients, est.memory.optimizer) == (2 * n, 4 * n, 12 * n)
    zero1 = estimate(TINY, training, parse_layout("dp=2,tp=1d:4,zero=1,mb=4"), topo(8), with_events=False).memory
    plain = estimate(TINY, training, parse_layout("dp=2,tp=1d:4,mb=4"), topo(8), with_events=False).memory
    n1 = plain.gradients / 4
    assert (zero1.parameters, zero1.gradients, zero1.optimizer) == (2 * n1, 4 * n1, 12 * np.ceil(n1 / 2))


GPT175 = PRESETS["gpt3-175b"]  # s = 2048, h = 12288, a = 96, f = 4h


@pytest.mark.parametrize("t", [1, 2, 8])
def test_1d_activations_match_korthikanti(t: int) -> None:
    """Korthikanti et al. 2022, bytes per layer with 16-bit activations (bf16 -> no scaling), b = 1:
    no TP sbh(34 + 5as/h); TP sbh(10 + 24/t + 5as/(ht)); TP+SP sbh/t(34 + 5as/h); selective+SP 34 sbh/t;
    selective without SP sbh(10 + 24/t); full recompute 2 sbh (2 sbh/t with SP)."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h

    def acts(recompute: str, sp: bool) -> float:
        # Korthikanti et al. count the unfused core attention's s x s tensors (fa=0; flash saves none)
        d = replace(dims_of(GPT175, TrainingSpec(global_batch=1, dtype="bf16", recompute=recompute)), flash=False)
        lay = Layout(mode="1d", shape=(t,), sequence_parallel=sp) if t > 1 else Layout()
        return float(_block_acts(d, lay.mode, layout_arrays(lay, b), recompute)[0])

    assert acts("none", False) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert acts("selective", False) == pytest.approx(sbh * (10 + 24 / t))
    assert acts("full", False) == pytest.approx(2 * sbh)
    if t > 1:
        assert acts("none", True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
        assert acts("selective", True) == pytest.approx(34 * sbh / t)
        assert acts("full", True) == pytest.approx(2 * sbh / t)
    else:
        assert acts("none", False) == pytest.approx(sbh * (34 + 5 * a * s / h))


def test_fp32_doubles_activations_and_3d_splits_them() -> None:
    """fp32 scales the 16-bit formula by 4/2; 3d q=2 splits the no-TP memory 8 ways and adds the gathered
    inputs c (T/q) sum(h_in)/q (1 - 1/q) and weights c sum(h_in h_out)/q^2 the linears keep for backward."""
    d16 = dims_of(TINY, TrainingSpec(dtype="bf16"))
    d32 = dims_of(TINY, TrainingSpec(dtype="fp32"))
    none = Layout()
    a = layout_arrays(none, 4)
    assert _block_acts(d32, "none", a, "none")[0] == pytest.approx(2 * _block_acts(d16, "none", a, "none")[0])
    cube = Layout(mode="3d", shape=(2, 2, 2))
    T = 4 * 64
    gathered = 4 * (T / 2 * (64 + 64 + 64 + 256) / 2 * 0.5 + 49152 / 4)
    got = _block_acts(d32, "3d", layout_arrays(cube, 4), "none")[0]
    assert got == pytest.approx(_block_acts(d32, "none", a, "none")[0] / 8 + gathered)


def test_pipeline_in_flight() -> None:
    """1F1B: the first stage holds min(pp, N) micro-batches; interleaved v: pp + (pp-1)/v
    (Narayanan et al.); the last stage 1 (1F1B). Megatron's activation accounting (Korthikanti)."""
    a = layout_arrays(Layout(pp=4, interleave=2), 1)
    assert in_flight(a, np.array([16.0]), True)[0] == pytest.approx(4 * (1 + 3 / 8))
    a1 = layout_arrays(Layout(pp=4), 1)
    assert in_flight(a1, np.array([16.0]), True)[0] == 4
    assert in_flight(a1, np.array([2.0]), True)[0] == 2
    assert in_flight(a1, np.array([16.0]), False)[0] == 1
    # tiny, fp32, full recompute, mb=1: a block keeps 2 sbh * (4/2) = 2*64*64*2 = 16384 B, the embedding
    # output 4 T h = 16384 B. pp=1: 2 blocks + embedding = 49152. pp=2 (N = 8): the first stage keeps
    # min(2, 8) = 2 micro-batches of 1 block + embedding = 65536; the last stage 1 block of 1 micro-batch.
    d = dims_of(TINY, TrainingSpec(global_batch=8, recompute="full", activations="megatron"))
    one = stage_memory(d, "none", layout_arrays(Layout(), 1), True, True)["activations"][0]
    a2 = layout_arrays(Layout(pp=2), 1)
    assert (
        one,
        stage_memory(d, "none", a2, True, False)["activations"][0],
        stage_memory(d, "none", a2, False, True)["activations"][0],
    ) == (49152, 65536, 16384)


@pytest.mark.parametrize("mode,layout", [("none", Layout(pp=2)), ("1d", parse_layout("dp=1,pp=2,tp=1d:2"))])
def test_only_the_head_stage_holds_the_heads_temporaries(mode: str, layout: Layout) -> None:
    """The head's output (and its gathered operands) lives on the stage that runs the head: a pipeline's first stage
    holds the same temporaries whatever the vocabulary; the last stage's grow with it. Reference: the same model with
    a vocabulary of 64, whose head output is smaller than the blocks' largest linear."""
    def temps(vocab: int, first: bool) -> float:
        d = dims_of(replace(TINY, vocab=vocab), TrainingSpec(global_batch=8))
        return float(stage_memory(d, mode, layout_arrays(layout, 1), first, not first)["temporaries"][0])

    assert temps(64 * 1024, True) == temps(64, True)
    assert temps(64 * 1024, False) > temps(64, False)


@pytest.mark.parametrize("pp,v", [(2, 2), (2, 24), (4, 2), (8, 4), (9, 7), (4, 1)])
def test_in_flight_equals_the_schedules_alive_chunks(pp: int, v: int) -> None:
    """Reference: walk modes.stages.schedule (the executor's and Megatron-core's order) on the first and the last
    stage and count the chunk forwards alive at once (forward seen, backward not yet), in micro-batches of the
    stage (v chunks each); candidate: memory.in_flight and moe_step.in_flight. Exact counts (rationals)."""
    from paracube.cost_models.moe_step import in_flight as moe_in_flight
    from paracube.modes.stages import schedule

    n = 4 * pp
    a = layout_arrays(Layout(pp=pp, interleave=v), 1)
    for stage in range(pp):  # every stage by its index; the first and the last by their flags too
        alive = peak = 0
        for op, _, _ in schedule(pp, v, n, stage):
            alive += 1 if op == "F" else -1
            peak = max(peak, alive)
        assert in_flight(a, np.array([float(n)]), stage == 0, stage)[0] == pytest.approx(peak / v)
        if stage in (0, pp - 1):
            assert in_flight(a, np.array([float(n)]), stage == 0)[0] == pytest.approx(peak / v)
        assert moe_in_flight(Layout(pp=pp, interleave=v), n, stage) == pytest.approx(peak / v)


@pytest.mark.parametrize("v", [1, 2])
def test_the_middle_stage_is_counted_where_an_uneven_split_makes_it_the_heaviest(v: int) -> None:
    """30 blocks over pp = 8 (x v): the first and the last stage hold one block less (modes/stages.py), stage 1 the
    full count with one micro-batch fewer in flight than the first. Full recomputation keeps a block's input only, so
    the activations are blocks x in flight x that input (+ the embedding output on the first stage): stage 1 holds
    4 x 7 (1F1B) block inputs against the first's 3 x 8, and is the heaviest stage; the estimate's memory is its
    total (it took the first's before)."""
    model = replace(TINY, layers=30, hidden=256, heads=4, ffn_hidden=1024, vocab=64)
    train = TrainingSpec(global_batch=64, recompute="full", activations="megatron")
    d = dims_of(model, train)
    lay = Layout(pp=8, interleave=v, micro_batch=1)
    a = layout_arrays(lay, 1)
    first, middle, last = (stage_memory(d, "none", a, f, h) for f, h in ((True, False), (False, False), (False, True)))
    block = 2 * d.s * d.h * 4  # one fp32 block input (sbh, mb = 1): full recomputation keeps nothing else
    n = np.array([64.0])
    assert middle["activations"][0] == pytest.approx(4 * in_flight(a, n, False, 1)[0] * block / 2)
    assert first["activations"][0] - 3 * in_flight(a, n, True)[0] * block / 2 >= 0  # + the embedding's output
    totals = [sum(float(x[0]) for x in m.values()) for m in (first, middle, last)]
    assert totals[1] == max(totals)
    est = estimate(model, train, lay, topo(8))
    assert est.memory.total == pytest.approx(totals[1])
