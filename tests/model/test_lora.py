"""LoRA on the whole network: PEFT's layers plus our own for transposed and pointwise convs."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.model.lora import (
    adapted_layers,
    base_model,
    describe_adapters,
    is_lora,
    lora_targets,
    merged_copy,
    wrap_lora,
)
from napari_finetune.model.unet import UNet
from third_party import monai_nets


def _monai_unet():
    nets = monai_nets()
    return nets.UNet(
        spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2),
        num_res_units=1,
    )


def _move_adapters(wrapped):
    with torch.no_grad():  # away from their zero start, so merging has something to do
        for name, param in wrapped.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(torch.randn_like(param), alpha=0.1)


def test_targets_include_the_pointwise_head():
    model = UNet(dims=3, depth=2, features=4)
    targets = lora_targets(model)
    assert "head" in targets and "encoders.0.0" in targets and "up_convs.0" in targets
    assert len(targets) == 13


def test_wrap_merge_matches_unmerged_outputs_3d_and_2d():
    for dims, shape in ((3, (2, 1, 8, 16, 16)), (2, (2, 1, 16, 16))):
        torch.manual_seed(0)
        wrapped = wrap_lora(UNet(dims=dims, depth=2, features=4), rank=4, alpha=8, seed=1)
        assert is_lora(wrapped)
        trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable)
        _move_adapters(wrapped)
        wrapped.eval()
        x = torch.rand(*shape)
        with torch.no_grad():
            expected = wrapped(x)
            merged = merged_copy(wrapped)
            assert type(merged) is UNet and not is_lora(merged)
            torch.testing.assert_close(merged(x), expected, rtol=1e-4, atol=1e-4)
            assert is_lora(wrapped)  # the copy was merged, not the training model
            assert isinstance(base_model(wrapped), UNet)


@pytest.mark.parametrize("family", ["own UNet", "MONAI UNet"])
def test_every_conv_is_adapted_and_merges_exactly(family):
    """Pointwise Conv3d heads (PEFT 0.21.2 merges them wrongly) and ConvTranspose3d
    decoders (PEFT has no LoRA for them) carry adapters that merge within 1e-4."""
    torch.manual_seed(0)
    model = UNet(dims=3, depth=2, features=4) if family == "own UNet" else _monai_unet()
    model.eval()
    x = torch.rand(1, 1, 8, 16, 16)
    with torch.no_grad():
        before = model(x)
    targets = lora_targets(model)
    wrapped = wrap_lora(model, rank=2, alpha=4, seed=1)
    assert adapted_layers(wrapped) == targets
    kinds = describe_adapters(wrapped)
    assert "pointwise Conv3d" in kinds
    if family == "MONAI UNet":
        assert "2 ConvTranspose3d" in kinds
    _move_adapters(wrapped)
    wrapped.eval()
    with torch.no_grad():
        unmerged = wrapped(x)
        assert (unmerged - before).abs().max() > 1e-2  # the adapters do change the output
        with wrapped.disable_adapter():  # the LoRA teacher: all adapters off, ours too
            torch.testing.assert_close(wrapped(x), before, rtol=0, atol=1e-6)
        merged = merged_copy(wrapped)
        assert not any(hasattr(m, "lora_A") for m in merged.modules())
        assert (merged(x) - unmerged).abs().max() < 1e-4


def test_own_layers_train_and_are_seeded():
    model = _monai_unet()
    wrapped = wrap_lora(model, rank=2, alpha=4, seed=3)
    up = dict(base_model(wrapped).named_modules())["model.1.submodule.2.0.conv"]
    assert up.base_layer.__class__.__name__ == "ConvTranspose3d"
    assert not up.base_layer.weight.requires_grad and up.lora_A["default"].weight.requires_grad
    again = wrap_lora(_monai_unet(), rank=2, alpha=4, seed=3)
    up2 = dict(base_model(again).named_modules())["model.1.submodule.2.0.conv"]
    assert torch.equal(up.lora_A["default"].weight, up2.lora_A["default"].weight)
    loss = wrapped(torch.rand(1, 1, 8, 16, 16)).square().mean()
    loss.backward()
    assert up.lora_B["default"].weight.grad is not None


def test_adapter_initialisation_is_seeded_and_leaves_the_global_rng():
    first, second = UNet(dims=2, depth=1, features=4), UNet(dims=2, depth=1, features=4)
    state = torch.get_rng_state()
    a = wrap_lora(first, 2, 4, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    b = wrap_lora(second, 2, 4, seed=3)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        if "lora_A" in na:
            assert torch.equal(pa, pb)
