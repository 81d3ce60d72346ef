"""Output channels and spatial multiple of any module: declared, from an adapter, or probed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.geometry import (
    ModelShapeError,
    fit_patch,
    model_geometry,
    probe_geometry,
)
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.loop import Finetuner
from third_party import monai_nets


class Anisotropic(nn.Module):
    """No adapter knows it: stride (1, 2, 2) then (2, 2, 2) down, transposed back up,
    with BatchNorm; sizes must be multiples of 2 in z and 4 in y, x."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Conv3d(1, 4, 3, stride=(1, 2, 2), padding=1)
        self.norm = nn.BatchNorm3d(4)
        self.down2 = nn.Conv3d(4, 4, 3, stride=2, padding=1)
        self.up2 = nn.ConvTranspose3d(4, 4, 2, stride=2)
        self.up1 = nn.ConvTranspose3d(8, 3, (1, 2, 2), stride=(1, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.norm(self.down1(x))
        b = self.up2(self.down2(a))
        return self.up1(torch.cat([a, b], dim=1))  # fails unless the sizes line up


def test_probe_finds_per_axis_multiple_and_channels_without_side_effects():
    model = Anisotropic().train()
    model.down2.eval()  # a module kept in eval inside a training model
    stats = model.norm.running_mean.clone()
    rng = torch.get_rng_state()
    geometry = probe_geometry(model, (10, 30, 30))
    assert geometry.out_channels == 3 and geometry.multiple == (2, 4, 4)
    assert geometry.source == "probe"
    assert model.training and not model.down2.training  # per-module modes restored
    assert torch.equal(model.norm.running_mean, stats)  # no BatchNorm update
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


def test_monai_models_given_as_they_are_train(tmp_path):
    # Before: the channel probe fed a 1x1x1 input to the model in training mode and
    # MONAI refused it ("Expected more than 1 spatial element when training").
    nets = monai_nets()
    # (BasicUNet, likewise given as it is: tests/test_third_party_models.py.)
    for model in (
        nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,)),
    ):
        model.train()
        image = np.random.default_rng(0).random((16, 32, 32), dtype=np.float32)
        corrections = np.zeros(image.shape, np.uint8)
        corrections[8, 8:20, 8:20] = 2
        config = FinetuneConfig(steps=1, batch_size=1, patch_shape=(16, 32, 32), device="cpu",
                                mixed_precision=False, distillation=0.0)
        trainer = Finetuner(model, image, corrections, config)
        assert trainer.out_channels == 2
        statuses = list(trainer.run())
        assert statuses[-1].kind == "finished"


def test_adapters_know_monai_multiples():
    nets = monai_nets()
    unet = nets.UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=(4, 8, 8),
                     strides=((1, 2, 2), 2))
    geometry = model_geometry(unet, 3)
    assert geometry.multiple == (2, 4, 4) and geometry.out_channels == 3
    assert geometry.source == "adapter MONAI UNet"
    basic = nets.BasicUNet(spatial_dims=2, out_channels=4, features=(4, 4, 4, 4, 4, 4))
    assert model_geometry(basic, 2).multiple == (16, 16)
    assert model_geometry(basic, 2).out_channels == 4


def test_own_unet_declares_its_geometry():
    geometry = model_geometry(UNet(dims=3, depth=3, features=2, out_channels=5), 3)
    assert geometry.multiple == (8, 8, 8) and geometry.out_channels == 5
    assert geometry.source == "model"


def test_a_patch_the_model_cannot_take_is_one_clear_line():
    nets = monai_nets()
    model = nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8, 8, 8),
                      strides=(2, 2, 2))
    with pytest.raises(ModelShapeError) as info:
        fit_patch(model, (30, 100, 100))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "30x100x100" in message and "8x8x8" in message and "32 104 104" in message
    assert fit_patch(model, (32, 104, 104)).out_channels == 2


def test_a_model_that_never_fits_is_one_clear_line():
    shrinking = nn.Conv3d(1, 2, 3)  # no padding: the output is always smaller
    with pytest.raises(ModelShapeError) as info:
        probe_geometry(shrinking, (8, 16, 16))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "9x17x17" in message and "8x16x16" in message and "(N, C, *spatial)" in message


def test_recovering_monai_arguments_leaves_the_rng_alone():
    from napari_finetune.model.adapters import constructor_kwargs

    nets = monai_nets()
    model = nets.BasicUNet(spatial_dims=2, out_channels=3, features=(2, 2, 2, 2, 2, 2))
    state = torch.get_rng_state()
    kwargs = constructor_kwargs(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert kwargs is not None and kwargs["out_channels"] == 3 and kwargs["spatial_dims"] == 2
    other = nets.BasicUNet(spatial_dims=2, features=(2, 2, 2, 2, 2, 2), upsample="nontrainable")
    assert constructor_kwargs(other) is None  # not the defaults: the rebuild check says so


def test_an_adapter_registered_by_a_package_is_used_and_allowed(tmp_path, monkeypatch):
    # A real installed distribution (a .dist-info on sys.path) registering an adapter.
    from napari_finetune.model import adapters
    from napari_finetune.model.architectures import is_allowed

    site = tmp_path / "site"
    (site / "tiny_nets").mkdir(parents=True)
    (site / "tiny_nets" / "__init__.py").write_text(
        "from torch import nn\n"
        "from napari_finetune.model.adapters import ArchitectureAdapter\n\n"
        "class Net(nn.Conv3d):\n"
        "    def __init__(self, width=2):\n"
        "        super().__init__(1, width, 3, padding=1)\n"
        "        self.init_kwargs = {'width': width}\n\n"
        "ADAPTER = ArchitectureAdapter(\n"
        "    name='tiny', factories=('tiny_nets:Net',),\n"
        "    spatial_multiple=lambda kw, ndim: (1, 4, 4)[-ndim:],\n"
        "    out_channels=lambda kw: kw['width'])\n"
    )
    info = site / "tiny_nets-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-nets\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[napari_finetune.adapters]\ntiny = tiny_nets:ADAPTER\n")
    monkeypatch.syspath_prepend(str(site))
    adapters.registered_adapters.cache_clear()
    try:
        import tiny_nets

        geometry = model_geometry(tiny_nets.Net(width=3), 3)
        assert geometry == geometry.__class__(3, (1, 4, 4), "adapter tiny")
        assert is_allowed("tiny_nets:Net") and not is_allowed("tiny_nets:nn")
    finally:
        adapters.registered_adapters.cache_clear()


def test_a_patch_that_leaves_instance_norm_one_voxel_is_refused_before_training():
    # BasicUNet pools four times: at 16x16x16 its bottleneck InstanceNorm sees 1x1x1,
    # which torch refuses only in the middle of the first training step.
    nets = monai_nets()
    model = nets.BasicUNet(spatial_dims=3, out_channels=2, features=(2, 2, 2, 2, 2, 2)).train()
    with pytest.raises(ModelShapeError) as info:
        fit_patch(model, (16, 16, 16))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "16x16x16" in message and "down_4" in message and "32 32 32" in message
    assert model.training
    assert fit_patch(model, (16, 32, 32)).out_channels == 2
