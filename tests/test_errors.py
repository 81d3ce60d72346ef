"""One reading of exceptions: the first line, "Type: line", out of memory or not."""

from __future__ import annotations

import torch

from napari_finetune.errors import RecoveryError, first_line, is_oom_error, one_line


def test_first_line_and_one_line():
    assert first_line(ValueError("  bad value\nsecond line")) == "bad value"
    assert first_line(KeyError()) == "KeyError"  # no text: the type's name
    assert one_line(RuntimeError("CUDA out of memory. Tried\nmore")) == (
        "RuntimeError: CUDA out of memory. Tried")
    assert one_line(RuntimeError()) == "RuntimeError"


def test_is_oom_error_reads_type_then_message():
    assert is_oom_error(torch.OutOfMemoryError("x")) and is_oom_error(MemoryError())
    assert is_oom_error(RuntimeError("CUDA error: out of memory"))
    assert not is_oom_error(RuntimeError("shape mismatch"))
    assert not is_oom_error(RecoveryError("out of memory with nothing left; CUDA out of memory"))
