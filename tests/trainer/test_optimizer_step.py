"""The optimizer step at the hardware's speed, all or nothing.

A CUDA run uses AdamW's fused kernel, which allocates nothing once its moments
exist: the step then needs no copy of the weights to be undone. The fused
kernel also runs on the CPU, so its path is tested here as it runs on a GPU.
"""

from __future__ import annotations

import pytest
import torch
from engine_setup import count_calls, make_trainer

from napari_finetune import testing
from napari_finetune.trainer import build as build_module
from napari_finetune.trainer import step as step_module
from napari_finetune.trainer.precision import Precision, total_squared_norm


def fused_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, fused=True)


def test_only_a_fused_optimizer_with_its_moments_cannot_allocate():
    weight = torch.nn.Parameter(torch.ones(4))
    default = torch.optim.AdamW([weight], lr=1e-2)
    fused = fused_adamw([torch.nn.Parameter(torch.ones(4))])
    assert step_module.step_can_allocate(default) and step_module.step_can_allocate(fused)
    for optimizer in (default, fused):
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.ones_like(p)
        optimizer.step()
    assert step_module.step_can_allocate(default)  # foreach: temporaries every step
    assert not step_module.step_can_allocate(fused)  # moments exist, one in-place kernel
    late = torch.nn.Parameter(torch.ones(2))
    fused.add_param_group({"params": [late]})  # a new group's moments are made next step
    assert step_module.step_can_allocate(fused)


def test_cuda_gets_the_fused_kernel_and_the_cpu_torchs_default():
    params = [torch.nn.Parameter(torch.ones(2))]
    assert build_module.adamw_implementation(torch.device("cuda"), params) == {"fused": True}
    assert build_module.adamw_implementation(torch.device("cuda", 0), params) == {"fused": True}
    assert build_module.adamw_implementation(torch.device("cpu"), params) == {}


def fused_trainer(monkeypatch, **overrides):
    # The CUDA choice, on the CPU (the fused kernel exists on both).
    monkeypatch.setattr(build_module, "adamw_implementation", lambda *_: {"fused": True})
    trainer = make_trainer(**overrides)
    trainer.build()
    assert trainer.optimizer.param_groups[0]["fused"] is True
    return trainer


def test_a_fused_run_copies_the_weights_for_the_first_step_only(monkeypatch):
    trainer = fused_trainer(monkeypatch, steps=4, batch_size=2)
    copies = []
    original = step_module.Undo.of
    monkeypatch.setattr(step_module.Undo, "of", lambda opt: copies.append(1) or original(opt))
    calls = count_calls(trainer.optimizer)
    events = list(trainer.run())
    assert events[-1].kind == "finished" and calls[0] == 4
    assert len(copies) == 1  # the first step makes the moments: guarded; then none


def test_a_default_run_copies_before_every_step(monkeypatch):
    trainer = make_trainer(steps=3, batch_size=2)
    trainer.build()
    copies = []
    original = step_module.Undo.of
    monkeypatch.setattr(step_module.Undo, "of", lambda opt: copies.append(1) or original(opt))
    list(trainer.run())
    assert len(copies) == 3


def test_an_oom_while_the_fused_moments_are_made_is_rolled_back(monkeypatch):
    """Half a step applied, then out of memory, in the one step that can allocate."""
    clean = fused_trainer(monkeypatch, steps=2, batch_size=1, accumulation=2)
    list(clean.run())
    faulty = fused_trainer(monkeypatch, steps=2, batch_size=2)
    fault = testing.oom_in_optimizer_step(faulty.optimizer, times=1, after=True)
    events = list(faulty.run())
    assert fault.count == 1 and [e.kind for e in events].count("recovery") == 1
    first = faulty.optimizer.param_groups[0]["params"][0]
    assert int(faulty.optimizer.state[first]["step"]) == 2
    for a, b in zip(clean.model.parameters(), faulty.model.parameters(), strict=True):
        assert torch.equal(a, b)  # applied once, bit for bit


def per_parameter_sum_of_squares(grads):
    """The check as it was written before the fused kernel (the oracle)."""
    return torch.stack([g.detach().float().square().sum() for g in grads]).sum()


def test_the_fused_norm_equals_the_per_parameter_sum():
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(shape, generator=gen) for shape in [(8, 4, 3, 3, 3), (8,), (2, 8)]]
    grads.append(torch.randn(5, generator=gen).half())
    assert torch.allclose(total_squared_norm(grads), per_parameter_sum_of_squares(grads),
                          rtol=1e-5)
    # bf16 garbage (norm ~1e35): finite values, yet the squared norm overflows fp32.
    garbage = grads + [torch.full((4,), 2.9e35)]
    assert not torch.isfinite(total_squared_norm(garbage))
    assert not torch.isfinite(per_parameter_sum_of_squares(garbage))
    for bad in (float("nan"), float("inf")):
        poisoned = [g.clone() for g in grads]
        poisoned[0][0, 0, 0, 0, 0] = bad
        assert not torch.isfinite(total_squared_norm(poisoned))


@pytest.mark.parametrize("value", [1.0, float("nan")])
def test_gradients_finite_reads_every_gradient(value):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[1].bias.grad.fill_(value)  # the last one
    assert Precision.gradients_finite(model) is (value == 1.0)
