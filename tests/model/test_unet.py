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


def _pool_inputs(model: UNet) -> list[tuple[int, ...]]:
    """The spatial shape each pooling of a forward pass receives and gives."""
    seen: list[tuple[int, ...]] = []
    pools = [m for m in model.modules() if isinstance(m, torch.nn.MaxPool3d)]
    for pool in pools:
        pool.register_forward_hook(
            lambda _m, args, out: seen.append((*args[0].shape[2:], *out.shape[2:]))
        )
    model(torch.rand(1, 1, 8, 32, 32))
    return seen


def test_a_new_unet_for_anisotropic_voxels_does_not_pool_z_at_the_first_level():
    model = UNet.for_voxel_size((40, 8, 8), depth=3, features=4)
    assert model.init_kwargs["scale_factors"] == [[1, 2, 2], [1, 2, 2], [2, 2, 2]]
    assert model.shape_multiple == (2, 8, 8)
    # Level 1 keeps z (8 -> 8) and halves y, x; only the third pooling halves z.
    assert _pool_inputs(model) == [(8, 32, 32, 8, 16, 16), (8, 16, 16, 8, 8, 8),
                                   (8, 8, 8, 4, 4, 4)]
    assert model(torch.rand(1, 1, 2, 16, 24)).shape == (1, 2, 2, 16, 24)  # z a multiple of 2
    twin = UNet(**model.init_kwargs)
    assert _pool_inputs(twin) == _pool_inputs(model)


def test_an_isotropic_or_unknown_voxel_size_builds_todays_unet():
    for voxel_size in (None, (8, 8, 8)):
        model = UNet.for_voxel_size(voxel_size, depth=2, features=4)
        assert model.init_kwargs == UNet(depth=2, features=4).init_kwargs
        assert model.shape_multiple == 4
        assert _pool_inputs(model) == [(8, 32, 32, 4, 16, 16), (4, 16, 16, 2, 8, 8)]


def test_checkpoints_keep_their_pooling_through_a_save(tmp_path):
    from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint

    plain = UNet(depth=2, features=4)
    ckpt = load_checkpoint(save_checkpoint(tmp_path / "plain.pt", plain, {}))
    assert "scale_factors" not in ckpt.model.init_kwargs  # as every earlier checkpoint
    assert ckpt.model.state_dict().keys() == plain.state_dict().keys()
    aniso = UNet.for_voxel_size((40, 8, 8), depth=2, features=4)
    loaded = load_checkpoint(save_checkpoint(tmp_path / "aniso.pt", aniso, {})).model
    assert isinstance(loaded, UNet) and loaded.scale_factors == [(1, 2, 2), (1, 2, 2)]
    x = torch.rand(1, 1, 2, 8, 8)
    torch.testing.assert_close(loaded(x), aniso(x))
    with pytest.raises(ValueError, match="scale_factors"):
        UNet(depth=2, scale_factors=[[1, 2, 2]])


def test_a_unet_with_an_added_channel_scripts_as_the_bioimageio_export_does():
    # TorchScript compiles forward and every property: a generator in forward and the
    # head_channels property failed to compile (the bioimage.io export of any model).
    import torch

    from napari_finetune.model.unet import UNet

    for added in (0, 1):
        model = UNet(dims=3, in_channels=1, out_channels=3, depth=1, features=2,
                     added_channels=added).eval()
        scripted = torch.jit.script(model)
        x = torch.randn(1, 1, 8, 8, 8)
        torch.testing.assert_close(scripted(x), model(x))
        assert model.head_channels == 3 - added
