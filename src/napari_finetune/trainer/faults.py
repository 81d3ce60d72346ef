"""Fault injection under its older path; it lives in :mod:`napari_finetune.testing`."""

from napari_finetune.testing import (
    Fault,
    MemoryBudget,
    always_oom,
    nan_in_forward,
    oom_above_batch,
    oom_in_backward_above_batch,
    oom_in_optimizer_step,
    oom_in_teacher,
)

__all__ = [
    "Fault",
    "MemoryBudget",
    "always_oom",
    "nan_in_forward",
    "oom_above_batch",
    "oom_in_backward_above_batch",
    "oom_in_optimizer_step",
    "oom_in_teacher",
]
