"""A parallel layout: data parallel x pipeline parallel x one tensor mode, and its placement on ranks.

The rank grid is one `arange(world).reshape(...)`; every process group is a slice of it. Mesh axes:

| mode | tensor axes (outer -> inner) | sizes | activations [T, h]: tokens split over | hidden split over |
|------|------------------------------|-------|----------------------------------------|-------------------|
| none | -                            | -     | -                                      | -                 |
| 1d   | tp                           | p     | - (replicated)                         | - (replicated)    |
| 2d   | row, col                     | q, q  | row                                    | col               |
| 2.5d | dep, row, col                | d,q,q | dep (major), row                       | col               |
| 3d   | z, y, x                      | q,q,q | x (major), y                           | z                 |

An axis is named after the coordinate that varies along it: the group of axis `col` is the q ranks of one
grid row. `placement` lists every axis from innermost (consecutive ranks, i.e. the same node) to outermost;
the default keeps the tensor axes innermost, then dp, then pp (Megatron's order).
Syntax: `dp=2,pp=4[,cp=2[,cpc=p2p|ag]][,ep=4][,etp=2],tp=3d:4x4x4[,mb=2][,v=2][,sp|sp=0][,zero=1][,rc=full]
[,kw=0|1][,fa=0|1][,place=x.y.z.dp.pp]`.
`fa`: attention kernel; 1 flash attention (fused, saves no s x s scores; the executor's default), 0 Megatron's
unfused core attention (scores, masked softmax, dropout and the product with V, which saves s x s tensors).
`sp=0` forbids sequence parallelism and `rc=` pins activation recomputation: pins the planner respects
(it searches what a layout leaves open). `overlap`: data-parallel gradient reduction overlapped with backward.
`zero`: 0 none; 1 optimizer state and fp32 master weights sharded over dp (distributed optimizer / ZeRO-1,
Rajbhandari et al. 2020); 2 gradients sharded too (reduce-scattered into the rank's shard during backward);
3 parameters fully sharded over dp (ZeRO-3 / FSDP: gathered per block before use, resharded after).
`shard=N` (zero >= 1, N divides dp): hybrid sharding (HSDP, ZeRO++'s hpZ): shard within groups of N consecutive
dp ranks and replicate across the dp / N groups (gradients all-reduced across them); unset, shard over all of dp.
HSDP splits the `dp` axis of the rank grid into (dp_replicate, dp_shard) = (dp / N, N), dp = dp_replicate x N +
dp_shard (torchtitan's data_parallel_replicate / shard degrees): the groups of `dp_shard` are N consecutive dp
coordinates, those of `dp_replicate` the ranks with equal dp_shard; `zero_axes` / `replica_axes` name them.
`tpo`: tensor-parallel collectives overlapped with the GEMMs that produce or consume them (collective matmul:
Megatron's --tp-comm-overlap, torchtitan's async TP; Wang et al. 2023); the same bytes, only the exposed part priced.
`a2ao`: the MoE all_to_alls (dispatch / combine) of one micro-batch overlapped with the compute of another
(Megatron-core's --overlap-moe-expert-parallel-comm: the combined 1F1B schedule; needs ep > 1, pp = 1 or v > 1, no
full recomputation: cost_models/moe_a2a_overlap.py); `a2ao=0` forbids it.
`cp=N` (none, 1d): context parallelism, a mesh axis between dp and the tensor axes (Megatron-core's order
tp-cp-dp-pp, innermost first): each sequence split into 2N chunks, cp rank i holding chunks i and 2N-1-i (causal
load balance); attention exchanges keys and values over cp by `cpc=p2p` (ring, overlapped with attention; Megatron's
cp_comm_type p2p) or `cpc=ag` (all-gather); parameters are replicated over cp, so their gradients reduce, and zero
shards, over dp x cp (`data_axes`; Megatron's data-parallel group with context parallelism). 2D/2.5D/3D split
tokens themselves and refuse cp. Unpinned `cpc` (None): the planner chooses, the executor runs p2p.
`ep=N`, `etp=N` (none, 1d; models with MoE blocks): expert parallelism, folded as Megatron-core's MoE Parallel
Folding (Liu et al. 2025, arXiv 2504.14960): the dp x cp x tp ranks of one pipeline stage, in rank order, are
regrouped as (edp, ep, etp), etp innermost: each expert's linears split etp ways (tensor parallelism inside an
expert), the experts split ep ways (each rank holds experts / ep of them), and the expert-data-parallel group of
edp = dp cp tp / (ep etp) ranks reduces the experts' gradients (dense parameters still reduce over data_axes).
ep x etp must divide dp x cp x tp; tokens reach their experts by all-to-all over ep (cost_models/moe.py).
`kw` (2d, 2.5d, 3d): 1 keeps the gathered weights of the linears (and the position table) across the
micro-batches of a step, gathered once per step, their gradients accumulated in gathered form and
reduce-scattered once per step (FSDP's reshard_after_forward=False); 0 re-gathers them every micro-batch.
Unpinned (None) the planner chooses; the executor and the estimate of an unpinned layout use 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from paracube.errors import ParacubeError, check, divisors, divisors_text
from paracube.modes import MODES, TensorMode

ModeName = str  # a key of paracube.modes.MODES
TENSOR_MODES: tuple[str, ...] = tuple(MODES)
TENSOR_AXES: dict[str, tuple[str, ...]] = {name: m.axes for name, m in MODES.items()}
SHAPE_RULES = {name: m.shape_rule for name, m in MODES.items()}
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")
CP_COMMS: tuple[str, ...] = ("p2p", "ag")  # context parallelism's key/value exchange: ring p2p, all-gather
# Mode variants named by a flag after their base mode's tp= (e.g. `tp=2d:8x8,summa`): TensorMode.variant_flag.
VARIANTS: dict[str, TensorMode] = {m.variant_flag: m for m in MODES.values() if m.variant_flag}


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    pp: int = 1
    mode: ModeName = "none"
    shape: tuple[int, ...] = ()
    placement: tuple[str, ...] = field(default=())  # innermost first; () means the default order
    micro_batch: int | None = None  # sequences per micro-batch per data-parallel replica
    interleave: int = 1  # virtual pipeline chunks per stage (interleaved 1F1B)
    cp: int = 1  # context parallelism: ranks a sequence is split over (module docstring)
    cp_comm: str | None = None  # CP_COMMS; None: not pinned
    ep: int = 1  # expert parallelism: ways the routed experts are split (module docstring: folding)
    etp: int = 1  # tensor parallelism inside an expert
    sequence_parallel: bool = False  # 1D only (Korthikanti et al. 2022)
    zero: int = 0  # ZERO_STAGES: 0 none, 1 optimizer state sharded over dp, 2 gradients too, 3 parameters too
    shard: int | None = None  # HSDP: zero's shard group (divides dp); None: all of dp
    tpo: bool = False  # tensor-parallel collectives overlapped with their GEMMs (collective matmul)
    a2ao: bool = False  # MoE all_to_alls overlapped with another micro-batch's compute (module docstring)
    forbid_a2ao: bool = False  # `a2ao=0`
    # Pins for the search (the planner fills in what is not pinned): `sp=0` forbids sequence parallelism,
    # `rc=none|selective|full` fixes activation recomputation (None: TrainingSpec.recompute, or searched).
    forbid_sp: bool = False
    recompute: str | None = None
    # `overlap`: the data-parallel gradient reduction runs during the last micro-batch's backward (DDP
    # buckets, Megatron's overlap_grad_reduce); the analytic model then exposes only what backward does not hide.
    overlap: bool = False
    # `overlap=0` / `tpo=0`: pins that forbid the overlap the runtime would otherwise choose (as sp=0 does for sp).
    forbid_overlap: bool = False
    forbid_tpo: bool = False
    forbid_zero: bool = False  # `zero=0`: pins no sharding (zero=0 is also the default, which the search may change)
    keep_weights: int | None = None  # `kw=0|1` (module docstring); None: not pinned
    # `fa=0|1` pins the attention kernel (1 flash, 0 unfused); None: not pinned (the executor runs flash,
    # the planner searches both).
    flash: int | None = None

    def __post_init__(self) -> None:
        check(self.mode in TENSOR_MODES, f"tensor mode {self.mode!r} is not valid; valid: {', '.join(TENSOR_MODES)}")
        for name, value in (("dp", self.dp), ("pp", self.pp), ("cp", self.cp), ("interleave", self.interleave)):
            check(isinstance(value, int) and value >= 1, f"{name}={value!r} must be a positive integer")
        check(self.micro_batch is None or (isinstance(self.micro_batch, int) and self.micro_batch >= 1),
              f"mb={self.micro_batch!r} must be a positive integer")
        shape = self.shape
        shape_text = "x".join(map(str, shape)) or "()"
        check(MODES[self.mode].shape_ok(shape),
              f"tensor shape {shape_text} is not valid for {self.mode}: {SHAPE_RULES[self.mode]}")
        with_sp = [name for name, m in MODES.items() if m.sequence_parallel]
        check(not self.sequence_parallel or self.mode in with_sp,
              f"sequence parallelism (sp) applies to tp={'/'.join(with_sp)} only, not {self.mode}")
        check(self.zero in ZERO_STAGES, f"zero={self.zero!r} is not valid; valid: {', '.join(map(str, ZERO_STAGES))} "
              "(0 none, 1 optimizer state sharded over dp, 2 gradients too, 3 parameters too)")
        check(self.shard is None or (isinstance(self.shard, int) and self.shard >= 1),
              f"shard={self.shard!r} must be a positive integer")
        check(self.shard is None or self.zero >= 1,
              f"shard={self.shard} shards zero's state: it needs zero=1, 2 or 3 (zero={self.zero})")
        if self.shard is not None and self.dp % self.shard:
            raise ParacubeError(f"shard={self.shard} must divide dp={self.dp}; valid: {divisors_text(self.dp)}")
        check(not self.tpo or bool(MODES[self.mode].axes), "tpo overlaps tensor-parallel collectives: it needs "
              f"tp={'/'.join(n for n, m in MODES.items() if m.axes)}, not {self.mode}")
        check(self.cp == 1 or MODES[self.mode].context_parallel,
              f"cp={self.cp} (context parallelism) applies to "
              f"tp={'/'.join(n for n, m in MODES.items() if m.context_parallel)} only, not {self.mode}: "
              "its token split is already context parallel")
        check(self.cp_comm is None or self.cp_comm in CP_COMMS,
              f"cpc={self.cp_comm!r} is not valid; valid: {', '.join(CP_COMMS)} (ring p2p, all-gather)")
        check(self.cp_comm is None or self.cp > 1,
              f"cpc={self.cp_comm} sets context parallelism's exchange: it needs cp > 1")
        self._check_experts()
        check(not (self.forbid_sp and self.sequence_parallel), "sp and sp=0 together: give one")
        check(not (self.forbid_overlap and self.overlap), "overlap and overlap=0 together: give one")
        check(not (self.forbid_tpo and self.tpo), "tpo and tpo=0 together: give one")
        check(not (self.forbid_a2ao and self.a2ao), "a2ao and a2ao=0 together: give one")
        check(not (self.forbid_zero and self.zero), f"zero=0 and zero={self.zero} together: give one")
        check(self.recompute is None or self.recompute in RECOMPUTES,
              f"rc={self.recompute!r} is not valid; valid: {', '.join(RECOMPUTES)}")
        check(self.keep_weights in (None, 0, 1), f"kw={self.keep_weights!r} is not valid; valid: 0, 1")
        check(not self.keep_weights or MODES[self.mode].keeps_weights,
              f"kw=1 keeps gathered weights: tp={'/'.join(n for n, m in MODES.items() if m.keeps_weights)} only, "
              f"not {self.mode}")
        check(self.flash in (None, 0, 1), f"fa={self.flash!r} is not valid; valid: 0 (unfused), 1 (flash)")
        check(self.interleave == 1 or self.pp > 1, "interleave v > 1 needs pipeline parallelism (pp > 1)")
        if self.placement:
            # Axes of size 1 may be left out: they go outermost.
            missing = tuple(a for a in self.default_placement if a not in self.placement and self.axis_size(a) == 1)
            object.__setattr__(self, "placement", tuple(self.placement) + missing)
            check(sorted(self.placement) == sorted(self.axis_names),
                  f"place={'.'.join(self.placement)} must list each of the axes "
                  f"{', '.join(self.default_placement)} once")

    def _check_experts(self) -> None:
        for name, value in (("ep", self.ep), ("etp", self.etp)):
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                  f"{name}={value!r} must be a positive integer")
        if self.ep * self.etp == 1:
            return
        # Folding regroups whole-token ranks: the modes whose tensor group does not split tokens (none, 1d).
        folds = [n for n, m in MODES.items() if m.context_parallel]
        check(self.mode in folds, f"ep={self.ep},etp={self.etp} (expert parallelism) applies to tp={'/'.join(folds)} "
              f"only, not {self.mode}")
        dense = self.dp * self.cp * self.tensor_size
        if dense % (self.ep * self.etp):
            found = divisors(dense)
            valid = (", ".join(str(n) for n in found if dense % (n * self.etp) == 0) if found is not None
                     else f"a divisor of {dense // math.gcd(dense, self.etp)}")
            raise ParacubeError(f"ep={self.ep} x etp={self.etp} must divide the dp x cp x tp = {dense} ranks it folds "
                                f"over; valid ep: {valid}")

    # --- sizes -----------------------------------------------------------------------------------------
    @property
    def expert_data(self) -> int:
        """Ranks of the expert-data-parallel group (edp = dp cp tp / (ep etp)): they reduce expert gradients."""
        return self.dp * self.cp * self.tensor_size // (self.ep * self.etp)

    def expert_groups(self, axis: str) -> np.ndarray:
        """[n_groups, size] ranks of the folded expert axis `axis` (etp, ep, edp, or ep.etp: an expert shard's
        all-to-all peers with their etp ranks), every pipeline stage's dp x cp x tp ranks in rank order
        regrouped as (edp, ep, etp), etp innermost (module docstring)."""
        sizes = {"edp": self.expert_data, "ep": self.ep, "etp": self.etp}
        axes = tuple(axis.split("."))
        check(all(a in sizes for a in axes), f"expert axis {axis!r}; valid: edp, ep, etp, ep.etp")
        grid = self.rank_grid()  # (pp, dp, cp, *tensor)
        stages = np.sort(grid.reshape(self.pp, -1), axis=1).reshape(self.pp, self.expert_data, self.ep, self.etp)
        names = ("pp", "edp", "ep", "etp")
        src = [names.index(a) for a in axes]
        moved = np.moveaxis(stages, src, list(range(4 - len(axes), 4)))
        return moved.reshape(-1, math.prod(sizes[a] for a in axes))


    @property
    def uses_flash(self) -> bool:
        """The attention kernel this layout runs: flash unless `fa=0` pins the unfused one."""
        return self.flash != 0

    @property
    def shard_size(self) -> int:
        """Ranks zero shards over: `shard` where given (HSDP), else all of dp."""
        return self.shard if self.shard is not None else self.dp

    @property
    def q(self) -> int:
        """Grid side of 2D/2.5D/3D; p for 1D; 1 without tensor parallelism."""
        return self.shape[0] if self.shape else 1

    @property
    def tensor_mode(self) -> TensorMode:
        """The mode's declaration (paracube/modes)."""
        return MODES[self.mode]

    @property
    def depth(self) -> int:
        """2.5D depth; 1 for every other mode."""
        return MODES[self.mode].depth(self.shape)

    @property
    def tensor_size(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tensor_size

    @property
    def token_split(self) -> int:
        """Ways the tensor group splits the tokens of a micro-batch (along the batch dimension)."""
        return MODES[self.mode].token_split(self.q, self.depth)

    @property
    def tensor_axes(self) -> tuple[str, ...]:
        return TENSOR_AXES[self.mode]

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Canonical order, outermost first."""
        return ("pp", "dp", "cp", *self.tensor_axes)

    @property
    def hybrid(self) -> bool:
        """HSDP: zero shards over part of dp (`shard` < dp) and replicates across the groups."""
        return self.shard is not None and self.shard < self.dp

    @property
    def zero_axes(self) -> tuple[str, ...]:
        """The group zero shards over: the mode's grad_axes (dp; 2.5D: dp, dep), dp replaced by dp_shard with HSDP."""
        return tuple("dp_shard" if a == "dp" and self.hybrid else a for a in self.data_axes)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """The group parameter gradients reduce over: the mode's grad_axes, with cp after dp when cp > 1
        (cp ranks hold replicas of every parameter)."""
        grad = MODES[self.mode].grad_axes
        if self.cp == 1:
            return grad
        i = grad.index("dp") + 1
        return (*grad[:i], "cp", *grad[i:])

    @property
    def replica_axes(self) -> tuple[str, ...]:
        """HSDP: the group over which a shard's gradients are all-reduced (dp_replicate); () otherwise."""
        return ("dp_replicate",) if self.hybrid else ()

    def axis_size(self, axis: str) -> int:
        if axis in ("dp_shard", "dp_replicate"):
            return self.shard_size if axis == "dp_shard" else self.dp // self.shard_size
        sizes = {"pp": self.pp, "dp": self.dp, "cp": self.cp,
                 **MODES[self.mode].axis_sizes(self.q, self.tensor_size, self.depth)}
        if axis not in sizes:
            raise ParacubeError(f"axis {axis!r} is not part of layout {self}; axes: {', '.join(sizes)}")
        return sizes[axis]

    def axis_size_of(self, axes: tuple[str, ...]) -> int:
        """Ranks in the group of `axes`."""
        return math.prod(self.axis_size(a) for a in axes)

    @property
    def default_placement(self) -> tuple[str, ...]:
        return tuple(reversed(self.axis_names))

    @property
    def effective_placement(self) -> tuple[str, ...]:
        return self.placement or self.default_placement

    # --- rank grid ---------------------------------------------------------------------------------------
    def rank_grid(self) -> np.ndarray:
        """Ranks indexed by canonical coordinates (pp, dp, cp, *tensor axes)."""
        outer_first = tuple(reversed(self.effective_placement))
        grid = np.arange(self.world_size).reshape([self.axis_size(a) for a in outer_first])
        return grid.transpose([outer_first.index(a) for a in self.axis_names])

    def groups(self, axes: tuple[str, ...] | str) -> np.ndarray:
        """[n_groups, group_size]: every group of ranks that differ only along `axes` (first axis major)."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        grid, names = self.rank_grid(), self.axis_names
        if any(a in ("dp_shard", "dp_replicate") for a in axes):  # HSDP: dp split into (replicate, shard)
            i = names.index("dp")
            grid = grid.reshape(grid.shape[:i] + (self.axis_size("dp_replicate"), self.shard_size) + grid.shape[i + 1:])
            names = names[:i] + ("dp_replicate", "dp_shard") + names[i + 1:]
        src = [names.index(a) for a in axes]
        moved = np.moveaxis(grid, src, list(range(grid.ndim - len(axes), grid.ndim)))
        return moved.reshape(-1, math.prod(self.axis_size(a) for a in axes))

    def coords(self, rank: int) -> dict[str, int]:
        where = np.argwhere(self.rank_grid() == rank)
        check(len(where) == 1, f"rank {rank} is outside world size {self.world_size}")
        out = dict(zip(self.axis_names, (int(c) for c in where[0]), strict=True))
        out["dp_replicate"], out["dp_shard"] = divmod(out["dp"], self.shard_size)
        return out

    # --- text --------------------------------------------------------------------------------------------
    def __str__(self) -> str:
        parts = [f"dp={self.dp}"]
        if self.pp > 1:
            parts.append(f"pp={self.pp}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.cp_comm is not None:
            parts.append(f"cpc={self.cp_comm}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.etp > 1:
            parts.append(f"etp={self.etp}")
        m = MODES[self.mode]
        shape = "x".join(map(str, self.shape))
        parts.append("tp=none" if self.mode == "none" else f"tp={m.variant_of or self.mode}:{shape}")
        if m.variant_flag:
            parts.append(m.variant_flag)
        if self.micro_batch is not None:
            parts.append(f"mb={self.micro_batch}")
        if self.interleave > 1:
            parts.append(f"v={self.interleave}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.forbid_sp:
            parts.append("sp=0")
        if self.zero or self.forbid_zero:
            parts.append(f"zero={self.zero}")
        if self.shard is not None:
            parts.append(f"shard={self.shard}")
        if self.recompute is not None:
            parts.append(f"rc={self.recompute}")
        if self.overlap:
            parts.append("overlap")
        if self.forbid_overlap:
            parts.append("overlap=0")
        if self.tpo:
            parts.append("tpo")
        if self.forbid_tpo:
            parts.append("tpo=0")
        if self.a2ao:
            parts.append("a2ao")
        if self.forbid_a2ao:
            parts.append("a2ao=0")
        if self.keep_weights is not None:
            parts.append(f"kw={self.keep_weights}")
        if self.flash is not None:
            parts.append(f"fa={self.flash}")
        if self.placement and self.placement != self.default_placement:
            # cp=1 is left out of the text (layouts written before cp existed round-trip unchanged); a placement
            # that only moves size-1 axes is the default one (the same rank grid) and is not printed
            shown = tuple(a for a in self.placement if a != "cp" or self.cp > 1)
            trivial = tuple(a for a in self.default_placement if a != "cp" or self.cp > 1)
            if [a for a in shown if self.axis_size(a) > 1] != [a for a in trivial if self.axis_size(a) > 1]:
                parts.append("place=" + ".".join(shown))
        return ",".join(parts)

    def with_(self, **changes: object) -> Layout:
        return replace(self, **changes)  # type: ignore[arg-type]


LAYOUT_SYNTAX = ("dp=N,pp=N[,cp=N[,cpc=p2p|ag]][,ep=N][,etp=N],tp=MODE:SHAPE[,mb=N][,v=N][,sp|sp=0][,zero=0|1|2|3]"
                 "[,shard=N]"
                 "[,rc=none|selective|full]"
                 "[,overlap][,tpo][,a2ao]" + "".join(f"[,{f} (tp={m.variant_of})]" for f, m in VARIANTS.items()) +
                 "[,kw=0|1][,fa=0|1][,place=AXIS.AXIS...], e.g. dp=2,tp=3d:2x2x2")


def parse_layout(text: str) -> Layout:
    """Parse `dp=2,pp=4,tp=3d:4x4x4,mb=1,v=2,sp,zero=1,place=x.y.z.dp.pp`. Missing parts default to 1/none."""
    check(isinstance(text, str) and text.strip() != "", f"empty layout; expected {LAYOUT_SYNTAX}")
    fields: dict[str, object] = {}
    seen: set[str] = set()
    variant: TensorMode | None = None
    for raw in text.strip().split(","):
        part = raw.strip()
        key, _, value = part.partition("=")
        key = key.strip().lower()
        check(key not in seen, f"layout {text!r}: {key!r} given twice")
        seen.add(key)
        if key == "sp":
            check(value.strip() in ("", "0", "1"), f"layout {text!r}: sp={value!r}; valid: sp, sp=1, sp=0 (forbid)")
            fields["forbid_sp" if value.strip() == "0" else "sequence_parallel"] = True
        elif key == "overlap":
            check(value.strip() in ("", "0", "1"), f"layout {text!r}: overlap={value!r}; valid: overlap, overlap=0|1")
            fields["forbid_overlap" if value.strip() == "0" else "overlap"] = True
        elif key == "tpo":
            check(value.strip() in ("", "0", "1"), f"layout {text!r}: tpo={value!r}; valid: tpo, tpo=0|1")
            fields["forbid_tpo" if value.strip() == "0" else "tpo"] = True
        elif key == "a2ao":
            check(value.strip() in ("", "0", "1"), f"layout {text!r}: a2ao={value!r}; valid: a2ao, a2ao=0|1")
            fields["forbid_a2ao" if value.strip() == "0" else "a2ao"] = True
        elif key == "kw":
            check(value.strip() in ("0", "1"), f"layout {text!r}: kw={value!r} is not valid; valid: kw=0, kw=1")
            fields["keep_weights"] = int(value)
        elif key == "fa":
            check(value.strip() in ("0", "1"), f"layout {text!r}: fa={value!r} is not valid; valid: fa=0 (unfused "
                  "attention), fa=1 (flash attention)")
            fields["flash"] = int(value)
        elif key == "rc":
            check(value.strip() in RECOMPUTES,
                  f"layout {text!r}: rc={value!r} is not valid; valid: {', '.join(RECOMPUTES)}")
            fields["recompute"] = value.strip()
        elif key in ("dp", "pp", "cp", "ep", "etp", "mb", "v", "shard"):
            check(value.strip().isdigit() and int(value) >= 1,
                  f"layout {text!r}: {key}={value!r} must be a positive integer")
            fields[{"mb": "micro_batch", "v": "interleave"}.get(key, key)] = int(value)
        elif key == "cpc":
            check(value.strip() in CP_COMMS, f"layout {text!r}: cpc={value!r} is not valid; valid: "
                  f"{', '.join(CP_COMMS)} (ring p2p, all-gather)")
            fields["cp_comm"] = value.strip()
        elif key == "zero":
            check(value.strip().isdigit() and int(value) in ZERO_STAGES,
                  f"layout {text!r}: zero={value!r} is not valid; valid: {', '.join(map(str, ZERO_STAGES))}")
            if int(value):
                fields["zero"] = int(value)
            else:
                fields["forbid_zero"] = True  # an explicit zero=0: a pin (the default 0 is searched)
        elif key == "tp":
            mode, _, shape = value.strip().lower().partition(":")
            check(mode in TENSOR_MODES, f"layout {text!r}: tensor mode {mode!r} is not valid; "
                  f"valid: {', '.join(TENSOR_MODES)} (e.g. tp=1d:8, tp=2d:4x4, tp=2.5d:4x4x2, tp=3d:4x4x4)")
            dims = shape.split("x") if shape else []
            check(all(d.strip().isdigit() and int(d) >= 1 for d in dims),
                  f"layout {text!r}: tensor shape {shape!r} must be positive integers joined by 'x' "
                  f"({SHAPE_RULES[mode]})")
            fields["mode"] = mode
            fields["shape"] = tuple(int(d) for d in dims)
        elif key == "place":
            fields["placement"] = tuple(a.strip() for a in value.split(".") if a.strip())
        elif key in VARIANTS:
            check(value.strip() in ("", "1"), f"layout {text!r}: {key}={value!r}; valid: {key}")
            variant = VARIANTS[key]
        else:
            raise ParacubeError(f"layout {text!r}: unknown part {part!r}; expected {LAYOUT_SYNTAX}")
    if variant is not None:
        check(fields.get("mode") == variant.variant_of, f"layout {text!r}: {variant.variant_flag} is a variant of "
              f"tp={variant.variant_of}, not of tp={fields.get('mode', 'none')}")
        fields["mode"] = variant.name
    return Layout(**fields)  # type: ignore[arg-type]
