"""Free memory and measured peaks of a device, the figures autobatch plans with.

A provider answers four questions: the bytes free now, and the peak of a
measured stretch (``start_measure`` ... ``measured_peak``), with ``observe``
called at the moment activations are largest (after the forward pass) for
devices that keep no peak statistics themselves. CUDA's caching allocator
and MPS have their own; on the CPU there is no device limit to plan against,
and ``napari_finetune.testing.MemoryBudget`` plays the device in tests.
"""

from __future__ import annotations

from typing import Protocol

import torch


class MemoryInfo(Protocol):
    """What autobatch asks a device about its memory."""

    name: str

    def free_bytes(self) -> int:
        """Bytes that can still be allocated now."""

    def start_measure(self) -> None:
        """Start a measured stretch at the current allocation."""

    def observe(self) -> None:
        """Sample the current allocation (devices without peak statistics)."""

    def measured_peak(self) -> int:
        """Peak bytes of the stretch above where it started."""


class CudaMemory:
    """The CUDA caching allocator's figures for one device."""

    name = "CUDA"

    def __init__(self, device: torch.device) -> None:
        # torch.device("cuda") names the current device, and most queries take it
        # so; the per-process cap does not (it wants an index), so the index is
        # fixed here, once, for every query.
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self._base = 0

    def free_bytes(self) -> int:
        # Free on the device plus what the allocator caches but does not use,
        # and no more than a per-process cap leaves (set_per_process_memory_fraction;
        # mem_get_info knows nothing of it).
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        usable = free + torch.cuda.memory_reserved(self.device) - allocated
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:  # torch >= 2.7
            fraction = get_fraction(self.device.index)
            usable = min(usable, int(fraction * total) - allocated)
        return max(0, int(usable))

    def start_measure(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base = torch.cuda.memory_allocated(self.device)

    def observe(self) -> None:
        """The allocator keeps its own peak."""

    def measured_peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return max(0, int(torch.cuda.max_memory_allocated(self.device)) - self._base)


class MpsMemory:
    """Apple MPS: the driver's recommended maximum, peaks sampled after the forward pass."""

    name = "MPS"

    def __init__(self) -> None:
        self._base = 0
        self._peak = 0

    def free_bytes(self) -> int:
        return max(0, int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()))

    def start_measure(self) -> None:
        torch.mps.synchronize()
        self._base = self._peak = int(torch.mps.current_allocated_memory())

    def observe(self) -> None:
        self._peak = max(self._peak, int(torch.mps.current_allocated_memory()))

    def measured_peak(self) -> int:
        torch.mps.synchronize()
        self.observe()
        return max(0, self._peak - self._base)


def memory_info_for(device: torch.device) -> MemoryInfo | None:
    """The device's own provider; None on the CPU (no device limit)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaMemory(device)
    if device.type == "mps" and hasattr(torch, "mps"):
        return MpsMemory()
    return None


def format_bytes(n: float, unit_of: float | None = None) -> str:
    """``1.5 GiB``, ``12.3 MiB``, ``800 KiB``: the unit chosen by ``unit_of`` (default ``n``)."""
    scale = abs(unit_of if unit_of is not None else n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if scale >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
