"""Activation offloading in paracube's executor (Layout off=N, runtimes/offload.py): the forwards of the stage's first N
blocks run under torch.autograd.graph.save_on_cpu, so autograd packs every tensor they save for backward into host
memory (a pinned copy on a GPU, on the compute stream: priced in line, cost_models/offload.py) and unpacks it to the
device in backward; the other blocks save as before. On CPU ranks save_on_cpu's pack is `tensor.cpu()`, the tensor
itself: the run is the same computation, which is what the equivalence tests check.
`BlockOffload.packed` counts, per offloaded block, what its hooks packed (tensors, bytes, the devices of the packed
tensors): the tests' evidence that exactly the offloaded blocks' saved tensors went through them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class PackCount:
    """What one block's offload hooks packed: tensors, bytes, and the device types of the packed tensors."""

    tensors: int = 0
    bytes: int = 0
    devices: set[str] = field(default_factory=set)


class _CountedSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """save_on_cpu whose pack hook also counts into `count` (the hooks are its own instance's: nothing global)."""

    def __init__(self, count: PackCount, pin_memory: bool) -> None:
        super().__init__(pin_memory=pin_memory, device_type="cuda")
        pack = self.pack_hook

        def counted(tensor: Tensor) -> object:
            device, packed = pack(tensor)
            count.tensors += 1
            count.bytes += packed.numel() * packed.element_size()
            count.devices.add(packed.device.type)
            return device, packed

        self.pack_hook = counted


class BlockOffload:
    """The offloaded blocks of a model (global indices below `blocks`) and what their hooks packed."""

    def __init__(self, blocks: int, pin_memory: bool) -> None:
        self.blocks, self.pin_memory = blocks, pin_memory
        self.packed: dict[int, PackCount] = {}

    def block(self, index: int) -> AbstractContextManager[object]:
        """The context block `index`'s forward runs in: save_on_cpu where it is offloaded and autograd records."""
        if index >= self.blocks or not torch.is_grad_enabled():
            return nullcontext()
        return _CountedSaveOnCpu(self.packed.setdefault(index, PackCount()), self.pin_memory)


__all__ = ["BlockOffload", "PackCount"]
