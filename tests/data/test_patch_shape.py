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
