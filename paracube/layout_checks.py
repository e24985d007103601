"""What a valid layout is: the values each field of a Layout may take, and the checks Layout runs on construction.

The valid values are declared once here (tensor modes and their variants from paracube/modes; zero stages,
recomputation and context parallelism's exchange) and read by parsing (layout_parse.py) and the search. What
each field means is layout.py's docstring. A check that fails raises one line (errors.check) naming the bad value
and what is valid; `check_fields` checks in field order and stops at the first failure.
"""

from __future__ import annotations

import math
from typing import Any

from paracube.errors import ParacubeError, check, divisors, divisors_text
from paracube.modes import MODES, TensorMode
from paracube.recompute_modules import MODULES, parse_modules

TENSOR_MODES: tuple[str, ...] = tuple(MODES)
SHAPE_RULES = {name: m.shape_rule for name, m in MODES.items()}
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")
CP_COMMS: tuple[str, ...] = ("p2p", "ag")  # context parallelism's key/value exchange: ring p2p, all-gather
# Mode variants named by a flag after their base mode's tp= (e.g. `tp=2d:8x8,summa`): TensorMode.variant_flag.
VARIANTS: dict[str, TensorMode] = {m.variant_flag: m for m in MODES.values() if m.variant_flag}

Layout = Any  # layout.Layout (not imported: it imports this module)


def check_fields(layout: Layout) -> None:
    """Every field of `layout` but `placement` (Layout.__post_init__ completes and checks that one)."""
    check(layout.mode in TENSOR_MODES, f"tensor mode {layout.mode!r} is not valid; valid: {', '.join(TENSOR_MODES)}")
    for name, value in (("dp", layout.dp), ("pp", layout.pp), ("cp", layout.cp), ("interleave", layout.interleave)):
        check(isinstance(value, int) and value >= 1, f"{name}={value!r} must be a positive integer")
    check(layout.micro_batch is None or (isinstance(layout.micro_batch, int) and layout.micro_batch >= 1),
          f"mb={layout.micro_batch!r} must be a positive integer")
    shape = layout.shape
    shape_text = "x".join(map(str, shape)) or "()"
    check(MODES[layout.mode].shape_ok(shape),
          f"tensor shape {shape_text} is not valid for {layout.mode}: {SHAPE_RULES[layout.mode]}")
    with_sp = [name for name, m in MODES.items() if m.sequence_parallel]
    check(not layout.sequence_parallel or layout.mode in with_sp,
          f"sequence parallelism (sp) applies to tp={'/'.join(with_sp)} only, not {layout.mode}")
    check(layout.zero in ZERO_STAGES, f"zero={layout.zero!r} is not valid; valid: {', '.join(map(str, ZERO_STAGES))} "
          "(0 none, 1 optimizer state sharded over dp, 2 gradients too, 3 parameters too)")
    check(layout.shard is None or (isinstance(layout.shard, int) and layout.shard >= 1),
          f"shard={layout.shard!r} must be a positive integer")
    check(layout.shard is None or layout.zero >= 1,
          f"shard={layout.shard} shards zero's state: it needs zero=1, 2 or 3 (zero={layout.zero})")
    if layout.shard is not None and layout.dp % layout.shard:
        raise ParacubeError(f"shard={layout.shard} must divide dp={layout.dp}; valid: {divisors_text(layout.dp)}")
    check(not layout.tpo or bool(MODES[layout.mode].axes), "tpo overlaps tensor-parallel collectives: it needs "
          f"tp={'/'.join(n for n, m in MODES.items() if m.axes)}, not {layout.mode}")
    check(layout.cp == 1 or MODES[layout.mode].context_parallel,
          f"cp={layout.cp} (context parallelism) applies to "
          f"tp={'/'.join(n for n, m in MODES.items() if m.context_parallel)} only, not {layout.mode}: "
          "its token split is already context parallel")
    check(layout.cp_comm is None or layout.cp_comm in CP_COMMS,
          f"cpc={layout.cp_comm!r} is not valid; valid: {', '.join(CP_COMMS)} (ring p2p, all-gather)")
    check(layout.cp_comm is None or layout.cp > 1,
          f"cpc={layout.cp_comm} sets context parallelism's exchange: it needs cp > 1")
    _check_experts(layout)
    check(not (layout.forbid_sp and layout.sequence_parallel), "sp and sp=0 together: give one")
    check(not (layout.forbid_overlap and layout.overlap), "overlap and overlap=0 together: give one")
    check(not (layout.forbid_tpo and layout.tpo), "tpo and tpo=0 together: give one")
    check(not (layout.forbid_a2ao and layout.a2ao), "a2ao and a2ao=0 together: give one")
    check(not (layout.forbid_zero and layout.zero), f"zero=0 and zero={layout.zero} together: give one")
    check(not (layout.forbid_interleave and layout.interleave > 1),
          f"v=1 and v={layout.interleave} together: give one")
    check(layout.recompute is None or layout.recompute in RECOMPUTES,
          f"rc={layout.recompute!r} is not valid; valid: {', '.join(RECOMPUTES)}")
    check(layout.recompute_modules is None or layout.recompute in (None, "selective"),
          f"rcm= recomputes modules under rc=selective, not rc={layout.recompute}; valid: drop rc= or rc=selective")
    check(layout.recompute_modules is None or (
        isinstance(layout.recompute_modules, tuple) and len(layout.recompute_modules) > 0
        and parse_modules("+".join(map(str, layout.recompute_modules))) == layout.recompute_modules),
          f"rcm={layout.recompute_modules!r} is not valid; valid: modules of {', '.join(MODULES)} in that order")
    check(layout.keep_weights in (None, 0, 1), f"kw={layout.keep_weights!r} is not valid; valid: 0, 1")
    check(not layout.keep_weights or MODES[layout.mode].keeps_weights,
          f"kw=1 keeps gathered weights: tp={'/'.join(n for n, m in MODES.items() if m.keeps_weights)} only, "
          f"not {layout.mode}")
    check(layout.flash in (None, 0, 1), f"fa={layout.flash!r} is not valid; valid: 0 (unfused), 1 (flash)")
    check(layout.offload is None or (isinstance(layout.offload, int) and not isinstance(layout.offload, bool)
                                     and layout.offload >= 0),
          f"off={layout.offload!r} is not valid; valid: off=N, N in [0, layers] (blocks offloaded to the host)")
    check(layout.interleave == 1 or layout.pp > 1, "interleave v > 1 needs pipeline parallelism (pp > 1)")


def _check_experts(layout: Layout) -> None:
    for name, value in (("ep", layout.ep), ("etp", layout.etp)):
        check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
              f"{name}={value!r} must be a positive integer")
    if layout.ep * layout.etp == 1:
        return
    # Folding regroups whole-token ranks: the modes whose tensor group does not split tokens (none, 1d).
    folds = [n for n, m in MODES.items() if m.context_parallel]
    check(layout.mode in folds, f"ep={layout.ep},etp={layout.etp} (expert parallelism) applies to tp={'/'.join(folds)} "
          f"only, not {layout.mode}")
    if layout.fold_open:  # dp not pinned: the search folds the experts over the dp it sets
        return
    dense = layout.dp * layout.cp * layout.tensor_size
    check(dense % layout.etp == 0, f"etp={layout.etp} must divide the dp x cp x tp = {dense} ranks experts fold "
          f"over; valid etp: {divisors_text(dense)}")
    if dense % (layout.ep * layout.etp):
        found = divisors(dense)
        valid = (", ".join(str(n) for n in found if dense % (n * layout.etp) == 0) if found is not None
                 else f"a divisor of {dense // math.gcd(dense, layout.etp)}")
        raise ParacubeError(f"ep={layout.ep} x etp={layout.etp} must divide the dp x cp x tp = {dense} ranks it folds "
                            f"over; valid ep: {valid}")
