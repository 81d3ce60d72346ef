"""Finite-garbage gradients, gradient clipping and the one GradScaler code path."""

from __future__ import annotations

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.config import FinetuneConfig
from napari_finetune.trainer import precision as precision_module
from napari_finetune.trainer.recovery import Precision


def test_finite_but_huge_gradients_do_not_pass():
    """CPU bf16 at a tiny bottleneck measured gradients of 2.9e35: finite, and garbage."""
    model = torch.nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()
    assert Precision.gradients_finite(model)
    model.weight.grad[0, 0] = 2.9e35
    assert torch.isfinite(model.weight.grad).all()
    assert not Precision.gradients_finite(model)  # the fp32 total norm overflows


def test_a_bf16_run_with_exploding_gradients_falls_back_to_fp32():
    trainer = make_trainer(steps=2, batch_size=2, mixed_precision=True, cpu_bf16=True)
    trainer.build()
    assert trainer.precision.dtype_name == "bfloat16"
    weight = next(trainer.model.parameters())
    # Explode the gradients only under mixed precision, as a bf16 overflow does.
    weight.register_hook(lambda g: g * 1e34 if trainer.precision.enabled else g)
    events = list(trainer.run())
    assert trainer.precision.dtype_name == "float32" and trainer.steps_done == 2
    assert any("fp32" in e.message for e in events if e.kind in ("probe", "recovery"))
    state = trainer.optimizer.state[weight]
    assert torch.isfinite(state["exp_avg_sq"]).all()
    assert float(state["exp_avg_sq"].max()) < 1e3


def test_max_grad_norm_is_off_by_default_and_validated():
    assert FinetuneConfig().max_grad_norm is None
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_grad_norm"):
            FinetuneConfig(max_grad_norm=bad)


def _norms_at_step(trainer) -> list[float]:
    """Total gradient norm seen by every ``optimizer.step`` call."""
    norms = []
    inner = trainer.optimizer.step

    def step(*args, **kwargs):
        grads = [p.grad for g in trainer.optimizer.param_groups for p in g["params"]]
        norms.append(float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads if g is not None]))))
        return inner(*args, **kwargs)

    trainer.optimizer.step = step
    return norms


def test_max_grad_norm_clips_the_update():
    free = make_trainer(steps=2, batch_size=2)
    free.build()
    free_norms = _norms_at_step(free)
    list(free.run())
    clipped = make_trainer(steps=2, batch_size=2, max_grad_norm=1e-3)
    clipped.build()
    clipped_norms = _norms_at_step(clipped)
    list(clipped.run())
    assert min(free_norms) > 1e-2  # clipping has something to do
    assert clipped_norms == pytest.approx([1e-3, 1e-3], rel=1e-3)


def test_fp16_gradients_are_unscaled_before_clipping(monkeypatch):
    """Clipping the scaled gradients would leave them 1/scale too small after unscaling."""
    monkeypatch.setattr(precision_module, "choose_precision", lambda *a: (torch.float16, True))
    trainer = make_trainer(steps=2, batch_size=2, mixed_precision=True, max_grad_norm=1e-3)
    trainer.build()
    assert trainer.precision.grad_scaler
    norms = _norms_at_step(trainer)
    list(trainer.run())
    assert norms and norms == pytest.approx([1e-3] * len(norms), rel=1e-2)


def test_one_grad_scaler_code_path():
    """Always a torch.amp.GradScaler, enabled only for fp16."""
    fp32 = Precision("cpu", enabled=False)
    assert isinstance(fp32.scaler, torch.amp.GradScaler) and not fp32.scaler.is_enabled()
    assert not fp32.grad_scaler


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((9, 0), (torch.bfloat16, False)), ((8, 0), (torch.bfloat16, False)),
     ((8, 6), (torch.bfloat16, False)), ((7, 5), (torch.float16, True)),
     ((6, 1), (torch.float16, True))],
)
def test_cuda_precision_of_an_indexless_device(capability, expected):
    """bf16 from compute capability 8.0 on (native), else fp16 + scaler (emulated bf16
    never counts); asked of the current device for an index-less one."""
    from napari_finetune.testing import FakeCuda

    with FakeCuda(capability=capability) as cuda:
        assert precision_module.choose_precision(torch.device("cuda"), True) == expected
        assert Precision(torch.device("cuda"), True).dtype_name == {
            torch.bfloat16: "bfloat16", torch.float16: "float16"}[expected[0]]
    assert ("get_device_properties", torch.device("cuda")) in cuda.calls


@pytest.mark.parametrize(
    ("capabilities", "run_on", "expected"),
    [([(7, 5), (9, 0)], 1, (torch.bfloat16, False)),  # current: the old card
     ([(9, 0), (7, 5)], 1, (torch.float16, True))],   # current: the new card
)
def test_cuda_precision_is_the_run_devices(capabilities, run_on, expected):
    """A host with mixed cards: the answer is for the run's GPU, not the current one."""
    from napari_finetune.testing import FakeCuda

    with FakeCuda(capability=capabilities, device_count=2) as cuda:
        assert torch.cuda.current_device() == 0
        device = torch.device("cuda", run_on)
        assert precision_module.choose_precision(device, True) == expected
        assert ("get_device_properties", device) in cuda.calls


def test_cuda_bf16_on_rocm(monkeypatch):
    """ROCm GPUs have bf16 (torch's own answer, whatever the gfx 'capability')."""
    from napari_finetune.testing import FakeCuda

    monkeypatch.setattr(torch.version, "hip", "6.2")
    with FakeCuda(capability=(7, 5)):
        assert precision_module.choose_precision(torch.device("cuda:0"), True) == (
            torch.bfloat16, False)
