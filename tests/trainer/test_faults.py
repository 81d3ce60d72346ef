"""The fault injectors themselves: MemoryBudget's accounting, hook thresholds."""

from __future__ import annotations

import pytest
import torch

from napari_finetune import testing as faults


def test_memory_budget_counts_live_storages_and_frees_them():
    with faults.MemoryBudget(10_000) as budget:
        a = torch.ones(1000)  # 4000 bytes
        assert budget.live_bytes == 4000
        view = a[:10].view(2, 5)  # a view allocates nothing
        a.add_(1)  # neither does an in-place update
        assert budget.live_bytes == 4000
        b = a * 2
        assert budget.live_bytes == 8000 and budget.peak_bytes == 8000
        del b
        assert budget.live_bytes == 4000
        with pytest.raises(torch.OutOfMemoryError, match="MemoryBudget"):
            torch.ones(2000)  # 8000 more bytes: over the budget
        assert budget.oom_count == 1 and budget.live_bytes == 4000
        del a, view
        assert budget.live_bytes == 0


def test_batch_threshold_hooks_fire_only_above_the_threshold():
    conv = torch.nn.Conv2d(1, 2, 3, padding=1)
    fault = faults.oom_above_batch(conv, 2)
    conv(torch.rand(2, 1, 4, 4))
    with pytest.raises(torch.OutOfMemoryError):
        conv(torch.rand(3, 1, 4, 4))
    fault.remove()
    conv(torch.rand(3, 1, 4, 4))
    backward = faults.oom_in_backward_above_batch(conv, 1, times=1)
    conv(torch.rand(1, 1, 4, 4)).sum().backward()
    out = conv(torch.rand(2, 1, 4, 4)).sum()  # the forward passes...
    with pytest.raises(torch.OutOfMemoryError):
        out.backward()  # ...the backward runs out of memory
    conv(torch.rand(2, 1, 4, 4)).sum().backward()  # times=1: only once
    assert backward.count == 1


def test_teacher_fault_wraps_its_forward_only_and_is_removed():
    from engine_setup import make_trainer

    trainer = make_trainer(steps=1, batch_size=2)
    trainer.build()
    x = torch.rand(2, 1, 4, 8, 8)
    fault = faults.oom_in_teacher(trainer, max_batch=1)
    trainer.model(x)  # the student's forward is not touched
    trainer.teacher(x[:1])
    with pytest.raises(torch.OutOfMemoryError, match="Teacher forward of a batch of 2"):
        trainer.teacher(x)
    fault.remove()
    assert trainer.teacher(x).shape[0] == 2 and fault.count == 1


def test_the_older_path_is_the_same_hooks():
    from napari_finetune.trainer import faults as older

    assert older.MemoryBudget is faults.MemoryBudget
    assert older.oom_in_teacher is faults.oom_in_teacher
