"""A quick probe of this machine's CPU figures for the `local-cpu` preset, cached as JSON.

What it measures (one process, one intra-op thread, as a local rank runs; `measure`, about half a second after
torch's import; each figure the median of 15 short rounds: the machine's typical speed, robust to the other
jobs sharing it now, which come and go while the cache stays):
- gemm_flops: single-thread fp32 GEMM rate (FLOP/s, 2mnk / seconds) at the tiny GPT's local shapes (m, n, k) =
  (64, 64, 64), (128, 64, 64), (128, 256, 64), (128, 64, 256) and at 256^3;
- op_s: seconds per dispatched op of a chain of small autograd ops on an [8, 8] tensor (forward mul and add,
  then their backward: a dispatch each, the data work negligible).
local_cpu.py turns them into the preset's DeviceSpec (its docstring has the formulas).

When: `cpu_figures()` reads the cache; when absent (or stale, or unreadable), the first call runs the probe
once, in a subprocess (`python -m paracube.topologies.cpu_probe`: planning commands never import torch in
their own process), and writes the cache. A failed probe leaves no cache and returns None (the preset's fixed
figures). `PARACUBE_NO_CPU_PROBE=1` disables both reading and probing (fixed figures: tests, CI, a
reproducible plan).

Where: `$PARACUBE_CACHE_DIR/local_cpu_probe.json`, else `$XDG_CACHE_HOME/paracube/...`, else
`~/.cache/paracube/...`. Keyed by what invalidates it: the probe's format version, the cores this process may
use, torch's version and the CPU's model name; a file whose key differs is re-probed and overwritten. Delete
the file to re-probe (a VM whose speed drifted, a machine that was busy when it probed).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ENV_CACHE_DIR = "PARACUBE_CACHE_DIR"
ENV_NO_PROBE = "PARACUBE_NO_CPU_PROBE"
CACHE_FILE = "local_cpu_probe.json"
VERSION = 2  # 2: medians of the rounds (1: the fastest round)
GEMM_SHAPES = ((64, 64, 64), (128, 64, 64), (128, 256, 64), (128, 64, 256), (256, 256, 256))
PROBE_TIMEOUT_S = 300.0  # a guard against a hung probe, not a speed bound: a few seconds quiet, over 60 s on a
# 2-core machine running two test suites and an 8-rank job beside it (seen in a fresh-clone run)


@dataclass(frozen=True)
class CpuFigures:
    """One core's figures as probed: GEMM FLOP/s per (m, n, k) shape and seconds per dispatched op."""

    gemm_flops: dict[str, float]  # "m,n,k" -> FLOP/s
    op_s: float
    probe_s: float = 0.0  # wall time of the measurement (torch's import excluded)

    def rates(self) -> list[tuple[tuple[int, int, int], float]]:
        """((m, n, k), FLOP/s) pairs."""
        out = []
        for key, rate in self.gemm_flops.items():
            m, n, k = (int(x) for x in key.split(","))
            out.append(((m, n, k), float(rate)))
        return out


def probing_disabled() -> bool:
    return os.environ.get(ENV_NO_PROBE, "").strip().lower() not in ("", "0", "false", "no")


def cache_path() -> Path:
    """Where the cache lives (module docstring)."""
    base = os.environ.get(ENV_CACHE_DIR)
    if base:
        return Path(base) / CACHE_FILE
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "paracube" / CACHE_FILE


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return ""


def cache_key(cores: int) -> dict[str, Any]:
    """What the figures depend on; a cache with another key is stale."""
    return {"version": VERSION, "cores": int(cores), "torch": _torch_version(), "cpu": _cpu_model()}


def _figures(data: Any) -> CpuFigures | None:
    """The figures of a parsed cache / probe output, or None when anything is missing or not positive."""
    try:
        gemm = {str(k): float(v) for k, v in data["gemm_flops"].items()}
        figs = CpuFigures(gemm, float(data["op_s"]), float(data.get("probe_s", 0.0)))
        figs.rates()  # the keys parse as m,n,k
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    values = [figs.op_s, *gemm.values()]
    if not gemm or not all(v > 0 and v < float("inf") for v in values):
        return None
    return figs


def read_cache(path: Path, key: dict[str, Any]) -> CpuFigures | None:
    """The cached figures when the file parses and its key equals `key`; else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return _figures(data.get("figures"))


def write_cache(path: Path, key: dict[str, Any], figs: CpuFigures) -> None:
    """Write atomically (a rename), so that concurrent readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "figures": asdict(figs)}, indent=1) + "\n")
    os.replace(tmp, path)


def run_probe() -> CpuFigures | None:
    """`measure()` in a fresh interpreter (torch stays out of this process); None when it fails."""
    import subprocess  # only here: every topology load imports this module (~10 ms)

    try:
        done = subprocess.run([sys.executable, "-m", "paracube.topologies.cpu_probe"], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            return None
        return _figures(json.loads(done.stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def cpu_figures(cores: int) -> CpuFigures | None:
    """This machine's probed figures: from the cache, else probed once and cached; None when disabled or
    when the probe failed (the preset then uses its fixed figures)."""
    if probing_disabled():
        return None
    path, key = cache_path(), cache_key(cores)
    figs = read_cache(path, key)
    if figs is None:  # one line on stderr: the first plan on a machine pauses for a few seconds
        print(f"paracube: probing this machine's CPU for the local-cpu preset (once; cached in {path})",
              file=sys.stderr, flush=True)
        figs = run_probe()
        if figs is not None:
            with contextlib.suppress(OSError):  # a read-only home: use the figures, probe again next time
                write_cache(path, key, figs)
    return figs


def _best_time(fn: Any, reps: int, rounds: int = 15) -> float:
    """The median over `rounds` of the mean seconds of `reps` calls: the machine's typical speed (a spike from
    another job moves a few rounds, not the median; the fastest round, 6-12 % faster on a quiet 2-core VM,
    made every local prediction optimistic by about that much)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def measure() -> CpuFigures:
    """Measure this process's figures (module docstring); imports torch."""
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    gemm: dict[str, float] = {}
    for m, n, k in GEMM_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)  # warm-up
        reps = max(2, int(4e6 // (m * n * k)))  # ~8 MFLOP a round: rounds of ~0.1 ms
        gemm[f"{m},{n},{k}"] = 2.0 * m * n * k / _best_time(lambda a=a, b=b: torch.mm(a, b), reps)
    x = torch.randn(8, 8, requires_grad=True)
    links = 50

    def chain() -> None:
        y = x
        for _ in range(links):
            y = y * 1.001 + 0.001
        y.backward(torch.ones_like(y))

    chain()  # warm-up
    ops = 2 * (2 * links)  # forward mul + add per link, a backward dispatch for each
    op_s = _best_time(chain, 2) / ops  # rounds of ~2 ms
    return CpuFigures(gemm, op_s, time.perf_counter() - start)


if __name__ == "__main__":
    print(json.dumps(asdict(measure())))
