"""A parallel layout: data parallel x pipeline parallel x one tensor mode; `Layout`, its fields, sizes and axes.

Its placement on ranks (rank grid, mesh axes, `place=`) is rank_grid.py's; its text form, layout_parse.py's; the
valid values of its fields and their checks, layout_checks.py's. What the fields mean, named by their text form:
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
`off=N` (activation offloading, pp = 1): the saved activations of the model's first N blocks go to host memory in
forward and come back in backward (Megatron-core --cpu-offloading-num-layers N; paracube's executor:
torch.autograd.graph.save_on_cpu); N in [0, layers] (the runtime may allow less: runtimes/offload.py; priced by
cost_models/offload.py). Unpinned (None) the planner chooses (planner/offload_passes.py); `off=0` pins none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from paracube.errors import ParacubeError, check
from paracube.layout_checks import check_fields
from paracube.modes import MODES, TensorMode
from paracube.rank_grid import RankGrid
from paracube.recompute_modules import modules_text

ModeName = str  # a key of paracube.modes.MODES
TENSOR_AXES: dict[str, tuple[str, ...]] = {name: m.axes for name, m in MODES.items()}


@dataclass(frozen=True)
class Layout(RankGrid):
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
    # `rcm=a+b`: selective recomputation of exactly these modules (recompute_modules.py; rc=selective implied);
    # None: the runtime's rule for rc=selective
    recompute_modules: tuple[str, ...] | None = None
    # `overlap`: the data-parallel gradient reduction runs during the last micro-batch's backward (DDP
    # buckets, Megatron's overlap_grad_reduce); the analytic model then exposes only what backward does not hide.
    overlap: bool = False
    # `overlap=0` / `tpo=0`: pins that forbid the overlap the runtime would otherwise choose (as sp=0 does for sp).
    forbid_overlap: bool = False
    forbid_tpo: bool = False
    forbid_zero: bool = False  # `zero=0`: pins no sharding (zero=0 is also the default, which the search may change)
    forbid_interleave: bool = False  # `v=1`: pins plain 1F1B (v=1 is also the default, which the search may change)
    keep_weights: int | None = None  # `kw=0|1` (module docstring); None: not pinned
    # `fa=0|1` pins the attention kernel (1 flash, 0 unfused); None: not pinned (the executor runs flash,
    # the planner searches both).
    flash: int | None = None
    offload: int | None = None  # `off=N`: the first N blocks' activations offloaded to the host (None: not pinned)
    # A search's pins (`plan --layout ep=64`), not a whole layout: dp = 1 means "not pinned", so the experts' fold
    # over dp x cp x tp is left to the search (layout_checks._check_experts); never in a layout's text or equality.
    pin: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.placement:
            # Axes of size 1 may be left out: they go outermost.
            missing = tuple(a for a in self.default_placement if a not in self.placement and self.axis_size(a) == 1)
            object.__setattr__(self, "placement", tuple(self.placement) + missing)
            check(sorted(self.placement) == sorted(self.axis_names),
                  f"place={'.'.join(self.placement)} must list each of the axes "
                  f"{', '.join(self.default_placement)} once")

    # --- sizes -----------------------------------------------------------------------------------------
    @property
    def expert_data(self) -> int:
        """Ranks of the expert-data-parallel group (edp = dp cp tp / (ep etp)): they reduce expert gradients."""
        return self.dp * self.cp * self.tensor_size // (self.ep * self.etp)

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
        if self.interleave > 1 or self.forbid_interleave:
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
        if self.recompute_modules is not None:
            parts.append(f"rcm={modules_text(self.recompute_modules)}")
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
        if self.offload is not None:
            parts.append(f"off={self.offload}")
        if self.placement and self.placement != self.default_placement:
            # cp=1 is left out of the text (layouts written before cp existed round-trip unchanged); a placement
            # that only moves size-1 axes is the default one (the same rank grid) and is not printed
            shown = tuple(a for a in self.placement if a != "cp" or self.cp > 1)
            trivial = tuple(a for a in self.default_placement if a != "cp" or self.cp > 1)
            if [a for a in shown if self.axis_size(a) > 1] != [a for a in trivial if self.axis_size(a) > 1]:
                parts.append("place=" + ".".join(shown))
        return ",".join(parts)

    @property
    def fold_open(self) -> bool:
        """Search pins without dp (`pin`): the ranks the experts fold over (dp x cp x tp) are the search's to set."""
        return self.pin and self.dp == 1

    def with_(self, **changes: object) -> Layout:
        return replace(self, **changes)  # type: ignore[arg-type]
