"""LoRA wrapping and merging with the real UNet (the PEFT pointwise-Conv3d pitfall)."""

from __future__ import annotations

import torch

from napari_finetune.model.lora import base_model, is_lora, lora_targets, merged_copy, wrap_lora
from napari_finetune.model.unet import UNet


def test_targets_leave_the_pointwise_head_out():
    model = UNet(dims=3, depth=2, features=4)
    targets = lora_targets(model)
    assert "head" not in targets and "encoders.0.0" in targets and "up_convs.0" in targets
    assert len(targets) == 12


def test_wrap_merge_matches_unmerged_outputs_3d_and_2d():
    for dims, shape in ((3, (2, 1, 8, 16, 16)), (2, (2, 1, 16, 16))):
        torch.manual_seed(0)
        wrapped = wrap_lora(UNet(dims=dims, depth=2, features=4), rank=4, alpha=8, seed=1)
        assert is_lora(wrapped)
        trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        with torch.no_grad():  # move the adapters away from their zero start
            for name, param in wrapped.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
        wrapped.eval()
        x = torch.rand(*shape)
        with torch.no_grad():
            expected = wrapped(x)
            merged = merged_copy(wrapped)
            assert type(merged) is UNet and not is_lora(merged)
            torch.testing.assert_close(merged(x), expected, rtol=1e-4, atol=1e-5)
            assert is_lora(wrapped)  # the copy was merged, not the training model
            assert isinstance(base_model(wrapped), UNet)


def test_adapter_initialisation_is_seeded_and_leaves_the_global_rng():
    first, second = UNet(dims=2, depth=1, features=4), UNet(dims=2, depth=1, features=4)
    state = torch.get_rng_state()
    a = wrap_lora(first, 2, 4, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    b = wrap_lora(second, 2, 4, seed=3)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        if "lora_A" in na:
            assert torch.equal(pa, pb)
