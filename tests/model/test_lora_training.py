"""LoRA that trains what a new microscope needs and leaves the starting model alone.

Cheap guards of issue 12's LoRA regression (LoRA reached 50 % of a dense upper
bound on an unseen appearance and made mitochondria worse than before): step 0
is the base model, a few steps lower the loss on painted voxels, the
normalisation layers and the output head's bias train, and the base model
(weights and BatchNorm running statistics, i.e. the LoRA teacher) is unchanged.
"""

from __future__ import annotations

import copy

import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.lora import (
    base_model,
    lora_advice,
    merged_copy,
    trained_norms,
    wrap_lora,
)
from napari_finetune.model.unet import UNet


def _painted_problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tiny volume, a target per channel and the painted voxels (a few percent)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(2, 1, 8, 16, 16, generator=gen)
    target = (x > 0.6).float().expand(-1, 2, -1, -1, -1).clone()
    target[:, 1] = 1 - target[:, 1]
    painted = torch.rand(2, 1, 8, 16, 16, generator=gen) < 0.05
    return x, target, painted.expand_as(target)


def _painted_loss(model: torch.nn.Module, x, target, painted) -> torch.Tensor:
    logits = model(x)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits[painted], target[painted])


def test_lora_trains_norms_and_head_bias_and_leaves_the_base_model_alone():
    torch.manual_seed(0)
    model = UNet(dims=3, depth=1, features=4, norm="batch")
    original = copy.deepcopy(model).eval()
    x, target, painted = _painted_problem()
    with torch.no_grad():
        expected = original(x)
    wrapped = wrap_lora(model, rank=4, alpha=8, seed=0)

    wrapped.eval()  # B and the LoRA bias start at zero: step 0 is the base model
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), expected, rtol=0, atol=1e-6)

    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert any("modules_to_save" in n for n in trainable), "normalisation layers stay frozen"
    assert any(n.endswith("head.lora_B.default.bias") for n in trainable), "head bias frozen"
    assert len(trained_norms(original)) == 6

    wrapped.train()
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(8):
        loss = _painted_loss(wrapped, x, target, painted)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses

    # The teacher (adapters off) still is the starting model: BatchNorm running
    # statistics of the base were not updated by the training forwards.
    wrapped.eval()
    with torch.no_grad(), wrapped.disable_adapter():
        torch.testing.assert_close(wrapped(x), expected, rtol=0, atol=1e-6)
    base = dict(base_model(wrapped).named_parameters())
    for name, param in original.named_parameters():
        layer, _, kind = name.rpartition(".")
        kept = base.get(f"{layer}.base_layer.{kind}", base.get(f"{layer}.original_module.{kind}"))
        assert kept is not None and torch.equal(kept, param), name

    merged = merged_copy(wrapped)
    assert not torch.equal(merged.head.bias, original.head.bias)
    assert not torch.equal(merged.encoders[0][1].weight, original.encoders[0][1].weight)
    with torch.no_grad():
        assert float(_painted_loss(merged, x, target, painted)) < losses[0]


def _loss_drop(model: torch.nn.Module, lr: float, steps: int) -> float:
    x, target, painted = _painted_problem(seed=1)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    first = last = 0.0
    for step in range(steps):
        loss = _painted_loss(model, x, target, painted)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first, last = (loss.item(), loss.item()) if step == 0 else (first, loss.item())
    return first - last


def test_default_lora_learns_about_as_fast_per_step_as_a_full_fine_tune():
    """The default scale (alpha / rank) and learning rate let LoRA move the weights
    per step about as far as a full fine-tune does; at scale 2 it learnt a fraction."""
    config = FinetuneConfig()
    torch.manual_seed(0)
    model = UNet(dims=3, depth=1, features=8)
    full_drop = _loss_drop(copy.deepcopy(model), config.learning_rate, steps=10)
    lora = wrap_lora(model, config.lora_rank, config.lora_alpha, seed=0)
    lora_drop = _loss_drop(lora, config.learning_rate, steps=10)
    assert full_drop > 0 and lora_drop > 0.5 * full_drop, (lora_drop, full_drop)


def test_lora_advice_names_small_networks_only():
    small, wide = UNet(dims=3, depth=3, features=8), UNet(dims=3, depth=3, features=64)
    advice = lora_advice(small, 8)
    assert "Full" in advice and "\n" not in advice and "25%" in advice
    assert lora_advice(wide, 8) == "" and lora_advice(small, 2) == ""
