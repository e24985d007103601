"""Planning in the user's terms: tokens to train (`2T`, `300B`, `2e12`), time and cost to train, memory headroom.

- Tokens: a number with an optional suffix K = 1e3, M = 1e6, B = G = 1e9, T = 1e12 (case ignored); without
  `--tokens`, 20 tokens per parameter (Hoffmann et al. 2022, "Training Compute-Optimal LLMs", Table 3).
- Time to train = ceil(tokens / tokens per step) x step time; cost = GPUs x hours x price per GPU-hour.
- Memory headroom: a plan must leave a fraction of each device's memory unused. A real run needs memory the
  model does not count: the CUDA context, NCCL's communicator buffers (NCCL_BUFFSIZE, 4 MiB per channel and peer
  by default) and the caching allocator's fragmentation (reserved above allocated). DEFAULT_MEMORY_HEADROOM =
  10% (8 GiB of an 80 GiB device) is a stated allowance, not a measurement; `--memory-headroom 0` plans to the
  last byte, as the cost model counts it.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from paracube.cli.options import human_bytes
from paracube.planner.config import DEFAULT_MEMORY_HEADROOM  # one value, the search's (planner/config.py)

TOKENS_PER_PARAMETER = 20.0  # Hoffmann et al. 2022
SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_TOKENS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


def parse_tokens(text: str) -> float:
    """'2T' -> 2e12, '300B' -> 3e11, '2e12' -> 2e12; argparse type (a bad value is one line, exit 2)."""
    m = _TOKENS.match(str(text))
    value = float(m.group(1)) * SUFFIXES[m.group(2).lower()] if m else math.nan
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count; expected e.g. 2T, 300B, 1.5e12 "
                                         "(suffixes K, M, B, T; at least 1)")
    return value


def headroom_fraction(text: str) -> float:
    """'0.1' or '10%' -> 0.1; argparse type."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        value = math.nan
    if not (0.0 <= value < 1.0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction of device memory; expected 0 <= f < 1, "
                                         "e.g. 0.1 or 10%")
    return value


def non_negative_price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a price; expected USD per GPU-hour >= 0, e.g. 2.5")
    return value


def add_train_options(p: argparse.ArgumentParser, price: bool = True) -> None:
    g = p.add_argument_group("time and cost to train")
    g.add_argument("--tokens", type=parse_tokens, default=None, metavar="N",
                   help="tokens to train, e.g. 2T, 300B, 2e12 (default 20 per parameter, Hoffmann et al. 2022)")
    if price:
        g.add_argument("--price-per-gpu-hour", type=non_negative_price, default=None, metavar="USD",
                       help="price of one GPU-hour: prints the cost to train")
    g.add_argument("--memory-headroom", type=headroom_fraction, default=DEFAULT_MEMORY_HEADROOM, metavar="F",
                   help=f"fraction of device memory a plan leaves free for the allocator, NCCL buffers and "
                   f"fragmentation (default {DEFAULT_MEMORY_HEADROOM:g}; 0 to plan to the last byte)")


@dataclass(frozen=True)
class TrainCost:
    tokens: float
    tokens_per_step: int
    steps: int
    seconds: float
    gpus: int
    price_per_gpu_hour: float | None

    @property
    def days(self) -> float:
        return self.seconds / 86400

    @property
    def gpu_hours(self) -> float:
        return self.seconds / 3600 * self.gpus

    @property
    def cost_usd(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict[str, float | int | None]:
        return {"tokens": self.tokens, "tokens_per_step": self.tokens_per_step, "steps": self.steps,
                "train_days": self.days, "gpu_hours": self.gpu_hours, "price_per_gpu_hour": self.price_per_gpu_hour,
                "cost_usd": self.cost_usd}

    def line(self, default_tokens: bool) -> str:
        how = " (20 per parameter; --tokens N to change)" if default_tokens else ""
        cost = (f"; {self.gpu_hours:,.0f} GPU-hours x ${self.price_per_gpu_hour:g} = ${self.cost_usd:,.0f}"
                if self.cost_usd is not None else "; --price-per-gpu-hour USD for the cost")
        return (f"to train {human_count(self.tokens)} tokens{how}: {self.steps:,} steps of {self.tokens_per_step:,} "
                f"tokens = {human_days(self.days)} on {self.gpus} GPUs{cost}")


def train_cost(tokens: float, tokens_per_step: int, step_time_s: float, gpus: int,
               price_per_gpu_hour: float | None) -> TrainCost:
    steps = math.ceil(tokens / tokens_per_step)
    return TrainCost(tokens, tokens_per_step, steps, steps * step_time_s, gpus, price_per_gpu_hour)


def human_count(n: float) -> str:
    for value, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= value:
            return f"{n / value:.4g}{unit}"
    return f"{n:.0f}"


def human_days(days: float) -> str:
    if days >= 1:
        return f"{days:,.1f} days"
    hours = days * 24
    return f"{hours:.1f} hours" if hours >= 1 else f"{hours * 60:.1f} minutes"


def headroom_line(used: float, device_memory: float, headroom: float) -> str:
    """`memory: 62.8 GiB of 80.0 GiB per device; 10% headroom (8.0 GiB) held back, 9.2 GiB more would fit`."""
    cap = device_memory * (1 - headroom)
    left = cap - used
    held = (f"{headroom:.0%} headroom ({human_bytes(device_memory * headroom)}) kept free for allocator, NCCL "
            "buffers, fragmentation" if headroom else "no headroom kept free (--memory-headroom 0)")
    fit = f"{human_bytes(left)} more would fit" if left >= 0 else f"{human_bytes(-left)} over the headroom"
    return (f"memory: {human_bytes(used)} of {human_bytes(device_memory)} per device "
            f"({used / device_memory:.1%}); {held}; {fit}")


def host_line(host: float, host_memory: float, offload: int, layers: int, headroom: float) -> str:
    """`host memory: 63.0 GiB of 223.5 GiB per device (28.2%), the activations of off=30 of 80 blocks; ...`: what
    an offloaded layout keeps on the host (cost_models/analytic.host_memory), against the host's share a device has
    (DeviceSpec.host_memory_bytes), the planner's limit being that less the headroom."""
    cap = host_memory * (1 - headroom)
    share = f" ({host / host_memory:.1%})" if host_memory > 0 else ""
    fit = f"{human_bytes(cap - host)} more would fit" if host <= cap else f"{human_bytes(host - cap)} over the headroom"
    return (f"host memory: {human_bytes(host)} of {human_bytes(host_memory)} per device{share}, the activations of "
            f"off={offload} of {layers} blocks; {fit}")

