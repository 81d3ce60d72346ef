"""The worker process tuned for training while the fine-tune task runs, then put back.

A dask nanny starts its worker with ``OMP_NUM_THREADS=1`` and
``MALLOC_TRIM_THRESHOLD_=65536`` (``distributed.nanny.pre-spawn-environ``): right
for many small tasks on many threads, wrong for one training task. Measured in a
worker process on a 2-core machine (8 steps of a small 3-D conv net, 1 torch
thread): 2.4 s as the nanny leaves it, 1.5 s with glibc's allocator thresholds
raised, 1.7 s in a plain process. Setting the trim threshold fixes glibc's mmap
threshold at 128 KiB, so every activation and gradient buffer is mmap'ed,
page-faulted in and unmapped again at every step. And one torch thread leaves the
other CPUs of the process idle.

:func:`training_process` therefore, for the task's duration only, gives torch
the CPUs this process may use divided among the worker's task threads, and
raises the allocator's mmap and trim thresholds; afterwards it restores torch's
thread count and the thresholds the environment asked for, so the worker's
other tasks run as the admin configured them.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# glibc's own defaults, and the largest mmap threshold its dynamic rule reaches on
# 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): what an unconfigured process converges to.
GLIBC_DEFAULT_THRESHOLD = 128 * 1024
TRAINING_MMAP_THRESHOLD = 32 * 1024 * 1024
TRAINING_TRIM_THRESHOLD = 2 * TRAINING_MMAP_THRESHOLD  # as glibc's dynamic rule pairs them


@dataclass(frozen=True)
class ProcessTuning:
    """What the training task ran with on the worker.

    Attributes
    ----------
    threads : int
        torch's intra-op threads during the run.
    cpus : int
        CPUs this process may run on (its affinity).
    task_threads : int
        The worker's task threads, among which the CPUs are shared.
    allocator : bool
        Whether glibc's allocator thresholds were raised for the run.
    """

    threads: int
    cpus: int
    task_threads: int
    allocator: bool


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS says; else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity call
        return os.cpu_count() or 1


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None on another C library."""
    try:
        return getattr(ctypes.CDLL(None), "mallopt", None)
    except OSError:
        return None


def _environment_threshold(name: str) -> int:
    """The threshold the process's environment set (glibc read it at start), or glibc's default."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return GLIBC_DEFAULT_THRESHOLD


@contextmanager
def training_process(task_threads: int) -> Iterator[ProcessTuning]:
    """This process set for one training task among ``task_threads``, restored on exit.

    Parameters
    ----------
    task_threads : int
        The worker's task threads: the CPUs are divided among them, so a worker
        that runs other tasks beside the training is not oversubscribed.

    Yields
    ------
    ProcessTuning
        The thread count and allocator setting the run trains with.
    """
    import torch

    cpus = usable_cpus()
    threads = max(1, cpus // max(1, task_threads))
    before = torch.get_num_threads()
    mallopt = _mallopt()
    raised = bool(
        mallopt is not None
        and mallopt(M_MMAP_THRESHOLD, TRAINING_MMAP_THRESHOLD)
        and mallopt(M_TRIM_THRESHOLD, TRAINING_TRIM_THRESHOLD)
    )
    torch.set_num_threads(threads)
    try:
        yield ProcessTuning(threads, cpus, max(1, task_threads), raised)
    finally:
        torch.set_num_threads(before)
        if raised and mallopt is not None:
            mallopt(M_MMAP_THRESHOLD, _environment_threshold("MALLOC_MMAP_THRESHOLD_"))
            mallopt(M_TRIM_THRESHOLD, _environment_threshold("MALLOC_TRIM_THRESHOLD_"))


__all__ = ["ProcessTuning", "training_process", "usable_cpus"]
