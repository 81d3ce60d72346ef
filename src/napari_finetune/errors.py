"""What an exception says: its first line, and whether it means "out of memory".

Every place that turns an exception into one line of text (the CLI's error
line, the recovery log, a checkpoint that cannot be read) and every place that
steps down on an out-of-memory (the training ladder, the model probe, the
predictor's smaller blocks) asks here, so they read exceptions alike.

torch is imported only by :func:`is_oom_error`: the CLI's ``--help`` uses
:func:`first_line` without loading it.
"""

from __future__ import annotations

# Messages of allocator failures that arrive as a plain RuntimeError (older
# torch, other backends, cuDNN/cuBLAS failing to get their workspace).
OOM_MESSAGES = (
    "cuda out of memory",
    "cuda error: out of memory",
    # The caching allocator with expandable segments (cuMemCreate failing).
    "cuda driver error: out of memory",
    "hip out of memory",
    "hip error: out of memory",
    "xpu out of memory",
    "mps backend out of memory",
    "defaultcpuallocator: can't allocate memory",
    "defaultcpuallocator: not enough memory",
    "cudnn_status_not_supported",
    "cudnn error: cudnn_status_not_supported",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
)


class RecoveryError(RuntimeError):
    """Out of memory with nothing left to give up; the message lists what was tried."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """``"TypeName: first line"`` (the type's name alone when the message is empty)."""
    name = type(exc).__name__
    line = first_line(exc)
    return name if line == name else f"{name}: {line}"


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the device ran out of memory.

    By type first (``torch.OutOfMemoryError``, Python's ``MemoryError``), then by
    the allocator messages of CUDA, HIP, XPU, MPS and the CPU, and the cuDNN /
    cuBLAS failures that mean "no workspace memory". A :class:`RecoveryError`
    (the ladder already gave up) is not one to step down on again.
    """
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, (oom_type, MemoryError)):
        return True
    if not isinstance(exc, RuntimeError) or isinstance(exc, RecoveryError):
        return False
    text = str(exc).lower()
    return any(pattern in text for pattern in OOM_MESSAGES)
