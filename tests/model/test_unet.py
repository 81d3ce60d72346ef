"""The UNet: shapes in 2D and 3D, recorded constructor arguments."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.model.unet import UNet


@pytest.mark.parametrize("norm", ["group", "batch", "instance", "none"])
def test_3d_output_shape(norm):
    model = UNet(dims=3, in_channels=1, out_channels=3, depth=2, features=4, norm=norm)
    assert model.shape_multiple == 4
    y = model(torch.rand(2, 1, 4, 8, 12))
    assert y.shape == (2, 3, 4, 8, 12)


def test_2d_and_init_kwargs_rebuild():
    model = UNet(dims=2, out_channels=2, depth=3, features=4)
    assert model(torch.rand(1, 1, 16, 24)).shape == (1, 2, 16, 24)
    twin = UNet(**model.init_kwargs)
    assert [p.shape for p in twin.parameters()] == [p.shape for p in model.parameters()]


def test_only_the_head_is_pointwise():
    model = UNet(dims=3, depth=2, features=4)
    pointwise = [
        name for name, m in model.named_modules()
        if isinstance(m, torch.nn.Conv3d) and all(k == 1 for k in m.kernel_size)
    ]
    assert pointwise == ["head"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="dims"):
        UNet(dims=4)
    with pytest.raises(ValueError):
        UNet(features=0)
