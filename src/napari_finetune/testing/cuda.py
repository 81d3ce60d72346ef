"""A stand-in for ``torch.cuda``'s device and memory queries, with torch's argument checks.

On a CPU build every ``torch.cuda`` memory call fails in ``_lazy_init`` before
it looks at its argument, so a call that a real GPU refuses cannot be caught
here with the real API; and a fake that accepts any argument lets such a call
ship (``get_per_process_memory_fraction(torch.device("cuda"))`` did: torch
wants an index there). :class:`FakeCuda` answers the queries for a device that
is not there and checks each argument the way torch 2.13 does. The checks are
those of :mod:`napari_finetune.testing.cuda_matrix`, which runs the same
table against this fake (in the tests) and against the real ``torch.cuda``
(on a GPU), so the two cannot drift apart unseen. In short:

* an index is an ``int`` (a ``bool`` counts as one: ``True`` is device 1), a
  ``torch.device``, a string or a ``torch.cuda.device``; ``None`` (and, except
  for ``set_device`` and the per-process fraction, ``torch.device("cuda")``)
  is the current device; a CPU device is a ``ValueError``;
* an index out of range is an ``AssertionError`` ("Invalid device id") for
  ``get_device_properties`` (and what reads it) and a ``RuntimeError`` (CUDA's
  or the allocator's) elsewhere; ``set_device`` with a negative index does
  nothing;
* before CUDA is started, ``memory_allocated``, ``max_memory_allocated`` and
  ``memory_reserved`` answer 0 without looking at their argument, and
  ``reset_peak_memory_stats`` is a ``RuntimeError`` (the allocator has no
  devices yet); the calls that start CUDA (``current_device``,
  ``synchronize``, the properties, the fraction, ``current_stream``...) set
  :attr:`FakeCuda.initialized`.

The per-process fraction caps what the process may allocate, and with a
:class:`~napari_finetune.testing.faults.MemoryBudget` the allocation figures
follow the bytes the budget counts, so autobatch measures and plans against
the fake exactly as it does against CUDA's allocator (and the cap is
enforced: the budget shrinks to it). With ``tensors_on_host=True`` tensors
sent to a CUDA device stay on the CPU (and page-locking is skipped), so a
whole CUDA code path runs here, with its streams and events recorded.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from napari_finetune.testing.faults import MemoryBudget

DeviceArg = torch.device | str | int | torch.cuda.device | None

# What the caching allocator says for a device it has no state for.
ALLOCATOR_DEVICE = "Invalid device argument {}: did you call init?"
# What the CUDA runtime says for a device that is not there.
INVALID_ORDINAL = "CUDA error: invalid device ordinal"


def _capability(given: object) -> tuple[int, int]:
    """``(major, minor)`` from a pair of ints."""
    if not isinstance(given, (tuple, list)) or len(given) != 2:
        raise ValueError(f"a compute capability is (major, minor), not {given!r}")
    return int(given[0]), int(given[1])


@dataclass(frozen=True)
class FakeDeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns, for the fields the code reads."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int = 132


@dataclass(frozen=True)
class FakeStream:
    """A ``torch.cuda.Stream``: the current stream of ``device``."""

    device: torch.device


class FakeEvent:
    """A ``torch.cuda.Event``: remembers the stream it was recorded on.

    Parameters
    ----------
    cuda : FakeCuda
        The fake whose :attr:`FakeCuda.recorded` the recording is added to.
    """

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.stream: FakeStream | torch.cuda.Stream | None = None
        self.synchronized = False

    def record(self, stream: FakeStream | torch.cuda.Stream | None = None) -> None:
        """Record on ``stream``, or as torch does, on the current device's current stream."""
        if stream is None:
            stream = torch.cuda.current_stream()
        self.stream = stream
        self.cuda.recorded.append(stream.device)

    def query(self) -> bool:
        """Whether the work before the event is done (always: nothing runs)."""
        return True

    def synchronize(self) -> None:
        """Wait for the work before the event (a recorded event only, as on CUDA)."""
        self.synchronized = True


class _HostTensors(TorchFunctionMode):
    """Keep tensors sent to a CUDA device on the CPU, and skip page-locking.

    A CPU build has neither CUDA memory nor a pinned allocator; the device a
    tensor was sent to is checked as torch would and added to ``FakeCuda.moves``.
    """

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda

    def _host(self, value: object) -> object:
        if isinstance(value, (str, torch.device)) and torch.device(value).type == "cuda":
            device = torch.device(value)
            index = self.cuda.current if device.index is None else device.index
            if not 0 <= index < self.cuda.count:
                raise RuntimeError(INVALID_ORDINAL)
            self.cuda.initialized = True
            self.cuda.moves.append(torch.device("cuda", index))
            return torch.device("cpu")
        return value

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.pin_memory:
            return args[0]
        kwargs.pop("pin_memory", None)
        if func is torch.Tensor.to:
            args = [self._host(a) for a in args]
        if "device" in kwargs:  # .to(device=...) or a factory (torch.empty(..., device=...))
            kwargs["device"] = self._host(kwargs["device"])
        return func(*args, **kwargs)


class FakeCuda:
    """``torch.cuda`` answered for a GPU that is not there; a context manager.

    Inside ``with FakeCuda(...)``, ``torch.cuda.is_available()`` is True and the
    device and memory queries below answer for ``device_count`` devices;
    tensors still live on the CPU. On leaving, torch is as before.

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
    capability : tuple of int, or a sequence of them
        Compute capability of every device (``(9, 0)``: a Hopper GPU), or one
        per device (a host with mixed cards). bf16 is native from 8.0 on, as
        torch's ``is_bf16_supported(including_emulation=False)`` decides.
    name : str
        Device name.
    device_count : int
        Number of devices.
    initialized : bool
        Whether CUDA was started before (a process that already used the GPU,
        as the engine's memory code always is); False: a fresh process, whose
        allocator has no devices until a call starts CUDA.
    tensors_on_host : bool
        Keep tensors sent to a CUDA device on the CPU (see the module).

    Attributes
    ----------
    calls : list of tuple
        ``(function name, argument)`` of every query, in order.
    history : list of tuple
        The allocator-history calls: ``("record", enabled, max_entries)`` and
        ``("dump", filename)``.
    recorded : list of torch.device
        The device of the stream of every ``Event.record``, in order.
    moves : list of torch.device
        The device of every tensor sent to CUDA (``tensors_on_host``).
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
        capability: tuple[int, int] | Sequence[tuple[int, int]] = (9, 0),
        name: str = "Fake NVIDIA H200",
        device_count: int = 1,
        initialized: bool = True,
        tensors_on_host: bool = False,
    ) -> None:
        self.total_bytes = int(total_bytes)
        self.budget = budget
        self.base_allocated = int(allocated)
        self.cached = max(0, int(reserved) - int(allocated))
        self.used_elsewhere = int(used_elsewhere)
        one = bool(capability) and isinstance(capability[0], int)
        given: Sequence[object] = [capability] * device_count if one else capability
        self.capabilities: list[tuple[int, int]] = [_capability(c) for c in given]
        if len(self.capabilities) != device_count:
            raise ValueError("give one capability, or one per device")
        self.name = name
        self.count = device_count
        self.current = 0
        self.initialized = bool(initialized)
        self.tensors_on_host = tensors_on_host
        self.fraction = 1.0
        self.calls: list[tuple[str, object]] = []
        self.history: list[tuple[object, ...]] = []
        self.recorded: list[torch.device] = []
        self.moves: list[torch.device] = []
        self._rng = [torch.zeros(16, dtype=torch.uint8) for _ in range(device_count)]
        self._peak = self.allocated_bytes()
        self._saved: list[tuple[object, str, object]] = []
        self._mode: _HostTensors | None = None

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
        """The index torch resolves ``device`` to, not yet checked against the count."""
        # An int (a bool is one) is taken as it is, before any other check.
        if isinstance(device, int):
            return int(device)
        if isinstance(device, torch.cuda.device):
            return int(device.idx)
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            if device.index is not None:
                return device.index
        elif device is not None:
            raise ValueError(f"Expected a torch.device or an integer, but got: {device!r}")
        if not optional:
            raise ValueError(
                "Expected a torch.device with a specified index or an integer, "
                f"but got:{device}"
            )
        self.initialized = True  # the current device is asked of a started CUDA
        return self.current

    def _asked(self, function: str, device: DeviceArg, optional: bool) -> int:
        self.calls.append((function, device))
        return self._index(device, optional)

    def _allocator_device(self, function: str, device: DeviceArg) -> int:
        """The index, checked as the caching allocator checks it (a ``RuntimeError``)."""
        index = self._asked(function, device, optional=True)
        if not self.initialized or not 0 <= index < self.count:
            raise RuntimeError(ALLOCATOR_DEVICE.format(index))
        return index

    def _runtime_device(self, function: str, device: DeviceArg, optional: bool) -> int:
        """Start CUDA and check the index as the CUDA runtime does (a ``RuntimeError``)."""
        self.initialized = True
        index = self._asked(function, device, optional)
        if not 0 <= index < self.count:
            raise RuntimeError(INVALID_ORDINAL)
        return index

    # --- torch.cuda's functions ----------------------------------------------------

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        self.initialized = True
        return self.current

    def set_device(self, device: DeviceArg) -> None:
        index = self._asked("set_device", device, optional=False)
        if index < 0:  # torch: "a no-op if this argument is negative"
            return
        self.initialized = True
        if index >= self.count:
            raise RuntimeError(INVALID_ORDINAL)
        self.current = index

    def synchronize(self, device: DeviceArg = None) -> None:
        self.initialized = True
        index = self._asked("synchronize", device, optional=True)
        if index >= self.count:  # a negative index leaves the device as it is
            raise RuntimeError(INVALID_ORDINAL)

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", None))
        self.cached = 0

    def mem_get_info(self, device: DeviceArg = None) -> tuple[int, int]:
        self._runtime_device("mem_get_info", device, optional=True)
        free = self.total_bytes - self.used_elsewhere - self.reserved_bytes()
        return max(0, free), self.total_bytes

    def _stats_device(self, function: str, device: DeviceArg) -> bool:
        """Whether the allocator has figures: none (and no check) before CUDA starts."""
        if not self.initialized:
            self.calls.append((function, device))
            return False
        self._allocator_device(function, device)
        return True

    def memory_allocated(self, device: DeviceArg = None) -> int:
        if not self._stats_device("memory_allocated", device):
            return 0
        return self.allocated_bytes()

    def memory_reserved(self, device: DeviceArg = None) -> int:
        if not self._stats_device("memory_reserved", device):
            return 0
        return self.reserved_bytes()

    def max_memory_allocated(self, device: DeviceArg = None) -> int:
        if not self._stats_device("max_memory_allocated", device):
            return 0
        if self.budget is not None:
            self._peak = max(self._peak, self.base_allocated + self.budget.peak_bytes)
        return max(self._peak, self.allocated_bytes())

    def reset_peak_memory_stats(self, device: DeviceArg = None) -> None:
        self._allocator_device("reset_peak_memory_stats", device)
        if self.budget is not None:
            self.budget.peak_bytes = self.budget.live_bytes
        self._peak = self.allocated_bytes()

    def get_per_process_memory_fraction(self, device: DeviceArg = None) -> float:
        self.initialized = True
        self._allocator_device_strict("get_per_process_memory_fraction", device)
        return self.fraction

    def _allocator_device_strict(self, function: str, device: DeviceArg) -> int:
        # None is the current device; torch.device("cuda") is refused (no index).
        index = self._asked(function, device, optional=device is None)
        if not 0 <= index < self.count:
            raise RuntimeError(ALLOCATOR_DEVICE.format(index))
        return index

    def set_per_process_memory_fraction(self, fraction: float, device: DeviceArg = None) -> None:
        self.initialized = True
        index = self._asked("set_per_process_memory_fraction", device, optional=device is None)
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        if not 0 <= index < self.count:
            raise RuntimeError(ALLOCATOR_DEVICE.format(index))
        self.fraction = fraction
        if self.budget is not None:
            cap = int(fraction * self.total_bytes)
            self.budget.budget_bytes = max(0, cap - self.base_allocated)

    def get_device_properties(self, device: DeviceArg = None) -> FakeDeviceProperties:
        self.initialized = True
        index = self._asked("get_device_properties", device, optional=True)
        if not 0 <= index < self.count:
            raise AssertionError("Invalid device id")
        major, minor = self.capabilities[index]
        return FakeDeviceProperties(self.name, major, minor, self.total_bytes)

    def get_device_capability(self, device: DeviceArg = None) -> tuple[int, int]:
        props = self.get_device_properties(device)
        return props.major, props.minor

    def get_device_name(self, device: DeviceArg = None) -> str:
        return self.get_device_properties(device).name

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        # torch 2.13 answers for the current device: native from 8.0 on, and
        # emulated (a bf16 tensor can be made) on every older card it runs on.
        self.calls.append(("is_bf16_supported", including_emulation))
        return self.capabilities[self.current][0] >= 8 or including_emulation

    def current_stream(self, device: DeviceArg = None) -> FakeStream:
        index = self._runtime_device("current_stream", device, optional=True)
        return FakeStream(torch.device("cuda", index))

    def event(
        self,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
    ) -> FakeEvent:
        """``torch.cuda.Event(...)``."""
        return FakeEvent(self)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        self.initialized = True
        return [state.clone() for state in self._rng]

    def set_rng_state_all(self, new_states: Sequence[torch.Tensor]) -> None:
        self.initialized = True
        self._rng = [state.clone() for state in new_states]

    # --- the allocator history (torch.cuda.memory's private pair) ------------------

    def record_memory_history(
        self,
        enabled: str | None = "all",
        context: str | None = "all",
        stacks: str = "all",
        max_entries: int = sys.maxsize,
        device: DeviceArg = None,
        clear_history: bool = False,
        compile_context: bool = False,
        global_record_annotations: bool = False,
        skip_actions: list[str] | None = None,
    ) -> None:
        if isinstance(enabled, bool):
            raise TypeError("the fake has no legacy (bool) allocator history")
        if enabled not in (None, "state", "all"):
            raise ValueError("enabled must be None, 'state' or 'all'")
        self.history.append(("record", enabled, max_entries))

    def dump_snapshot(
        self, filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False
    ) -> None:
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
            "is_bf16_supported", "current_stream", "get_rng_state_all", "set_rng_state_all",
        ]
        out: list[tuple[object, str, Callable[..., object]]] = [
            (cuda, name, getattr(self, name)) for name in names
        ]
        out.append((cuda, "Event", self.event))
        out.append((cuda.memory, "_record_memory_history", self.record_memory_history))
        out.append((cuda.memory, "_dump_snapshot", self.dump_snapshot))
        return out

    def __enter__(self) -> FakeCuda:
        for owner, name, function in self._replacements():
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, function)
        if self.tensors_on_host:
            self._mode = _HostTensors(self)
            self._mode.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._mode is not None:
            self._mode.__exit__(exc_type, exc, traceback)
            self._mode = None
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)
