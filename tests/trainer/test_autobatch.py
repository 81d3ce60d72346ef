"""Autobatch: the micro-batch chosen from a measured memory profile, MemoryBudget as device."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import testing
from napari_finetune.trainer.autobatch import (
    autobatch,
    choose_batch,
    fit_line,
    pending_optimizer_bytes,
    profile_sizes,
)

# Measured on this set-up (depth-2, 4-feature UNet, 4x8x8 patches, teacher on):
# ~19 KiB + ~84 KiB per sample, AdamW's moments ~192 KiB. A budget of 1 MB
# fits 0.8 * 1 MB - 192 KiB = ~6.8 samples by the fit.
BUDGET = 1_000_000


def run_all(trainer):
    return list(trainer.run())


def test_profile_sizes_and_the_balanced_choice():
    assert profile_sizes(16) == [1, 2, 4, 8, 16]
    assert profile_sizes(12, smallest=2) == [2, 4, 8, 12]
    assert profile_sizes(1) == [1]
    # 64 per step, the fit allows 9: eight micro-batches of 8, not 9+9+...+1.
    assert choose_batch(0.0, 1.0, 9.5, 64) == (8, 8)
    assert choose_batch(0.0, 1.0, 100.0, 64) == (64, 1)
    assert choose_batch(0.0, 1.0, 0.5, 64) == (1, 64)  # nothing fits: the smallest
    assert choose_batch(0.0, 1.0, 0.5, 64, smallest=2) == (2, 32)
    assert choose_batch(0.0, 1.0, 100.0, 64, ceiling=3) == (3, 22)


def test_fit_rejects_nonsense():
    assert fit_line([(1, 10), (2, 20), (4, 40)]) == pytest.approx((0.0, 10.0), abs=1e-6)
    assert "fewer than 2" in fit_line([(1, 10)])
    assert "measured less memory" in fit_line([(1, 10), (2, 30), (4, 20)])
    assert "not positive" in fit_line([(1, 10), (2, 10), (4, 10)])


def test_autobatch_under_a_memory_budget_runs_without_any_oom():
    trainer = make_trainer(steps=3, batch_size=16, autobatch=True)
    trainer.build()
    with testing.MemoryBudget(BUDGET) as budget:
        trainer.memory_info = budget
        events = run_all(trainer)
    decision = trainer.autobatch_decision
    assert decision.applied and decision.per_sample_bytes > 0
    assert [size for size, _ in decision.points][:2] == [1, 2]
    assert 1 < trainer.batch_size < 16
    # The prediction of the chosen micro-batch stays under the planned share.
    planned = 0.8 * decision.free_bytes - decision.reserved_bytes
    assert decision.intercept_bytes + decision.per_sample_bytes * trainer.batch_size <= planned
    assert budget.oom_count == 0
    assert events[-1].kind == "finished" and trainer.steps_done == 3
    assert all(e.effective_batch == 16 for e in events)
    line = next(e.message for e in events if e.message.startswith("autobatch:"))
    assert line.startswith(
        f"autobatch: micro-batch {trainer.batch_size} × accumulation {trainer.accumulation} "
        "(16 per step): "
    )
    assert "/sample measured at batch 1, 2" in line and "free × 0.8" in line
    assert "(MemoryBudget)" in line


def test_without_autobatch_the_same_budget_costs_oom_events():
    trainer = make_trainer(steps=3, batch_size=16, autobatch=False)
    trainer.build()
    with testing.MemoryBudget(BUDGET) as budget:
        trainer.memory_info = budget
        run_all(trainer)
    assert budget.oom_count >= 1 and trainer.autobatch_decision is None


def test_a_smaller_memory_fraction_picks_a_smaller_batch():
    batches = []
    for fraction in (0.9, 0.5):
        trainer = make_trainer(steps=1, batch_size=16, autobatch=True, memory_fraction=fraction)
        trainer.build()
        with testing.MemoryBudget(BUDGET) as budget:
            trainer.memory_info = budget
            run_all(trainer)
        batches.append(trainer.batch_size)
    assert batches[0] > batches[1]


def test_autobatch_leaves_rng_batchnorm_gradients_and_weights_as_they_were():
    trainer = make_trainer(norm="batch", batch_size=8, autobatch=True)
    trainer.build()
    model = trainer.model
    model(torch.rand(2, 1, *trainer.config.patch_shape)).sum().backward()  # grads + BN stats
    grads = [p.grad.clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert any("running" in k for k in state)
    torch.manual_seed(7)
    np.random.seed(8)  # noqa: NPY002 - the legacy global state is what must be kept
    random.seed(9)
    sampler_state = trainer.sampler.get_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(8)  # noqa: NPY002
    random.seed(9)
    with testing.MemoryBudget(10**9) as budget:
        decision = autobatch(
            trainer.state, trainer.parts, trainer.sampler, trainer.config.memory_fraction, budget
        )
    assert decision.applied and len(decision.points) == 4  # 1, 2, 4, 8
    got = (torch.rand(3), np.random.rand(3), random.random())  # noqa: NPY002
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]
    assert trainer.sampler.get_state() == sampler_state
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key  # weights and BatchNorm statistics
    for p, g in zip(model.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)


class FakeMemory:
    """A provider whose peaks are given: what a confused allocator might report."""

    name = "fake"

    def __init__(self, peaks, free=10**9):
        self.peaks = list(peaks)
        self.free = free
        self.measured = 0

    def free_bytes(self):
        return self.free

    def start_measure(self):
        pass

    def observe(self):
        pass

    def measured_peak(self):
        self.measured += 1
        return self.peaks.pop(0)


def test_a_nonsense_profile_keeps_the_configured_batch():
    trainer = make_trainer(batch_size=4, accumulation=2, autobatch=True)
    trainer.build()
    memory = FakeMemory([1000, 3000, 2000, 4000])  # batch 4 measured below batch 2
    decision = autobatch(
        trainer.state, trainer.parts, trainer.sampler, trainer.config.memory_fraction, memory
    )
    assert not decision.applied
    assert (trainer.batch_size, trainer.accumulation) == (4, 2)
    assert decision.message.startswith(
        "autobatch: keeping micro-batch 4 × accumulation 2 (8 per step): a larger micro-batch"
    )


def test_an_oom_at_a_profile_point_ends_the_profile_and_caps_the_choice():
    trainer = make_trainer(batch_size=16, autobatch=True)
    trainer.build()
    fault = testing.oom_above_batch(trainer.model, 4)  # batch 8 fails, the fit says 16 fits
    with testing.MemoryBudget(10**9) as budget:
        decision = autobatch(
            trainer.state, trainer.parts, trainer.sampler, trainer.config.memory_fraction, budget
        )
    assert fault.count == 1
    assert [size for size, _ in decision.points] == [1, 2, 4]
    assert decision.applied and trainer.batch_size <= 7
    assert trainer.batch_size * trainer.accumulation >= 16
    assert "batch 8 ran out of memory in the profile" in decision.message


def test_the_profile_stops_before_a_size_the_fit_says_cannot_fit():
    trainer = make_trainer(batch_size=64, autobatch=True)
    trainer.build()
    # Free memory such that 0.8 x free less the optimizer state AdamW's first step will
    # take leaves 750 B: 100 B/sample predicts 800 B at batch 8, which is not tried.
    reserved = pending_optimizer_bytes(trainer.parts.optimizer)
    memory = FakeMemory([100, 200, 400, 800, 1600, 3200, 6400],
                        free=math.ceil((reserved + 750) / 0.8))
    decision = autobatch(
        trainer.state, trainer.parts, trainer.sampler, trainer.config.memory_fraction, memory
    )
    assert memory.measured == 3 and [size for size, _ in decision.points] == [1, 2, 4]
    # floor(750 / 100) = 7 samples fit: 64 in the fewest micro-batches of at most 7.
    assert decision.applied and (trainer.batch_size, trainer.accumulation) == (7, 10)


def test_cpu_runs_without_autobatch_by_default_and_say_why_when_asked():
    trainer = make_trainer(steps=1, batch_size=4)
    events = run_all(trainer)
    assert trainer.autobatch_decision is None
    assert not any("autobatch" in e.message for e in events)
    trainer = make_trainer(steps=1, batch_size=4, autobatch=True)
    events = run_all(trainer)
    assert not trainer.autobatch_decision.applied
    assert any(
        e.message == "autobatch: keeping micro-batch 4 × accumulation 1 (4 per step): "
        "cpu gives no device memory figures to plan with" for e in events
    )


def test_autobatch_measures_again_after_a_fall_back_to_fp32():
    trainer = make_trainer(
        steps=1, batch_size=4, autobatch=True, mixed_precision=True, cpu_bf16=True
    )
    trainer.build()
    testing.nan_in_forward(trainer.model.head)
    with testing.MemoryBudget(10**9) as budget:
        trainer.memory_info = budget
        events = run_all(trainer)
    kinds = [(e.kind, e.message.split(":")[0]) for e in events if e.kind == "probe"]
    assert kinds[0] == ("probe", "autobatch") and kinds[-1] == ("probe", "autobatch")
    assert events[-1].dtype == "float32" and events[-1].kind == "finished"


def test_the_record_keeps_the_decision(tmp_path):
    from napari_finetune.model.checkpoint import load_checkpoint

    trainer = make_trainer(steps=1, batch_size=8, autobatch=True)
    trainer.build()
    with testing.MemoryBudget(BUDGET) as budget:
        trainer.memory_info = budget
        run_all(trainer)
    run = load_checkpoint(trainer.export(tmp_path / "a.pt")).metadata["run"]
    assert run["memory"]["autobatch"]["applied"] is True
    assert run["memory"]["autobatch"]["batch_size"] == trainer.batch_size
    assert run["samples_per_step"] == 8


def test_cuda_free_memory_of_an_indexless_device_under_a_per_process_cap():
    """CUDA's figures for the device as the trainer builds it, ``torch.device("cuda")``.

    Every default CUDA run crashed here: the per-process cap was asked with a
    device torch refuses there (it wants an index). The stand-in checks the
    arguments as torch does.
    """
    from napari_finetune.trainer.memory_info import CudaMemory, format_bytes, memory_info_for

    gib = 2**30
    with testing.FakeCuda(total_bytes=80 * gib, allocated=2 * gib, reserved=3 * gib,
                          used_elsewhere=67 * gib) as cuda:
        memory = memory_info_for(torch.device("cuda"))
        assert isinstance(memory, CudaMemory)
        assert memory.free_bytes() == 11 * gib  # 10 free on the device + 1 cached
        torch.cuda.set_per_process_memory_fraction(0.1, 0)
        assert memory.free_bytes() == 6 * gib  # a cap of 8 GiB, 2 of them allocated
        memory.start_measure()
        assert memory.measured_peak() == 0
    asked = [device for name, device in cuda.calls if name == "get_per_process_memory_fraction"]
    assert asked and all(isinstance(device, int) for device in asked)
    assert format_bytes(11.2 * gib) == "11.20 GiB" and format_bytes(0.41 * gib, gib) == "0.41 GiB"


def test_autobatch_plans_against_cuda_on_an_indexless_device():
    """The memory-aware start with CUDA's own queries (faked, backed by a budget)."""
    from napari_finetune.trainer.memory_info import memory_info_for

    trainer = make_trainer(steps=2, batch_size=8, autobatch=True)
    trainer.build()
    with testing.MemoryBudget(10**9) as budget, testing.FakeCuda(4 * 10**9, budget=budget):
        torch.cuda.set_per_process_memory_fraction(0.25, 0)  # the budget's 1 GB
        trainer.memory_info = memory_info_for(torch.device("cuda"))
        events = list(trainer.run())
    decisions = [e.message for e in events if e.message.startswith("autobatch:")]
    assert decisions and events[-1].kind == "finished", [e.message for e in events]
    assert trainer.steps_done == 2 and all(e.effective_batch == 8 for e in events)
    assert budget.oom_count == 0
    # What it chose, against the per-process cap (1 GB of the 4 GB device), not the device.
    decision = trainer.autobatch_decision
    assert decision.applied, decision.message
    assert 0.99 * 10**9 < decision.free_bytes <= 10**9  # the cap less this tiny model
    assert [size for size, _ in decision.points] == [1, 2, 4, 8]  # each predicted to fit
    a, b = decision.intercept_bytes, decision.per_sample_bytes
    planned = decision.memory_fraction * decision.free_bytes - decision.reserved_bytes
    # The largest micro-batch whose planned peak fits: the whole step of 8, in one go.
    assert a + b * 8 <= planned
    assert (decision.batch_size, decision.accumulation) == choose_batch(a, b, planned, 8)
    assert (trainer.batch_size, trainer.accumulation) == (8, 1)
    assert decisions[0].startswith("autobatch: micro-batch 8 × accumulation 1 (8 per step): ")
    assert decisions[0].endswith("(CUDA)")


@pytest.mark.parametrize("when", ["probe", "step"])
def test_freeing_the_teacher_grows_the_micro_batch_into_the_memory_it_gave_back(when):
    trainer = make_trainer(steps=3, batch_size=8, autobatch=True)
    trainer.build()
    calls = []
    original = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    events = []
    with testing.MemoryBudget(10**9) as budget:
        trainer.memory_info = budget
        if when == "probe":  # the teacher never fits, from the profile on
            testing.oom_in_teacher(trainer)
        for event in trainer.run():
            events.append(event)
            if when == "step" and event.message.startswith("precision probe passed"):
                testing.oom_in_teacher(trainer)  # from step 1 on
    decisions = [e for e in events if e.message.startswith("autobatch:")]
    dropped = next(i for i, e in enumerate(events) if "freed the teacher" in e.message)
    grown = decisions[-1]
    assert events[dropped].batch_size == 1 and events.index(grown) > dropped
    assert grown.distillation == "dropped" and grown.batch_size == 8
    assert trainer.batch_size == 8  # the whole step in one micro-batch again
    assert len(calls) == 3 and events[-1].kind == "finished"
    assert all(e.effective_batch == 8 for e in events)
