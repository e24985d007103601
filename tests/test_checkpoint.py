"""Sharded checkpoints: resume identity, cross-layout resharding, export, bad and partial checkpoints.

One 8-rank gloo job runs every distributed phase in sequence (one process start instead of four):
  A  3D 2x2x2, steps 1..4, saves step_2 and step_4                     (the uninterrupted reference)
  B  3D 2x2x2, resumes A's step_2 (next to a killed save's .tmp dirs)  -> losses 3..4 bit-identical to A
  C  dp=2 x 1D tp=4, resumes A's step_2 (3D -> 1D), step 3             -> loss equals A's (fp32 tolerance)
  D  3D 2x2x2, resumes C's step_3 (1D -> 3D), step 4                   -> loss and parameters equal A's
  E  2.5D 2x2x2, resumes A's step_2 (3D -> 2.5D), step 3               -> loss equals A's
  F  3D 2x2x2, resumes E's step_3 (2.5D -> 3D), step 4                 -> loss and parameters equal A's
  R  A's step_2 loaded into 2.5D and saved (R1), into 3D and saved (R2), into 2.5D again (R3) -> identical
  G  bf16 3D 2x2x2, steps 1..3, saves step_2 with the fp32 master weights next to the moments
  H  bf16 3D 2x2x2, resumes G's step_2                                 -> loss 3 bit-identical to G's
  I  bf16 dp=2 x 1D tp=4 with zero=1, resumes G's step_2 (3D -> 1D)    -> loss 3 equals G's (bf16 tolerance)
  Z  dp=4 x 1D tp=2 + sp with zero=3 (FSDP units), resumes A's step_2, step 3, saves it
  Z0 dp=8 with zero=0 (no tensor mode), resumes Z's step_3, step 4     -> loss and parameters equal A's
  Z1 3D 2x2x2, resumes Z's step_3, step 4                               -> loss and parameters equal A's
(C is 1D tensor parallelism over 4 ranks, twice: dp=2 has replicas, which save nothing and load their own copy.)
The reference values are A's own losses: every layout computes the serial model's math (docs/algorithms.md).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from dist_helpers import run_distributed

from paracube.errors import ParacubeError
from paracube.executor.checkpoint import store as ckpt
from paracube.executor.checkpoint.files import file_manifest, manifest_digest
from paracube.executor.checkpoint.planners import BlockLoadPlanner, BlockSavePlanner
from paracube.executor.checkpoint.store import export_full_state_dict, find_checkpoint, read_meta
from paracube.executor.layers.shards import ShardSpec
from paracube.executor.model.gpt import serial_reference
from paracube.executor.training.data import parse_source, replica_micro_batches
from paracube.plan import default_plan

CUBE = "dp=1,tp=3d:2x2x2,mb=4"
ONE_D = "dp=2,tp=1d:4,mb=4"
HALF = "dp=1,tp=2.5d:2x2x2,mb=4"
ZERO3 = "dp=4,tp=1d:2,mb=2,sp,zero=3"
PLAIN = "dp=8,mb=1"
DATA = "synthetic"



def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _copy_checkpoint(src: Path, dst_root: Path) -> None:
    """dst_root/ holding one complete checkpoint copied from src, `latest` pointing at it."""
    dst_root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst_root / src.name)
    (dst_root / "latest").write_text(src.name + "\n")


def _worker(rank: int, world: int, root: str) -> None:
    import torch.distributed as dist

    from paracube.executor.training.loop import TrainConfig, train

    r = Path(root)
    # Same schedule (4 steps) in every phase, so interrupted runs follow the same learning rates.
    cfg = TrainConfig(data=DATA, schedule_steps=4, warmup_steps=2)

    def phase(layout: str, steps: int, name: str, save_every: int, resume: bool) -> None:
        train(default_plan(layout), rank, world, steps, metrics_path=r / f"{name}.jsonl",
              checkpoint_dir=r / name, save_every=save_every, resume=resume, config=cfg)

    phase(CUBE, 4, "A", 2, False)
    if rank == 0:
        _copy_checkpoint(r / "A" / "step_2", r / "B")
        (r / "B" / "step_4.tmp").mkdir()  # a save killed before its rename: garbage, never read
        (r / "B" / "step_4.tmp" / ".metadata").write_bytes(b"\x00garbage")
        (r / "B" / "step_9.tmp").mkdir()
        _copy_checkpoint(r / "A" / "step_2", r / "C")
    dist.barrier()
    phase(CUBE, 4, "B", 2, True)
    phase(ONE_D, 3, "C", 1, True)
    if rank == 0:
        _copy_checkpoint(r / "C" / "step_3", r / "D")
    dist.barrier()
    phase(CUBE, 4, "D", 1, True)
    if rank == 0:
        _copy_checkpoint(r / "A" / "step_2", r / "E")
    dist.barrier()
    phase(HALF, 3, "E", 1, True)
    if rank == 0:
        _copy_checkpoint(r / "E" / "step_3", r / "F")
    dist.barrier()
    phase(CUBE, 4, "F", 1, True)
    if rank == 0:
        _copy_checkpoint(r / "A" / "step_2", r / "Z")
    dist.barrier()
    phase(ZERO3, 3, "Z", 1, True)
    if rank == 0:
        _copy_checkpoint(r / "Z" / "step_3", r / "Z0")
        _copy_checkpoint(r / "Z" / "step_3", r / "Z1")
    dist.barrier()
    phase(PLAIN, 4, "Z0", 1, True)
    phase(CUBE, 4, "Z1", 1, True)
    _round_trip(rank, r)

    def bf16(layout: str, steps: int, name: str, save_every: int, resume: bool) -> None:
        plan = default_plan(layout)
        plan = replace(plan, training=replace(plan.training, dtype="bf16"))
        train(plan, rank, world, steps, metrics_path=r / f"{name}.jsonl", checkpoint_dir=r / name,
              save_every=save_every, resume=resume, config=cfg)

    bf16(CUBE, 3, "G", 2, False)
    if rank == 0:
        _copy_checkpoint(r / "G" / "step_2", r / "H")
        _copy_checkpoint(r / "G" / "step_2", r / "I")
    dist.barrier()
    bf16(CUBE, 3, "H", 1, True)
    bf16(ONE_D + ",zero=1", 3, "I", 1, True)


def _round_trip(rank: int, r: Path) -> None:
    """A's step_2 through 2.5D (R1), 3D (R2) and 2.5D again (R3): each loads the previous save and saves."""
    from paracube.executor.mesh import Mesh
    from paracube.executor.model.gpt import build_model

    src = r / "A" / "step_2"
    for layout, name in ((HALF, "R1"), (CUBE, "R2"), (HALF, "R3")):
        plan = default_plan(layout)
        model = build_model(plan.model, Mesh(plan.layout, rank), seed=1)  # not A's seed: the load must set all
        opt = torch.optim.AdamW(model.parameters())
        meta = ckpt.load_checkpoint(src, model, opt)
        src = ckpt.save_checkpoint(r / name, meta["step"], model, opt, {"layout": layout})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    run_distributed(_worker, 8, str(root))
    return root


@pytest.mark.slow
def test_resume_is_bit_identical(runs: Path) -> None:
    a, b = _losses(runs / "A.jsonl"), _losses(runs / "B.jsonl")
    assert sorted(b) == [3, 4]
    assert [b[k] for k in (3, 4)] == [a[k] for k in (3, 4)]  # exact float equality
    full_a, full_b = export_full_state_dict(runs / "A"), export_full_state_dict(runs / "B")
    assert all(torch.equal(full_a[k], full_b[k]) for k in full_a)
    # The killed save's directory was replaced by the real one; the other stays ignored.
    assert find_checkpoint(runs / "B").name == "step_4" and not (runs / "B" / "step_4.tmp").exists()


@pytest.mark.slow
def test_bf16_checkpoint_holds_fp32_masters_and_resumes(runs: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    step2 = find_checkpoint(runs / "G" / "step_2")
    md = FileSystemReader(str(step2)).read_metadata().state_dict_metadata
    masters = {k: v.properties.dtype for k, v in md.items() if k.endswith(".master")}
    params = {k: v.properties.dtype for k, v in md.items() if k.startswith("model.")}
    assert read_meta(step2)["has_masters"] and len(masters) == len(params) > 0
    assert set(masters.values()) == {torch.float32} and set(params.values()) == {torch.bfloat16}
    g, h, i = _losses(runs / "G.jsonl"), _losses(runs / "H.jsonl"), _losses(runs / "I.jsonl")
    assert sorted(h) == [3] and sorted(i) == [3]
    assert h[3] == g[3]  # bit-identical: the fp32 masters and moments came back exactly
    assert i[3] == pytest.approx(g[3], rel=1e-2)  # resharded to 1D + zero=1: bf16 rounding in another order


@pytest.mark.slow
def test_reshard_3d_to_1d_and_back(runs: Path) -> None:
    a, c, d = _losses(runs / "A.jsonl"), _losses(runs / "C.jsonl"), _losses(runs / "D.jsonl")
    assert sorted(c) == [3] and sorted(d) == [4]
    for step, loss in {**c, **d}.items():
        assert loss == pytest.approx(a[step], rel=1e-5, abs=1e-6)
    assert read_meta(find_checkpoint(runs / "C"))["layout"] == ONE_D
    full_a, full_d = export_full_state_dict(runs / "A"), export_full_state_dict(runs / "D")
    assert set(full_a) == set(full_d)
    for name in full_a:
        torch.testing.assert_close(full_d[name], full_a[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_reshard_3d_to_2_5d_and_back(runs: Path) -> None:
    a, e, f = _losses(runs / "A.jsonl"), _losses(runs / "E.jsonl"), _losses(runs / "F.jsonl")
    assert sorted(e) == [3] and sorted(f) == [4]
    for step, loss in {**e, **f}.items():
        assert loss == pytest.approx(a[step], rel=1e-5, abs=1e-6)
    assert read_meta(find_checkpoint(runs / "E"))["layout"] == HALF
    full_a, full_f = export_full_state_dict(runs / "A"), export_full_state_dict(runs / "F")
    for name in full_a:
        torch.testing.assert_close(full_f[name], full_a[name], rtol=1e-4, atol=1e-5)
    # Saved by 2.5D, loaded into 3D, saved, loaded into 2.5D: every parameter bit-identical to A's.
    ref = export_full_state_dict(runs / "A" / "step_2")
    for name in ("R1", "R2", "R3"):
        got = export_full_state_dict(runs / name)
        assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref), name


@pytest.mark.slow
def test_zero3_checkpoint_loads_at_zero0_and_in_another_mode(runs: Path) -> None:
    """3D -> 1D + sp at zero=3 (parameters held as FSDP unit shards) -> none at zero=0, and -> 3D: each step's
    loss and the final parameters equal A's (the same math in every layout; fp32 sums in another order)."""
    a, z, z0, z1 = (_losses(runs / f"{n}.jsonl") for n in ("A", "Z", "Z0", "Z1"))
    assert sorted(z) == [3] and sorted(z0) == [4] and sorted(z1) == [4]
    for step, loss in {**z, **z0}.items():
        assert loss == pytest.approx(a[step], rel=1e-5, abs=1e-6)
    assert z1[4] == pytest.approx(a[4], rel=1e-5, abs=1e-6)
    assert read_meta(find_checkpoint(runs / "Z"))["layout"] == ZERO3
    full_a = export_full_state_dict(runs / "A")
    for name in ("Z0", "Z1"):
        full = export_full_state_dict(runs / name)
        assert set(full) == set(full_a)
        for key in full_a:
            torch.testing.assert_close(full[key], full_a[key], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_export_loads_into_serial_model(runs: Path) -> None:
    """A's step_2 exported, in the serial model, gives A's logged loss of step 3 (params after 2 updates)."""
    plan = default_plan(CUBE)
    full = export_full_state_dict(runs / "A" / "step_2")
    model = serial_reference(plan.model, seed=0)
    model.load_full_state_dict(full)
    source = parse_source(DATA, plan.model.vocab, plan.seq_len, seed=0)
    total, count = 0.0, 0.0
    with torch.no_grad():
        for ids, labels in replica_micro_batches(source, 3, plan.training.global_batch, 1, 0, 8):
            s, n = model(ids, labels)
            total, count = total + float(s), count + float(n)
    assert total / count == pytest.approx(_losses(runs / "A.jsonl")[3], rel=1e-5)


def test_missing_checkpoint_names_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ParacubeError, match="does not exist"):
        find_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ParacubeError, match="no checkpoint in"):
        find_checkpoint(tmp_path)


def test_partial_save_is_never_taken(tmp_path: Path) -> None:
    (tmp_path / "step_4.tmp").mkdir()
    (tmp_path / "step_4.tmp" / "paracube.json").write_text('{"format": 1, "step": 4}')
    (tmp_path / "step_4.tmp" / ".metadata").write_bytes(b"x")
    with pytest.raises(ParacubeError, match="no checkpoint in"):
        find_checkpoint(tmp_path)
    (tmp_path / "latest").write_text("step_4.tmp\n")
    with pytest.raises(ParacubeError, match="not a complete checkpoint"):
        find_checkpoint(tmp_path)


def test_corrupt_checkpoint_names_the_file_and_changes_nothing(tmp_path: Path) -> None:
    ck = tmp_path / "step_2"
    ck.mkdir()
    (ck / ".metadata").write_bytes(b"\x80\x04not a pickle")
    (ck / "paracube.json").write_text("{truncated")
    (tmp_path / "latest").write_text("step_2\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ParacubeError, match=r"paracube\.json.*corrupt"):
        export_full_state_dict(tmp_path)
    (ck / "paracube.json").write_text('{"format": 1, "step": 2}')
    with pytest.raises(ParacubeError, match="has no file manifest.*pickle"):  # DCP's pickle is never read
        export_full_state_dict(tmp_path)
    files = file_manifest(ck, [".metadata"])
    meta = {"format": 1, "step": 2, "files": files, "files_sha256": manifest_digest(files)}
    (ck / "paracube.json").write_text(json.dumps({**meta, "files_sha256": "0" * 64}))
    with pytest.raises(ParacubeError, match="does not match its checksum"):
        export_full_state_dict(tmp_path)
    (ck / "__0_0.distcp").write_bytes(b"dropped in")
    (ck / "paracube.json").write_text(json.dumps(meta))
    with pytest.raises(ParacubeError, match="'__0_0.distcp' is not in the manifest"):
        export_full_state_dict(tmp_path)
    (ck / "__0_0.distcp").unlink()
    with pytest.raises(ParacubeError, match=r"\.metadata.*corrupt"):  # listed and intact: DCP reads it
        export_full_state_dict(tmp_path)
    before[ck / "paracube.json"] = (ck / "paracube.json").read_bytes()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# --- one process: the planners and the save hook -----------------------------------------------------------------
@pytest.fixture
def one_rank(tmp_path: Path):
    """A 1-rank gloo process group (a file store: no port), destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _block(full_shape: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> ShardSpec:
    return ShardSpec(full_shape, offsets, sizes, replica_leader=True, replicated_axes=())


def test_every_block_of_a_grid_loads_from_a_full_save(one_rank: None, tmp_path: Path) -> None:
    """Resharding in one process: a tensor saved whole, read back as each block of a 2x3 grid (what a rank of
    a 2D layout asks for), equals that block of the tensor; a block saved at an offset reads back as itself."""
    import torch.distributed.checkpoint as dcp

    full = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)
    whole = _block((4, 6), (0, 0), (4, 6))
    dcp.save({"w": full}, checkpoint_id=str(tmp_path / "whole"), planner=BlockSavePlanner({"w": whole}))
    for i in range(2):
        for j in range(3):
            spec = _block((4, 6), (2 * i, 2 * j), (2, 2))
            local = torch.full((2, 2), -1.0)
            dcp.load({"w": local}, checkpoint_id=str(tmp_path / "whole"), planner=BlockLoadPlanner({"w": spec}))
            assert torch.equal(local, spec.take(full))
    # One block of a larger tensor, saved by its only owner, reads back into the same block.
    spec = _block((8, 6), (4, 2), (4, 4))
    dcp.save({"w": full[:, :4].clone()}, checkpoint_id=str(tmp_path / "part"), planner=BlockSavePlanner({"w": spec}))
    back = torch.zeros(4, 4)
    dcp.load({"w": back}, checkpoint_id=str(tmp_path / "part"), planner=BlockLoadPlanner({"w": spec}))
    assert torch.equal(back, full[:, :4])


def test_a_block_of_the_wrong_shape_is_refused_before_anything_is_written(one_rank: None, tmp_path: Path) -> None:
    import dataclasses

    from paracube.executor.mesh import Mesh
    from paracube.executor.model.gpt import build_model

    plan = default_plan("dp=1,mb=4")
    model = build_model(plan.model, Mesh(plan.layout, 0), seed=0)
    spec = model.shard_specs["head.weight"]
    model.shard_specs["head.weight"] = dataclasses.replace(spec, sizes=(spec.sizes[0] // 2, spec.sizes[1]))
    with pytest.raises(ParacubeError, match=r"model\.head\.weight: local shard shape \(64, 256\) != ShardSpec "
                                            r"sizes \(32, 256\)"):
        ckpt.save_checkpoint(tmp_path / "ck", 1, model, None, {})
    assert not (tmp_path / "ck").exists()


def test_save_hook_runs_once_the_shard_is_written_before_the_checkpoint_exists(one_rank: None,
                                                                               tmp_path: Path) -> None:
    from paracube.executor.mesh import Mesh
    from paracube.executor.model.gpt import build_model

    plan = default_plan("dp=1,mb=4")
    model = build_model(plan.model, Mesh(plan.layout, 0), seed=0)
    seen: list[tuple] = []

    def hook(rank: int, step: int) -> None:
        tmp = tmp_path / "ck" / f"step_{step}.tmp"
        seen.append((rank, step, sorted(p.name for p in tmp.iterdir()), (tmp_path / "ck" / f"step_{step}").exists()))

    path = ckpt.save_checkpoint(tmp_path / "ck", 7, model, None, {"layout": str(plan.layout)}, after_shard_written=hook)
    assert seen == [(0, 7, ["__0_0.distcp"], False)]  # its data, neither DCP's metadata nor ours, not renamed
    assert ckpt.is_complete(path) and find_checkpoint(tmp_path / "ck") == path
    exported = export_full_state_dict(path)
    assert set(exported) == set(model.shard_specs)
    assert all(torch.equal(exported[n], p.detach()) for n, p in model.named_parameters())
