"""One patch rule for the CLI and the widget."""

from __future__ import annotations

from napari_finetune.config import FinetuneConfig
from napari_finetune.data.patch_shape import DEFAULT_2D_PATCH, fit_patch_shape


def test_the_3d_default_on_a_2d_image_becomes_the_2d_default():
    default = FinetuneConfig().patch_shape
    assert fit_patch_shape(default, (1000, 1000), 4) == DEFAULT_2D_PATCH
    assert fit_patch_shape(default, (60, 70), 4) == (60, 68)  # cut to the image, multiple of 4


def test_a_3d_patch_is_cut_to_the_volume_and_the_models_multiple():
    assert fit_patch_shape((32, 64, 64), (16, 40, 100), 8) == (16, 40, 64)
    assert fit_patch_shape((32, 64, 64), (5, 40, 100), 8) == (8, 40, 64)  # at least one multiple
    assert fit_patch_shape((64,), (100, 30), 1) == (64, 30)  # fewer axes: the size repeated


def test_an_anisotropic_voxel_size_gives_a_patch_about_isotropic_in_physical_units():
    # 40 x 8 x 8 nm: the default's voxel budget, z five times coarser, multiples of 8.
    patch = fit_patch_shape((32, 64, 64), (100, 1000, 1000), 8, (40, 8, 8))
    assert patch == (16, 88, 88)
    extent = [p * v for p, v in zip(patch, (40, 8, 8), strict=True)]
    assert max(extent) / min(extent) < 1.2  # 640 x 704 x 704 nm
    # A model that pools z less fits on z alone: its own multiple per axis.
    assert fit_patch_shape((32, 64, 64), (100, 1000, 1000), (2, 8, 8), (40, 8, 8)) == (18, 88, 88)
    # A thin stack gives its z share to y and x.
    assert fit_patch_shape((32, 64, 64), (10, 1000, 1000), 8, (40, 8, 8)) == (8, 112, 112)


def test_an_isotropic_or_unknown_voxel_size_keeps_the_patch():
    for voxel_size in (None, (8, 8, 8), (4, 4.2, 4.2), (40, 8, 8)[1:]):
        assert fit_patch_shape((32, 64, 64), (100, 1000, 1000), 8, voxel_size) == (32, 64, 64)
