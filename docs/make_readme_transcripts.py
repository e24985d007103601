"""Regenerate every command transcript of README.md, or check that the README's still hold.

README.md marks each transcript block:

    <!-- transcript: NAME -->
    ```
    $ paracube ...
    (output)
    ```
    <!-- /transcript -->

and TRANSCRIPTS below holds each block's commands. The commands run in order, as a new user would type them,
in one fresh directory (with `examples/` linked in), through bash with `paracube` = this tree's
`python -m paracube`, stdout and stderr together, and PARACUBE_NO_CPU_PROBE=1 (the local-cpu preset's fixed
figures: the same transcript on every machine).

    python docs/make_readme_transcripts.py --write           # every block, pictures copied to docs/img/
    python docs/make_readme_transcripts.py --write --only compare
    python docs/make_readme_transcripts.py --check           # model blocks against README.md (what CI runs)

Kinds: "model" blocks print what the cost model and planner compute: deterministic, so --check compares them
(tests/test_readme_transcripts.py): words and integers (layout counts, ranks, steps, bytes) exactly, decimals
within one unit of their last printed digit (a rounding flip on another CPU), search wall times not at all.
"run" blocks train on local ranks (`paracube run`, `calibrate`, `validate`): their timings are this machine's,
and --check does not run them (minutes on 2 cores); --write regenerates them, --skip-runs leaves them as they
are. A command that exits non-zero where `expect` does not say so stops --write.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- transcript: (?P<name>[\w.-]+) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```\n<!-- /transcript -->",
                   re.S)
TINY_LLAMA = """mkdir tiny-llama && cat > tiny-llama/config.json <<'EOF'
{
  "model_type": "llama",
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 2,
  "num_attention_heads": 8,
  "num_key_value_heads": 2,
  "vocab_size": 256,
  "max_position_embeddings": 64
}
EOF"""


@dataclass(frozen=True)
class Transcript:
    name: str
    commands: tuple[str, ...]
    kind: str = "model"  # "model" (checked) or "run" (trains on local ranks: regenerated, not checked)
    pictures: dict[str, str] = field(default_factory=dict)  # file written in the run dir -> path in the repo
    expect: tuple[int, ...] = ()  # exit status per command (default 0)


TRANSCRIPTS: tuple[Transcript, ...] = (
    Transcript("run-default", ("paracube run",), kind="run"),
    Transcript("plan-local", ("paracube plan --gpus 8 --top 3",)),
    Transcript("plan-13b", ("paracube plan --model gpt3-13b --cluster dgx-h100 --gpus 64 --top 3 --tokens 300B "
                            "--price-per-gpu-hour 2.5 -o gpt3-13b.json",)),
    Transcript("compare", ("paracube compare --model gpt3-2.7b --cluster longhorn --gpus 64 --dtype fp16 "
                           "--recompute selective --plot compare.png",),
               pictures={"compare.png": "docs/img/compare_gpt3-2.7b_longhorn64.png"}),
    Transcript("simulate", ("paracube simulate --model gpt3-2.7b --cluster dgx-a100 --gpus 16 --global-batch 64 "
                            "--layout dp=2,tp=3d:2x2x2,mb=4 --engine event --timeline step.png --trace step.json",
                            "paracube simulate gpt3-13b.json --events | tail -4",
                            "paracube simulate gpt3-13b.json --json --events | head -5"),
               pictures={"step.png": "docs/img/timeline_gpt3-2.7b_dgx-a100_16.png"}),
    Transcript("sweep", ("paracube sweep --model gpt3-1.3b --cluster dgx-a100,dgx-h100 --gpus 8,16,32,64 "
                         "--tokens 300B --price-per-gpu-hour 1.8 2.5 --plot sweep.png",),
               pictures={"sweep.png": "docs/img/sweep_gpt3-1.3b.png"}),
    Transcript("topologies", ("paracube topologies --gpus 256",
                              "paracube topologies examples/pcie-2x8-100gbe.yaml")),
    Transcript("calibrate-validate", ("paracube calibrate --out cal.yaml",
                                      "paracube plan --cluster cal.yaml --layout dp=2,tp=1d:4,mb=4 -o p1d.json",
                                      "paracube validate p1d.json --cluster cal.yaml --steps 6"), kind="run"),
    Transcript("tiny-llama-plan", (TINY_LLAMA, "paracube plan --model tiny-llama/config.json --cluster local-cpu "
                                   "--gpus 8 --layout dp=2,tp=2d:2x2 --top 3 -o p.json")),
    Transcript("tiny-llama-run", ("paracube run p.json --steps 10",), kind="run"),
    Transcript("tied", ("mkdir tied && sed 's/\"vocab_size\": 256,/\"vocab_size\": 256, \"tie_word_embeddings\": "
                        "true,/' tiny-llama/config.json > tied/config.json",
                        "paracube plan --model tied/config.json --cluster local-cpu --gpus 8 --layout "
                        "dp=2,tp=2d:2x2 -o tied.json")),
    Transcript("export-plan", ("paracube plan --model gpt3-13b --cluster dgx-a100 --gpus 64 --layout "
                               "dp=4,pp=4,tp=1d:4,sp,zero=1,overlap --recompute selective --top 3 -o plan13b.json",)),
    Transcript("export", ("paracube export plan13b.json --to megatron -o megatron.sh",
                          "sed -n '1,5p;/^torchrun/,/--num-layers [0-9]/p' megatron.sh",
                          "paracube export plan13b.json --to deepspeed -o deepspeed.sh",
                          "paracube plan --model gpt3-13b --cluster dgx-a100 --gpus 64 --layout dp=16,tp=2d:2x2 "
                          "-o p2d.json > /dev/null",
                          "paracube export p2d.json --to megatron"), expect=(0, 0, 2, 0, 2)),
    Transcript("cal-plan-validate", ("paracube calibrate --quick --nproc 4 --out cal4.yaml",
                                     "paracube plan --cluster cal4.yaml --gpus 4 -o tiny.json",
                                     "paracube validate tiny.json --steps 3"), kind="run"),
)
BY_NAME = {t.name: t for t in TRANSCRIPTS}


# --- running -----------------------------------------------------------------------------------------------
def fresh_dir() -> Path:
    run_dir = Path(tempfile.mkdtemp(prefix="paracube-readme-"))
    (run_dir / "examples").symlink_to(ROOT / "examples")
    return run_dir


def run_command(command: str, cwd: Path) -> tuple[int, str, float]:
    """(exit status, stdout + stderr, wall seconds) of one README command, as a user's shell runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARACUBE_NO_CPU_PROBE": "1", "COLUMNS": "160",
           "PARACUBE_CACHE_DIR": str(cwd / ".cache")}
    prelude = f'paracube() {{ "{sys.executable}" -m paracube "$@"; }}\nset -o pipefail\n'
    t0 = time.perf_counter()
    # One stream, as a terminal shows them: the CLI writes notes to stderr and results to stdout.
    proc = subprocess.run(["bash", "-c", prelude + command], cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    return proc.returncode, proc.stdout, time.perf_counter() - t0


def render(t: Transcript, cwd: Path, log: list[str]) -> str:
    lines: list[str] = []
    for i, command in enumerate(t.commands):
        code, out, wall = run_command(command, cwd)
        want = t.expect[i] if i < len(t.expect) else 0
        log.append(f"{t.name}: exit {code} in {wall:.1f} s: {command.splitlines()[0][:100]}")
        if code != want and not (code == 141 and "| head" in command):
            raise SystemExit(f"{t.name}: `{command}` exited {code} (expected {want}):\n{out}")
        lines.append("$ " + command)
        lines.extend(x.rstrip() for x in out.rstrip("\n").splitlines())
    return "\n".join(lines) + "\n"


# --- comparing ---------------------------------------------------------------------------------------------
WALL = [re.compile(p) for p in (r"layouts in [0-9.]+ s(, [0-9,]+ layouts/s enumerated)?",  # search wall times
                                 r"\([0-9]+ s\)")]  # calibrate wall times
TOKEN = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[^\s\d│┃┏┓┗┛┡┩└┘┌┐├┤┬┴┼━─╇╈┳┻]+", re.I)


def _tokens(text: str) -> list[str]:
    for pattern in WALL:
        text = pattern.sub("<wall>", text)
    return TOKEN.findall(text)


def _same_number(want: str, got: str) -> bool:
    """Integers exactly; decimals within one unit of the last digit printed (rounding on another CPU)."""
    w, g = want.replace(",", ""), got.replace(",", "")
    if not re.fullmatch(r"[-+]?\d+(\.\d+)?", w) or not re.fullmatch(r"[-+]?\d+(\.\d+)?", g):
        return w == g
    if "." not in w:
        return w == g
    # one unit of the last digit, or 1e-9 relative for long floats (JSON: summation order may differ by CPU)
    unit = max(10.0 ** -len(w.split(".")[1]), abs(float(w)) * 1e-9)
    return abs(float(w) - float(g)) <= unit * 1.0001


def differences(want: str, got: str) -> list[str]:
    """What differs between a README block and a fresh run, token by token (empty: the block holds)."""
    a, b = _tokens(want), _tokens(got)
    out: list[str] = []
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == y or _same_number(x, y):
            continue
        context = " ".join(a[max(0, i - 6):i + 3])
        out.append(f"README {x!r}, now {y!r} (near: {context})")
        if len(out) >= 10:
            break
    if len(a) != len(b) and not out:
        out.append(f"README has {len(a)} tokens, the run {len(b)}: lines added or removed "
                   f"(README ends {' '.join(a[-5:])!r}, run ends {' '.join(b[-5:])!r})")
    return out


def blocks(text: str) -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def write_block(text: str, name: str, body: str) -> str:
    def replace(m: re.Match[str]) -> str:
        if m["name"] != name:
            return m.group(0)
        return f"<!-- transcript: {name} -->\n```{m['lang']}\n{body}```\n<!-- /transcript -->"

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="run the commands and rewrite README.md's blocks")
    mode.add_argument("--check", action="store_true", help="run the model blocks and report drift (exit 1)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", choices=list(BY_NAME))
    p.add_argument("--skip-runs", action="store_true", help="--write: leave the run blocks as they are")
    args = p.parse_args(argv)
    text = README.read_text()
    present = blocks(text)
    missing = [t.name for t in TRANSCRIPTS if t.name not in present]
    if missing:
        raise SystemExit(f"README.md has no block for {missing}: add `<!-- transcript: NAME -->` markers")
    cwd, log, drift = fresh_dir(), [], []
    last = max(i for i, t in enumerate(TRANSCRIPTS) if args.only is None or t.name in args.only)
    try:
        for t in TRANSCRIPTS[:last + 1]:  # in order: later blocks use files earlier ones wrote
            wanted = args.only is None or t.name in args.only
            if t.kind == "run" and (args.check or args.skip_runs or not wanted):
                continue
            body = render(t, cwd, log)
            if args.check and wanted:
                drift += [f"{t.name}: {d}" for d in differences(present[t.name], body)]
            elif args.write and wanted:
                text = write_block(text, t.name, body)
                for made, dest in t.pictures.items():
                    shutil.copyfile(cwd / made, ROOT / dest)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    print("\n".join(log))
    if args.write:
        README.write_text(text)
        print("wrote README.md")
    for line in drift:
        print(line)
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
