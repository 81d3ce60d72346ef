"""The CUDA stand-in refuses what torch refuses, and its figures behave like an allocator's.

The engine's CUDA code is tested against it in tests/trainer (autobatch, memory
information, precision, environment, snapshot).
"""

from __future__ import annotations

import pytest
import torch

from napari_finetune.testing import FakeCuda, MemoryBudget
from napari_finetune.trainer.memory_info import CudaMemory

GIB = 2**30
INDEXLESS = torch.device("cuda")


def test_the_fake_checks_arguments_as_torch_does():
    with FakeCuda(total_bytes=80 * GIB) as cuda:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        # torch wants an index here (and takes None as the current device).
        with pytest.raises(ValueError, match="with a specified index or an integer"):
            torch.cuda.get_per_process_memory_fraction(INDEXLESS)
        with pytest.raises(ValueError, match="with a specified index or an integer"):
            torch.cuda.set_per_process_memory_fraction(0.5, INDEXLESS)
        with pytest.raises(ValueError, match="with a specified index or an integer"):
            torch.cuda.set_device(INDEXLESS)
        assert torch.cuda.get_per_process_memory_fraction() == 1.0
        assert torch.cuda.get_per_process_memory_fraction(0) == 1.0
        with pytest.raises(TypeError, match="must be `float`"):
            torch.cuda.set_per_process_memory_fraction(1, 0)
        with pytest.raises(ValueError, match="Allowed range"):
            torch.cuda.set_per_process_memory_fraction(1.5, 0)
        # ... and takes the current device for an index-less one elsewhere.
        for query in (torch.cuda.mem_get_info, torch.cuda.memory_allocated,
                      torch.cuda.memory_reserved, torch.cuda.max_memory_allocated,
                      torch.cuda.reset_peak_memory_stats, torch.cuda.synchronize,
                      torch.cuda.get_device_capability, torch.cuda.get_device_properties):
            query(INDEXLESS)
            query("cuda:0")
        with pytest.raises(ValueError, match="Expected a cuda device"):
            torch.cuda.memory_allocated(torch.device("cpu"))
        with pytest.raises(AssertionError, match="Invalid device id"):
            torch.cuda.get_device_properties(1)
        assert ("mem_get_info", INDEXLESS) in cuda.calls
    assert torch.cuda.is_available() is False  # put back as it was (a CPU build)


def test_measured_peaks_follow_the_budget():
    with MemoryBudget(GIB) as budget, FakeCuda(total_bytes=8 * GIB, budget=budget):
        memory = CudaMemory(INDEXLESS)
        memory.start_measure()
        x = torch.ones(2**20)  # 4 MiB, counted by the budget
        del x
        assert memory.measured_peak() == 4 * 2**20
        memory.start_measure()
        assert memory.measured_peak() == 0
        torch.cuda.set_per_process_memory_fraction(0.5, 0)
        assert budget.budget_bytes == 4 * GIB  # the cap is enforced by the budget
