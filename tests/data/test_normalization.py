"""Normalisation with missing (NaN/inf) voxels: named once, never silent garbage."""

from __future__ import annotations

import numpy as np

from napari_finetune.config import PredictConfig
from napari_finetune.data.normalization import (
    MISSING_VALUE,
    describe_missing,
    intensity_range,
    normalize,
)
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.unet import UNet
from napari_finetune.predict import predict_volume

SPEC = {"method": "percentile", "low": 1.0, "high": 99.0}


def _image_with_nan():
    image = np.random.default_rng(0).random((16, 40, 40)).astype(np.float32) * 100
    image[8, 20, 29] = np.nan
    image[9, 1:5, 3] = np.nan
    image[10, 0, 0] = np.inf
    return image


def test_range_ignores_missing_voxels_and_normalize_gives_a_defined_value():
    image = _image_with_nan()
    low, high = intensity_range(image, SPEC)
    assert np.isfinite(low) and np.isfinite(high) and 0 < low < high < 100
    out = normalize(image, low, high)
    assert np.isfinite(out).all()
    assert out[8, 20, 29] == MISSING_VALUE and out[10, 0, 0] == MISSING_VALUE


def test_describe_missing_names_count_and_first_voxel():
    line = describe_missing(_image_with_nan())
    assert line == (
        "the image has 5 NaN voxels and 1 inf voxels, first at z=8 y=20 x=29: treated as "
        "missing (not trained on, predicted as background)"
    )
    assert describe_missing(np.zeros((4, 4, 4), np.uint8)) is None
    assert describe_missing(np.zeros((4, 4, 4), np.float32)) is None


def test_painted_missing_voxels_are_left_out_of_training():
    image = _image_with_nan()
    corrections = np.zeros(image.shape, np.uint8)
    corrections[8, 15:25, 25:35] = 2  # painted over the NaN at (8, 20, 29)
    sampler = PatchSampler(image, corrections, (4, 16, 16), intensity_range(image, SPEC), seed=0)
    images, labels = sampler.sample(8)
    assert np.isfinite(images).all()
    painted = labels.sum()
    assert 0 < painted and painted < 8 * 100 * 2  # some patches cover the NaN voxel


def test_prediction_is_not_wiped_out_by_a_few_nan_voxels():
    image = _image_with_nan()
    clean = np.nan_to_num(image, nan=50.0, posinf=50.0)
    model = UNet(dims=3, depth=1, features=4, out_channels=1, norm="none").eval()
    low_high = intensity_range(image, SPEC)
    config = PredictConfig(block_shape=(8, 32, 32), halo=(2, 4, 4), device="cpu")
    with_nan = predict_volume(model, image, low_high, config)
    without = predict_volume(model, clean, low_high, config)
    assert np.isfinite(with_nan).all()
    assert with_nan[0, 8, 20, 29] == 0.0  # missing: background
    assert (with_nan > 0.5).mean() > 0.1 or (without > 0.5).mean() <= 0.1
    far = (slice(None), slice(0, 6))  # away from every NaN and its receptive field
    np.testing.assert_allclose(with_nan[far], without[far], atol=1e-5)
