"""Test hooks: faults on demand and a stand-in for CUDA, on a machine without a GPU.

* :mod:`~napari_finetune.testing.faults`: out-of-memory, non-finite values and
  finite but wrong values under autocast injected into a run,
  :class:`MemoryBudget` (a small GPU's allocator played by a dispatch mode)
  and the widget's :data:`build_hooks`;
* :mod:`~napari_finetune.testing.cuda`: :class:`FakeCuda`, ``torch.cuda``'s
  memory and device queries answered for a device that is not there, with
  torch's own argument checks, so a call that would fail on a real GPU fails
  here too; :mod:`~napari_finetune.testing.cuda_matrix`: one table of
  ``torch.cuda`` calls and torch 2.13's answers, run against the fake here and
  against the real module on a GPU;
* :mod:`~napari_finetune.testing.host_reads`: ``HostReads``, a count of
  the host reads of device values (device syncs on a GPU), made on the CPU.

Used by the tests, the benchmarks and the widget test (through
``Finetuner.after_build``, so the faults land on the built trainer), and by
anyone writing fault tests of their own: the one home of every test hook. No
production module imports it (the layers contract in pyproject.toml).
"""

from napari_finetune.testing.cuda import FakeCuda, FakeDeviceProperties
from napari_finetune.testing.faults import (
    BuildHooks,
    Fault,
    MemoryBudget,
    always_oom,
    build_hooks,
    nan_in_forward,
    oom_above_batch,
    oom_in_backward_above_batch,
    oom_in_optimizer_step,
    oom_in_teacher,
    wrong_under_autocast,
)

__all__ = [
    "BuildHooks",
    "FakeCuda",
    "FakeDeviceProperties",
    "Fault",
    "MemoryBudget",
    "always_oom",
    "build_hooks",
    "nan_in_forward",
    "oom_above_batch",
    "oom_in_backward_above_batch",
    "oom_in_optimizer_step",
    "oom_in_teacher",
    "wrong_under_autocast",
]
