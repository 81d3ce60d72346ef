"""What counts as running out of memory, and the line kept of it.

Kept apart from :mod:`recovery` so the step (which agrees on out-of-memory
across ranks) and the recovery (which acts on it) share one definition.
"""

from __future__ import annotations

import torch

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


class StepOutOfMemory(torch.OutOfMemoryError):
    """An attempt ran out of memory here or on another rank; ``line`` says where.

    Raised outside the ``except`` block that caught the original error, so its
    traceback holds none of the failed attempt's tensors.
    """

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the device ran out of memory.

    By type first (``torch.OutOfMemoryError``, Python's ``MemoryError``), then by
    the allocator messages of CUDA, HIP, XPU, MPS and the CPU, and the cuDNN /
    cuBLAS failures that mean "no workspace memory".
    """
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, (oom_type, MemoryError)):
        return True
    if not isinstance(exc, RuntimeError) or isinstance(exc, RecoveryError):
        return False
    text = str(exc).lower()
    return any(pattern in text for pattern in OOM_MESSAGES)


def oom_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``: all of a failure that is kept.

    The exception itself is not kept: its traceback holds the failed attempt's
    activations.
    """
    if isinstance(exc, StepOutOfMemory):  # an agreed failure carries its line already
        return exc.line
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
