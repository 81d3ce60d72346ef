"""The older path of the test hooks, for outside checks that still import it.

Everything lives in :mod:`napari_finetune.testing`; import it from there. No
module of the package imports this one (the layers contract names it as the
one import of ``testing`` from below).
"""

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
