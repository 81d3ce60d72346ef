"""How a job runs, whoever runs it: the job's type, its guard, its share of the cores.

A job is a generator that yields typed events (:mod:`napari_finetune.session.events`)
and returns its result. Whoever runs it (the inline runner of
:mod:`napari_finetune.session.runner`, napari's thread worker in
``napari_finetune._qt.worker``, a remote runner) wraps it in :func:`guarded`,
so every runner sees the same failures and device memory is given back however
it ends. Nothing here imports Qt.
"""

from __future__ import annotations

import functools
import gc
import os
import queue
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ParamSpec, TypeVar

from napari_finetune.session.events import Event, JobError, Progress

P = ParamSpec("P")
R = TypeVar("R")
Job = Generator[Event, None, R]


def call_job(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Job[R]:
    """``fn(*args)`` as a job that yields nothing and returns its result."""
    yield from ()  # a generator, so the worker honours quit() before it begins
    return fn(*args, **kwargs)


def guarded(job: Callable[P, Job[R]]) -> Callable[P, Job[R]]:
    """``job`` that gives device memory back however it ends and never fails with a
    ``RuntimeError`` (napari's worker would take it for a deleted worker); torch's
    libraries are mapped before it begins (:func:`preload_torch_libraries`)."""

    @functools.wraps(job)
    def run(*args: P.args, **kwargs: P.kwargs) -> Job[R]:
        preload_torch_libraries()
        try:
            return (yield from job(*args, **kwargs))
        except RuntimeError as exc:
            raise JobError(str(exc)) from exc
        finally:
            release_memory()

    return run


# torch's own libraries, each after those it links to; names missing from an install
# (no CUDA, another platform's suffix) are skipped.
_TORCH_LIBRARIES = ("libgomp.so.1", "libc10.so", "libc10_cuda.so", "libtorch_cpu.so",
                    "libtorch_cuda.so", "libtorch.so", "libtorch_python.so")
_preload_lock = threading.Lock()
_preloaded = False


def preload_torch_libraries() -> None:
    """Map torch's shared libraries into the process with the GIL released, once.

    ``import torch`` loads ``torch._C``, whose ``dlopen`` maps and relocates
    hundreds of MB of libraries while holding the GIL: measured on 2 shared
    cores, a 280-400 ms stretch in which napari's main thread cannot run (the
    longest gap of the Predict a user clicks as the panel shows). ``dlopen``
    called through ctypes runs without the GIL, and the import then finds the
    libraries loaded (max gap 44-99 ms measured). ``RTLD_LOCAL``, as torch
    loads them itself: their symbols do not leak into other extensions.
    Linux only (elsewhere, and on any failure, the import does it as before);
    concurrent callers wait on a lock, which does not hold the GIL.
    """
    global _preloaded
    if _preloaded or "torch" in sys.modules or not sys.platform.startswith("linux"):
        return
    with _preload_lock:
        if _preloaded:
            return
        try:
            import ctypes
            import importlib.util

            spec = importlib.util.find_spec("torch")
            if spec is None or spec.origin is None:
                return
            folder = os.path.join(os.path.dirname(spec.origin), "lib")
            libc = ctypes.CDLL(None)  # a CDLL's calls release the GIL; a PyDLL's would not
            dlopen = libc.dlopen
            dlopen.restype, dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
            for name in _TORCH_LIBRARIES:
                path = os.path.join(folder, name)
                # The handle is kept open for good: torch's import reuses the mapping.
                if os.path.isfile(path) and not dlopen(path.encode(), os.RTLD_NOW | os.RTLD_LOCAL):
                    return  # torch's import will report what is wrong with it
        except (OSError, AttributeError, ValueError):  # no dlopen here: the import does it
            return
        finally:  # set last: a caller that came meanwhile waited on the lock, not on torch
            _preloaded = True


class _CoreForTheUi:
    """The process-wide torch thread count while computing jobs run, counted across jobs.

    ``torch.set_num_threads`` is process-wide. Measured on 2 shared cores:
    torch on both starved Qt and Xvfb (1.1 s stalls) and was slower too
    (oversubscribed). So the first computing job to begin (a run, a
    prediction, a package's test) leaves one core to the UI and the last to
    end gives it back: however the jobs overlap, none hands another every
    core, and none leaves the process a core short for good. Jobs that only
    save or read (the autosave, a checkpoint's channels) never touch it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._computing = 0
        self._before = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        import torch

        with self._lock:
            if self._computing == 0:
                self._before = torch.get_num_threads()
                torch.set_num_threads(max(1, min(self._before, (os.cpu_count() or 2) - 1)))
            self._computing += 1
        try:
            yield
        finally:
            with self._lock:
                self._computing -= 1
                if self._computing == 0:
                    torch.set_num_threads(self._before)


_core_for_the_ui = _CoreForTheUi()


def core_left_for_the_ui() -> AbstractContextManager[None]:
    """Run torch on all cores but one while this computing job runs (see ``_CoreForTheUi``)."""
    return _core_for_the_ui.held()


def release_memory() -> None:
    """Return cached accelerator memory to the driver (after a collection).

    Only when an accelerator holds memory: a full ``gc.collect()`` in a
    process with napari loaded holds the GIL for up to a second (measured:
    a 940 ms UI stall at the end of a CPU run), and on the CPU freed tensors
    go back at once by reference counting anyway.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.memory_reserved() > 0:
        gc.collect()
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        gc.collect()
        mps.empty_cache()


def with_progress(fn: Callable[[Callable[[int, int], None]], R], what: str) -> Job[R]:
    """Run ``fn(progress)`` in a helper thread and yield its ``progress(done, total)`` calls.

    ``predict_volume`` reports progress through a callback; a generator cannot
    yield from inside a callback, so the computation runs beside the
    generator and the progress crosses over a queue.
    """
    events: queue.Queue = queue.Queue()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = fn(lambda done, total: events.put((done, total)))
        except BaseException as exc:  # re-raised in the generator's thread
            outcome["error"] = exc
        finally:
            events.put(None)

    thread = threading.Thread(target=target, name=f"napari-finetune-{what}", daemon=True)
    thread.start()
    while (item := events.get()) is not None:
        yield Progress(item[0], item[1], what)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
