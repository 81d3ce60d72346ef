"""One table of ``torch.cuda`` calls and what torch 2.13 answers, for the real module and a fake.

:func:`run_matrix` runs every row against a module with ``torch.cuda``'s
functions: the tests run it against :class:`~napari_finetune.testing.FakeCuda`
(patched into ``torch.cuda``), a GPU benchmark against the real ``torch.cuda``,
so a fake that answers otherwise than torch is seen on the first GPU run. It
imports torch alone (nothing of the project), so it runs wherever torch does.

A row is a call, given the module and the number of devices, and the answer
expected: a type the result is an instance of (``int``: a byte count), a value
it equals, or an exception type the call raises. The rows of a CUDA not yet
started are run first, and only while it is not (a process that used the GPU
already cannot show them).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

Call = Callable[[ModuleType, int], object]


@dataclass(frozen=True)
class Case:
    """One call and the answer torch gives.

    Attributes
    ----------
    function : str
        The function called (as ``torch.cuda.<function>``).
    argument : str
        The argument, in words.
    call : callable
        ``call(cuda, device_count)`` makes the call.
    expected : type or object
        An exception type raised, a type of the result, or the result itself.
    before_init : bool
        A row of a CUDA not yet started.
    """

    function: str
    argument: str
    call: Call
    expected: object
    before_init: bool = False


@dataclass(frozen=True)
class Row:
    """What one case gave.

    Attributes
    ----------
    function, argument : str
        As in :class:`Case`.
    expected : str
        The expected answer, in words.
    got : str
        The answer, in words (``"raised ValueError"`` or the result's type and value).
    ok : bool
        Whether ``got`` is ``expected``.
    """

    function: str
    argument: str
    expected: str
    got: str
    ok: bool


def _words(answer: object) -> str:
    if isinstance(answer, type):
        return answer.__name__
    return repr(answer)


def _matches(result: object, expected: object) -> bool:
    if isinstance(expected, type):
        return isinstance(result, expected)
    return result == expected


def _set_device_minus_one(cuda: ModuleType, count: int) -> object:
    before = cuda.current_device()
    cuda.set_device(-1)
    return cuda.current_device() == before


def _stream_device(cuda: ModuleType, count: int, device: object) -> object:
    return cuda.current_stream(device).device


def _not_started_after(query: Callable[[ModuleType], object]) -> Call:
    def call(cuda: ModuleType, count: int) -> object:
        answer = query(cuda)
        return (answer, cuda.is_initialized())

    return call


def _true_is_one(cuda: ModuleType, count: int) -> object:
    try:
        return cuda.get_device_capability(True) == cuda.get_device_capability(1)
    except AssertionError:  # one device: True is out of range, as 1 is
        return count < 2


def _history_keywords(cuda: ModuleType, count: int) -> object:
    cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=1000, device=None,
        clear_history=True,
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "snapshot.pickle")
            cuda.memory._dump_snapshot(filename=path)
            written = os.path.getsize(path) > 0
    finally:
        cuda.memory._record_memory_history(enabled=None)
    return written


CASES: list[Case] = [
    # A CUDA not yet started: the statistics are empty, whatever the argument.
    Case("memory_allocated", "0, before init",
         _not_started_after(lambda c: c.memory_allocated(0)), (0, False), before_init=True),
    Case("max_memory_allocated", "an index out of range, before init",
         lambda c, n: (c.max_memory_allocated(n), c.is_initialized()), (0, False),
         before_init=True),
    Case("memory_reserved", "None, before init",
         _not_started_after(lambda c: c.memory_reserved()), (0, False), before_init=True),
    Case("reset_peak_memory_stats", "0, before init (the allocator has no device)",
         lambda c, n: c.reset_peak_memory_stats(0), RuntimeError, before_init=True),
    # Started (reset_peak_memory_stats(None) asks for the current device: that starts it).
    Case("reset_peak_memory_stats", "None (starts CUDA)",
         lambda c, n: (c.reset_peak_memory_stats(None), c.is_initialized()), (None, True)),
    # What an index may be.
    Case("get_device_capability", "False (a bool is an int: device 0)",
         lambda c, n: c.get_device_capability(False), tuple),
    Case("get_device_capability", "True (device 1)", _true_is_one, True),
    Case("memory_allocated", "False", lambda c, n: c.memory_allocated(False), int),
    Case("get_device_properties", "torch.cuda.device(0)",
         lambda c, n: c.get_device_properties(torch.cuda.device(0)).major >= 0, True),
    Case("mem_get_info", "torch.cuda.device(0)",
         lambda c, n: c.mem_get_info(torch.cuda.device(0)), tuple),
    Case("memory_allocated", "torch.device('cuda')",
         lambda c, n: c.memory_allocated(torch.device("cuda")), int),
    Case("memory_allocated", "torch.device('cpu')",
         lambda c, n: c.memory_allocated(torch.device("cpu")), ValueError),
    Case("current_stream", "False", lambda c, n: _stream_device(c, n, False),
         torch.device("cuda", 0)),
    Case("current_stream", "'cuda:0'", lambda c, n: _stream_device(c, n, "cuda:0"),
         torch.device("cuda", 0)),
    # set_device.
    Case("set_device", "-1 (a no-op)", _set_device_minus_one, True),
    Case("set_device", "None", lambda c, n: c.set_device(None), ValueError),
    Case("set_device", "torch.device('cuda')",
         lambda c, n: c.set_device(torch.device("cuda")), ValueError),
    Case("set_device", "an index out of range", lambda c, n: c.set_device(n), RuntimeError),
    # An index out of range: whose exception it is depends on who checks.
    Case("get_device_properties", "an index out of range",
         lambda c, n: c.get_device_properties(n), AssertionError),
    Case("get_device_properties", "-1", lambda c, n: c.get_device_properties(-1),
         AssertionError),
    Case("get_device_capability", "an index out of range",
         lambda c, n: c.get_device_capability(n), AssertionError),
    Case("memory_allocated", "an index out of range",
         lambda c, n: c.memory_allocated(n), RuntimeError),
    Case("max_memory_allocated", "an index out of range",
         lambda c, n: c.max_memory_allocated(n), RuntimeError),
    Case("reset_peak_memory_stats", "an index out of range",
         lambda c, n: c.reset_peak_memory_stats(n), RuntimeError),
    Case("mem_get_info", "an index out of range", lambda c, n: c.mem_get_info(n), RuntimeError),
    Case("synchronize", "an index out of range", lambda c, n: c.synchronize(n), RuntimeError),
    Case("current_stream", "an index out of range",
         lambda c, n: c.current_stream(n), RuntimeError),
    # The per-process fraction wants an index (None is the current device).
    Case("get_per_process_memory_fraction", "None",
         lambda c, n: c.get_per_process_memory_fraction(None), float),
    Case("get_per_process_memory_fraction", "torch.device('cuda')",
         lambda c, n: c.get_per_process_memory_fraction(torch.device("cuda")), ValueError),
    Case("get_per_process_memory_fraction", "an index out of range",
         lambda c, n: c.get_per_process_memory_fraction(n), RuntimeError),
    Case("set_per_process_memory_fraction", "1 (an int), 0",
         lambda c, n: c.set_per_process_memory_fraction(1, 0), TypeError),
    Case("set_per_process_memory_fraction", "1.5, 0",
         lambda c, n: c.set_per_process_memory_fraction(1.5, 0), ValueError),
    Case("set_per_process_memory_fraction", "0.5, torch.device('cuda')",
         lambda c, n: c.set_per_process_memory_fraction(0.5, torch.device("cuda")), ValueError),
    # The allocator history, called with keywords as the engine calls it.
    Case("memory._record_memory_history, memory._dump_snapshot",
         "enabled, context, stacks, max_entries, device, clear_history; filename",
         _history_keywords, True),
]


def run_case(case: Case, cuda: ModuleType, count: int) -> Row:
    """Make one call and compare its answer with the expected one."""
    try:
        result = case.call(cuda, count)
    except Exception as exc:  # noqa: BLE001 - the exception is the answer compared
        got = f"raised {type(exc).__name__}: {exc}"
        ok = isinstance(case.expected, type) and isinstance(exc, case.expected)
    else:
        got = f"{type(result).__name__} {result!r}"
        expects_raise = isinstance(case.expected, type) and issubclass(
            case.expected, BaseException
        )
        ok = not expects_raise and _matches(result, case.expected)
    return Row(case.function, case.argument, _words(case.expected), got, ok)


def run_matrix(cuda_module: ModuleType) -> list[Row]:
    """Run every case against ``cuda_module`` (``torch.cuda``, real or patched by a fake).

    The rows of a CUDA not yet started come first, and only while it is not;
    the device's current index is put back afterwards. The per-process
    fraction is never changed (only refused calls are made).
    """
    count = cuda_module.device_count()
    fresh = not cuda_module.is_initialized()
    rows = [run_case(case, cuda_module, count) for case in CASES if case.before_init and fresh]
    current = cuda_module.current_device()
    try:
        rows += [run_case(case, cuda_module, count) for case in CASES if not case.before_init]
    finally:
        cuda_module.set_device(current)
    return rows
