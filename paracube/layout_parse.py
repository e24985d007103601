"""A layout from its text: `parse_layout` of `dp=2,pp=4,tp=3d:4x4x4,...`; `str(layout)` is its inverse (layout.py).

Syntax: `dp=2,pp=4[,cp=2[,cpc=p2p|ag]][,ep=4][,etp=2],tp=3d:4x4x4[,mb=2][,v=2][,sp|sp=0][,zero=1][,rc=full]
[,rcm=layernorm+moe_act][,kw=0|1][,fa=0|1][,off=N]
[,place=x.y.z.dp.pp]`.
What each part means is layout.py's docstring; the values it may take, layout_checks.py's. A part that is not valid
raises one line naming the layout, the part and what is valid.
"""

from __future__ import annotations

from paracube.errors import ParacubeError, check
from paracube.layout import Layout
from paracube.layout_checks import CP_COMMS, RECOMPUTES, SHAPE_RULES, TENSOR_MODES, VARIANTS, ZERO_STAGES
from paracube.modes import TensorMode
from paracube.recompute_modules import parse_modules

LAYOUT_SYNTAX = ("dp=N,pp=N[,cp=N[,cpc=p2p|ag]][,ep=N][,etp=N],tp=MODE:SHAPE[,mb=N][,v=N][,sp|sp=0][,zero=0|1|2|3]"
                 "[,shard=N]"
                 "[,rc=none|selective|full][,rcm=MODULE+MODULE]"
                 "[,overlap][,tpo][,a2ao]" + "".join(f"[,{f} (tp={m.variant_of})]" for f, m in VARIANTS.items()) +
                 "[,kw=0|1][,fa=0|1][,off=N][,place=AXIS.AXIS...], e.g. dp=2,tp=3d:2x2x2")


def parse_layout(text: str, pin: bool = False) -> Layout:
    """Parse `dp=2,pp=4,tp=3d:4x4x4,mb=1,v=2,sp,zero=1,place=x.y.z.dp.pp`. Missing parts default to 1/none. `pin`:
    the text pins a search (Layout.pin: without dp, the experts' fold is the search's to check)."""
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
        elif key in ("overlap", "tpo", "a2ao"):  # flags whose `=0` pins them off: field forbid_<key>
            check(value.strip() in ("", "0", "1"), f"layout {text!r}: {key}={value!r}; valid: {key}, {key}=0|1")
            fields[f"forbid_{key}" if value.strip() == "0" else key] = True
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
        elif key == "rcm":
            fields["recompute_modules"] = parse_modules(value, f"layout {text!r}: rcm")
        elif key in ("dp", "pp", "cp", "ep", "etp", "mb", "v", "shard"):
            check(value.strip().isdigit() and int(value) >= 1,
                  f"layout {text!r}: {key}={value!r} must be a positive integer")
            fields[{"mb": "micro_batch", "v": "interleave"}.get(key, key)] = int(value)
            if key == "v" and int(value) == 1:
                fields["forbid_interleave"] = True  # an explicit v=1: a pin (the default 1 is searched)
        elif key == "off":
            check(value.strip().isdigit(), f"layout {text!r}: off={value!r} is not valid; valid: off=N, N in [0, "
                  "layers] (the blocks whose activations are offloaded to the host)")
            fields["offload"] = int(value)
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
    return Layout(**fields, pin=pin)  # type: ignore[arg-type]
