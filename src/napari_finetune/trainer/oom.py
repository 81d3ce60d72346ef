"""An out-of-memory that every rank agreed on, and the line kept of a failure.

What counts as running out of memory is :func:`napari_finetune.errors.is_oom_error`;
this module adds what the step (which agrees on out-of-memory across ranks) and
the recovery (which acts on it) share beyond that.
"""

from __future__ import annotations

import torch

from napari_finetune.errors import one_line


class StepOutOfMemory(torch.OutOfMemoryError):
    """An attempt ran out of memory here or on another rank; ``line`` says where.

    Raised outside the ``except`` block that caught the original error, so its
    traceback holds none of the failed attempt's tensors.
    """

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def oom_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``: all of a failure that is kept.

    The exception itself is not kept: its traceback holds the failed attempt's
    activations.
    """
    if isinstance(exc, StepOutOfMemory):  # an agreed failure carries its line already
        return exc.line
    return one_line(exc)
