"""A stand-in for ``torch.cuda``'s device and memory queries, with torch's argument checks.

On a CPU build every ``torch.cuda`` memory call fails in ``_lazy_init`` before
it looks at its argument, so a call that a real GPU refuses cannot be caught
here with the real API; and a fake that accepts any argument lets such a call
ship (``get_per_process_memory_fraction(torch.device("cuda"))`` did: torch
wants an index there). :class:`FakeCuda` answers the queries for a device that
is not there and checks each argument the way torch 2.13 does:

=======================================  ==========================================
function                                 ``torch.device("cuda")`` (no index)
=======================================  ==========================================
``get_per_process_memory_fraction``,      ``ValueError`` ("Expected a torch.device
``set_per_process_memory_fraction``,      with a specified index or an integer")
``set_device``
``mem_get_info``, ``memory_allocated``,   accepted: the current device
``memory_reserved``,
``max_memory_allocated``,
``reset_peak_memory_stats``,
``synchronize``, ``get_device_properties``,
``get_device_capability``,
``get_device_name``
=======================================  ==========================================

``None`` means the current device everywhere; a CPU device is a ``ValueError``;
an index past ``device_count()`` an ``AssertionError`` ("Invalid device id"),
as in torch. The per-process fraction caps what the process may allocate, and
with a :class:`~napari_finetune.testing.faults.MemoryBudget` the allocation
figures follow the bytes the budget counts, so autobatch measures and plans
against the fake exactly as it does against CUDA's allocator (and the cap is
enforced: the budget shrinks to it).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from napari_finetune.testing.faults import MemoryBudget

DeviceArg = torch.device | str | int | None


@dataclass(frozen=True)
class FakeDeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns, for the fields the code reads."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int = 132


class FakeCuda:
    """``torch.cuda`` answered for a GPU that is not there; a context manager.

    Inside ``with FakeCuda(...)``, ``torch.cuda.is_available()`` is True and the
    device and memory queries below answer for ``device_count`` identical
    devices; tensors still live on the CPU. On leaving, torch is as before.

    Parameters
    ----------
    total_bytes : int
        Memory of each device.
    budget : MemoryBudget, optional
        When given, ``memory_allocated`` is ``allocated`` plus the bytes the
        budget counts, the peak follows the budget's, and
        ``set_per_process_memory_fraction`` shrinks the budget to the cap.
    allocated, reserved : int
        Bytes this process holds (and the allocator caches) before anything runs.
    used_elsewhere : int
        Bytes other processes hold on the device (not free for this one).
    capability : tuple of int
        Compute capability (``(9, 0)``: a Hopper GPU).
    bf16_native : bool
        Whether the GPU has bf16 in hardware (else it is emulated).
    name : str
        Device name.
    device_count : int
        Number of devices.

    Attributes
    ----------
    calls : list of tuple
        ``(function name, argument)`` of every query, in order.
    history : list of tuple
        The allocator-history calls: ``("record", enabled, max_entries)`` and
        ``("dump", filename)``.
    fraction : float
        The per-process memory fraction (1.0 until set).
    """

    def __init__(
        self,
        total_bytes: int = 80 * 2**30,
        budget: MemoryBudget | None = None,
        allocated: int = 0,
        reserved: int = 0,
        used_elsewhere: int = 0,
        capability: tuple[int, int] = (9, 0),
        bf16_native: bool = True,
        name: str = "Fake NVIDIA H200",
        device_count: int = 1,
    ) -> None:
        self.total_bytes = int(total_bytes)
        self.budget = budget
        self.base_allocated = int(allocated)
        self.cached = max(0, int(reserved) - int(allocated))
        self.used_elsewhere = int(used_elsewhere)
        self.capability = capability
        self.bf16_native = bf16_native
        self.name = name
        self.count = device_count
        self.current = 0
        self.fraction = 1.0
        self.calls: list[tuple[str, object]] = []
        self.history: list[tuple[object, ...]] = []
        self._peak = self.allocated_bytes()
        self._saved: list[tuple[object, str, object]] = []

    # --- the figures ---------------------------------------------------------------

    def allocated_bytes(self) -> int:
        """Bytes allocated now (``allocated`` plus what the budget counts)."""
        live = self.budget.live_bytes if self.budget is not None else 0
        return self.base_allocated + live

    def reserved_bytes(self) -> int:
        """Allocated plus cached: the allocator never holds less than it hands out."""
        return self.allocated_bytes() + self.cached

    # --- argument checks, as torch.cuda._utils._get_device_index -------------------

    def _index(self, device: DeviceArg, optional: bool) -> int:
        if device is None:
            return self.current
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            if device.index is None:
                if not optional:
                    raise ValueError(
                        "Expected a torch.device with a specified index or an integer, "
                        f"but got:{device}"
                    )
                return self.current
            index = device.index
        elif isinstance(device, int) and not isinstance(device, bool):
            index = device
        else:
            raise ValueError(f"Expected a torch.device or an integer, but got: {device!r}")
        if not 0 <= index < self.count:
            raise AssertionError("Invalid device id")
        return index

    def _asked(self, function: str, device: DeviceArg, optional: bool) -> int:
        self.calls.append((function, device))
        return self._index(device, optional)

    # --- torch.cuda's functions ----------------------------------------------------

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        # Nothing was initialised: the RNG of a CUDA that is not there is not saved.
        return False

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def set_device(self, device: DeviceArg) -> None:
        self.current = self._asked("set_device", device, optional=False)

    def synchronize(self, device: DeviceArg = None) -> None:
        self._asked("synchronize", device, optional=True)

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", None))
        self.cached = 0

    def mem_get_info(self, device: DeviceArg = None) -> tuple[int, int]:
        self._asked("mem_get_info", device, optional=True)
        free = self.total_bytes - self.used_elsewhere - self.reserved_bytes()
        return max(0, free), self.total_bytes

    def memory_allocated(self, device: DeviceArg = None) -> int:
        self._asked("memory_allocated", device, optional=True)
        return self.allocated_bytes()

    def memory_reserved(self, device: DeviceArg = None) -> int:
        self._asked("memory_reserved", device, optional=True)
        return self.reserved_bytes()

    def max_memory_allocated(self, device: DeviceArg = None) -> int:
        self._asked("max_memory_allocated", device, optional=True)
        if self.budget is not None:
            self._peak = max(self._peak, self.base_allocated + self.budget.peak_bytes)
        return max(self._peak, self.allocated_bytes())

    def reset_peak_memory_stats(self, device: DeviceArg = None) -> None:
        self._asked("reset_peak_memory_stats", device, optional=True)
        if self.budget is not None:
            self.budget.peak_bytes = self.budget.live_bytes
        self._peak = self.allocated_bytes()

    def get_per_process_memory_fraction(self, device: DeviceArg = None) -> float:
        self._asked("get_per_process_memory_fraction", device, optional=False)
        return self.fraction

    def set_per_process_memory_fraction(self, fraction: float, device: DeviceArg = None) -> None:
        self._asked("set_per_process_memory_fraction", device, optional=False)
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.fraction = fraction
        if self.budget is not None:
            cap = int(fraction * self.total_bytes)
            self.budget.budget_bytes = max(0, cap - self.base_allocated)

    def get_device_properties(self, device: DeviceArg = None) -> FakeDeviceProperties:
        self._asked("get_device_properties", device, optional=True)
        major, minor = self.capability
        return FakeDeviceProperties(self.name, major, minor, self.total_bytes)

    def get_device_capability(self, device: DeviceArg = None) -> tuple[int, int]:
        props = self.get_device_properties(device)
        return props.major, props.minor

    def get_device_name(self, device: DeviceArg = None) -> str:
        return self.get_device_properties(device).name

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        self.calls.append(("is_bf16_supported", including_emulation))
        return self.bf16_native or including_emulation

    # --- the allocator history (torch.cuda.memory's private pair) ------------------

    def record_memory_history(
        self,
        enabled: str | None = "all",
        context: str | None = "all",
        stacks: str = "all",
        max_entries: int = 2**63 - 1,
        device: DeviceArg = None,
        clear_history: bool = False,
    ) -> None:
        if enabled not in (None, "state", "all"):
            raise ValueError("enabled must be None, 'state' or 'all'")
        self.history.append(("record", enabled, max_entries))

    def dump_snapshot(self, filename: str = "dump_snapshot.pickle") -> None:
        self.history.append(("dump", filename))
        with open(filename, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[]]}, f)

    # --- patching --------------------------------------------------------------------

    def _replacements(self) -> list[tuple[object, str, Callable[..., object]]]:
        cuda = torch.cuda
        names = [
            "is_available", "is_initialized", "device_count", "current_device", "set_device",
            "synchronize", "empty_cache", "mem_get_info", "memory_allocated",
            "memory_reserved", "max_memory_allocated", "reset_peak_memory_stats",
            "get_per_process_memory_fraction", "set_per_process_memory_fraction",
            "get_device_properties", "get_device_capability", "get_device_name",
            "is_bf16_supported",
        ]
        out: list[tuple[object, str, Callable[..., object]]] = [
            (cuda, name, getattr(self, name)) for name in names
        ]
        out.append((cuda.memory, "_record_memory_history", self.record_memory_history))
        out.append((cuda.memory, "_dump_snapshot", self.dump_snapshot))
        return out

    def __enter__(self) -> FakeCuda:
        for owner, name, function in self._replacements():
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, function)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)
