"""The CUDA stand-in refuses what torch refuses, and its figures behave like an allocator's.

The engine's CUDA code is tested against it in tests/trainer (autobatch, memory
information, precision, environment, snapshot).
"""

from __future__ import annotations

import pytest
import torch

from napari_finetune.testing import FakeCuda, MemoryBudget
from napari_finetune.testing.cuda_matrix import CASES, run_matrix
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU build's torch.cuda only")
def test_the_fake_puts_torch_back():
    with FakeCuda():
        assert torch.cuda.is_available()
    assert torch.cuda.is_available() is False  # as it was: a CPU build has no CUDA


@pytest.mark.parametrize("initialized", [False, True])
@pytest.mark.parametrize("device_count", [1, 2])
def test_the_fake_answers_the_matrix_as_torch(initialized, device_count):
    """The table a GPU run checks real torch.cuda against, answered by the fake."""
    with FakeCuda(initialized=initialized, device_count=device_count):
        rows = run_matrix(torch.cuda)
    assert len(rows) == len(CASES) - (0 if not initialized else sum(c.before_init for c in CASES))
    assert [row for row in rows if not row.ok] == []


def test_the_matrix_sees_a_fake_that_answers_otherwise(monkeypatch):
    """The matrix can fail: the old fake's answers are caught, row by row."""
    with FakeCuda(initialized=False, device_count=2) as cuda:
        # The old fake: a bool refused, set_device(-1) refused, statistics before init.
        def old_index(device, optional):
            if isinstance(device, bool):
                raise ValueError("Expected a torch.device or an integer")
            index = FakeCuda._index(cuda, device, optional)
            if not 0 <= index < cuda.count:
                raise AssertionError("Invalid device id")
            return index

        monkeypatch.setattr(cuda, "_index", old_index)
        monkeypatch.setattr(cuda, "initialized", True)
        failed = {(row.function, row.argument) for row in run_matrix(torch.cuda) if not row.ok}
    assert ("set_device", "-1 (a no-op)") in failed
    assert ("get_device_capability", "False (a bool is an int: device 0)") in failed
    assert ("memory_allocated", "an index out of range") in failed


def test_a_fresh_process_starts_cuda_only_where_torch_does():
    with FakeCuda(initialized=False) as cuda:
        assert torch.cuda.memory_allocated(0) == 0 and not torch.cuda.is_initialized()
        with pytest.raises(RuntimeError, match="did you call init"):
            torch.cuda.reset_peak_memory_stats(0)
        torch.cuda.reset_peak_memory_stats()  # asks for the current device: starts CUDA
        assert cuda.initialized and torch.cuda.is_initialized()


def test_events_and_streams_record_their_device():
    with FakeCuda(device_count=2) as cuda:
        torch.cuda.Event().record()
        torch.cuda.set_device(1)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(0))
        event.synchronize()
    assert cuda.recorded == [torch.device("cuda", 0), torch.device("cuda", 0)]
    assert event.synchronized


def test_tensors_on_host_stay_on_the_cpu():
    with FakeCuda(device_count=2, tensors_on_host=True) as cuda:
        x = torch.ones(3).pin_memory().to("cuda:1", non_blocking=True)
        host = torch.empty((3,), pin_memory=True)
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            x.to("cuda:2")
    assert x.device.type == "cpu" and host.device.type == "cpu"
    assert cuda.moves == [torch.device("cuda", 1)]


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
