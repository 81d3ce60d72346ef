"""Precision, is_oom_error, the batch ladder and the precision probe."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import testing as faults
from napari_finetune.model.unet import UNet
from napari_finetune.trainer import precision as precision_module
from napari_finetune.trainer import recovery
from napari_finetune.trainer.oom_recovery import halve_micro_batch, recover_from_oom
from napari_finetune.trainer.recovery import (
    Precision,
    RecoveryError,
    is_oom_error,
    probe_precision,
)
from napari_finetune.trainer.run_state import RunState, TrainingParts
from napari_finetune.trainer.teacher import FrozenCopyTeacher


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("whatever"),
        torch.cuda.OutOfMemoryError("x"),
        MemoryError(),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be ..."),
        RuntimeError("HIP out of memory. Tried to allocate 20 MiB"),
        RuntimeError("XPU out of memory, please use `empty_cache`"),
        RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: can't allocate "
                     "memory: you tried to allocate 1000 bytes."),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate`"),
        # Raised by the CUDA caching allocator with expandable segments.
        RuntimeError("CUDA driver error: out of memory"),
    ],
)
def test_is_oom_error_recognises_allocator_failures(exc):
    assert is_oom_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
        ValueError("out of memory"),  # not an allocator error type
        RecoveryError("out of memory in step 3 with nothing left; CUDA out of memory"),
        KeyError("CUDA out of memory"),
        ValueError("CUDA driver error: out of memory"),  # a ValueError never counts
        ValueError("Expected input batch_size (4) to match target batch_size (2)"),
    ],
)
def test_is_oom_error_rejects_the_rest(exc):
    assert not is_oom_error(exc)


def test_precision_on_cpu_is_off_unless_cpu_bf16():
    off = Precision("cpu", enabled=True)
    assert off.describe() == "fp32 (no mixed precision on the CPU)"
    assert off.dtype_name == "float32"
    bf16 = Precision("cpu", enabled=True, cpu_bf16=True)
    assert bf16.describe() == "bf16"
    bf16.fall_back_to_fp32("it disagreed with fp32 in the probe")
    assert bf16.describe() == "fp32 (bf16 given up: it disagreed with fp32 in the probe)"
    assert bf16.fell_back and not bf16.enabled
    off = Precision("cpu", enabled=False, cpu_bf16=True)
    assert off.describe() == "fp32 (mixed precision off)"


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((9, 0), (torch.bfloat16, False)), ((8, 0), (torch.bfloat16, False)),
     ((8, 6), (torch.bfloat16, False)), ((7, 5), (torch.float16, True))],
)
def test_cuda_choice_follows_native_bf16(monkeypatch, capability, expected):
    """Native bf16 is capability 8.0 and up (torch's own no-emulation answer);
    an emulating card (7.5) gets fp16 with a GradScaler."""
    asked = []

    def get_device_capability(device=None):
        asked.append(device)
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    monkeypatch.setattr(torch.version, "hip", None)
    assert recovery.choose_precision(torch.device("cuda"), True) == expected
    assert asked and all(device == torch.device("cuda") for device in asked)
    assert recovery.choose_precision(torch.device("cuda"), False) == (None, False)
    assert recovery.choose_precision(torch.device("mps"), True) == (None, False)


def test_fp16_with_scaler_describes_itself(monkeypatch):
    monkeypatch.setattr(precision_module, "choose_precision", lambda *a: (torch.float16, True))
    p = Precision("cpu", enabled=True)
    assert p.describe() == "fp16 with loss scaling"
    assert p.grad_scaler and p.scaler is not None


def test_gradients_finite():
    model = torch.nn.Linear(3, 2)
    assert Precision.gradients_finite(model)  # no gradients yet
    model(torch.ones(1, 3)).sum().backward()
    assert Precision.gradients_finite(model)
    model.weight.grad[0, 0] = float("inf")
    assert not Precision.gradients_finite(model)
    model.weight.grad[0, 0] = float("nan")
    assert not Precision.gradients_finite(model)


def _state(batch, accumulation):
    state = RunState(batch, accumulation, batch * accumulation, 0.5, True, True, True)
    state.teacher = FrozenCopyTeacher(torch.nn.Linear(2, 2))
    state.steps_done = 6
    return state


def _parts():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainingParts(model, optimizer, Precision("cpu", False), torch.ones(2, dtype=bool), [])


def test_halve_micro_batch_keeps_samples_per_step():
    h = _state(8, 1)
    pairs = []
    while halve_micro_batch(h):
        pairs.append((h.batch_size, h.accumulation))
    assert pairs == [(4, 2), (2, 4), (1, 8)]
    odd = _state(5, 1)
    pairs = []
    while halve_micro_batch(odd):
        pairs.append((odd.batch_size, odd.accumulation))
    assert pairs == [(3, 2), (2, 3), (1, 5)]


def test_recover_from_oom_halves_then_drops_the_teacher_then_gives_up():
    h, parts = _state(2, 2), _parts()
    parts.model(torch.ones(1, 2)).sum().backward()
    assert recover_from_oom(h, parts)
    assert (h.batch_size, h.accumulation) == (1, 4)
    assert all(p.grad is None for p in parts.model.parameters())  # stale gradients cleared
    assert h.recovery_log[-1].startswith("out of memory at step 7: batch 2 → 1, accumulation 2 → 4")
    assert h.teacher is not None
    assert recover_from_oom(h, parts)
    assert h.teacher is None and h.distillation == 0.0 and not h.hold_other_channels
    assert h.dropped_at_step == 7
    assert h.distillation_switch == "dropped" and h.hold_switch == "dropped"
    assert not recover_from_oom(h, parts)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_probe_leaves_rng_batchnorm_gradients_and_weights_as_they_were(bf16):
    # 8 features at 16^3: at a 2x4x4 bottleneck (the tests' usual 4x8x8 patch and
    # smaller) CPU bf16 gives non-finite gradients in some runs, not in others.
    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=8, norm="batch")
    trainer = make_trainer(model=model, batch_size=4, patch_shape=(16, 16, 16),
                           mixed_precision=bf16, cpu_bf16=bf16)
    trainer.build()
    model = trainer.model
    model(torch.rand(2, 1, *trainer.config.patch_shape)).sum().backward()  # grads + BN stats
    grads = [p.grad.clone() for p in model.parameters()]
    weights = [p.detach().clone() for p in model.parameters()]
    bn = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_b" in k}
    assert bn
    # Proof that the probe ran the model: its forward passes, and under which autocast.
    passes: list[bool] = []
    model.register_forward_hook(lambda *_: passes.append(torch.is_autocast_enabled("cpu")))
    torch.manual_seed(123)
    np.random.seed(4)  # noqa: NPY002 - the legacy global state is what the probe must keep
    random.seed(5)
    sampler_state = trainer.sampler.get_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())  # noqa: NPY002
    torch.manual_seed(123)
    np.random.seed(4)  # noqa: NPY002
    random.seed(5)
    messages = probe_precision(trainer)
    assert messages[-1].startswith("precision probe passed")
    # fp32: one pass, nothing to compare; bf16: its own pass, then fp32's for the comparison.
    assert passes == ([True, False] if bf16 else [False])
    check = trainer.state.precision_check
    if bf16:
        assert check.agree and check.output_cosine >= 0.99 and check.verdict in messages[-1]
        assert trainer.precision.dtype_name == "bfloat16"
    else:
        assert check is None
    got = (torch.rand(3), np.random.rand(3), random.random())  # noqa: NPY002
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]
    assert trainer.sampler.get_state() == sampler_state
    for k, v in bn.items():
        assert torch.equal(model.state_dict()[k], v), k
    for p, g, w in zip(model.parameters(), grads, weights, strict=True):
        assert torch.equal(p.grad, g) and torch.equal(p, w)


def test_probe_compares_both_passes_with_the_same_random_draws():
    # Dropout in the model: the fp32 pass must draw the mixed pass's mask, or
    # the comparison would measure the dropout, not the precision.
    torch.manual_seed(0)
    base = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=8)
    model = torch.nn.Sequential(base, torch.nn.Dropout(0.5))
    trainer = make_trainer(model=model, batch_size=2, mixed_precision=True, cpu_bf16=True,
                           patch_shape=(16, 16, 16), mode="full")
    trainer.build()
    probe_precision(trainer)
    check = trainer.state.precision_check
    assert check is not None and check.agree and check.output_cosine > 0.999, check


def test_probe_halves_the_batch_on_oom():
    trainer = make_trainer(batch_size=8)
    trainer.build()
    fault = faults.oom_above_batch(trainer.model, 2)
    messages = probe_precision(trainer)
    assert fault.count == 2
    assert (trainer.batch_size, trainer.accumulation) == (2, 4)
    assert messages[0] == (
        "out of memory in the precision probe: batch 8 → 4, accumulation 1 → 2 (effective 8)"
    )


def test_probe_with_nothing_left_raises_a_clear_error():
    trainer = make_trainer(batch_size=2)
    trainer.build()
    faults.always_oom(trainer.model)
    with pytest.raises(RecoveryError) as info:
        probe_precision(trainer)
    text = str(info.value)
    assert "batch 2 → 1" in text and "dropped distillation" in text and "Tried" in text
