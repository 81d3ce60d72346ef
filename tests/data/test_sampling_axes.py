"""Patches of images with channels and time points (``AxesImage``)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_finetune.arrays import AxesImage, ChannelChoiceError
from napari_finetune.data.normalization import intensity_ranges
from napari_finetune.data.sampling import PatchSampler

PATCH = (4, 8, 8)


def test_patches_hold_every_channel_each_normalised_on_its_own():
    rng = np.random.default_rng(0)
    # Two channels a thousandfold apart: one shared range would flatten the first.
    image = np.stack([rng.random((8, 16, 16)), rng.random((8, 16, 16)) * 1000])
    corrections = np.zeros((8, 16, 16), np.uint8)
    corrections[2, 2:6, 2:6] = 1
    corrections[5, 8:12, 8:12] = 2
    axes_image = AxesImage(image, "czyx")
    ranges = intensity_ranges(axes_image, {"method": "percentile", "low": 0, "high": 100})
    sampler = PatchSampler(axes_image, corrections, PATCH, ranges, seed=0)
    images, labels = sampler.sample(6)
    assert images.shape == (6, 2, *PATCH) and labels.shape == (6, *PATCH)
    for channel in range(2):  # each channel spans its own 0..1
        assert images[:, channel].min() >= -1e-6 and images[:, channel].max() <= 1 + 1e-6
        assert images[:, channel].max() > 0.5
    assert not sampler.holdout  # the held-out check reads one channel: none kept out


def test_patches_come_from_the_painted_time_points_with_their_labels():
    # Time point t holds the value 100 * t everywhere: a patch shows where it was cut.
    image = np.repeat(np.arange(3, dtype=np.float32)[:, None, None, None] * 100,
                      8 * 16 * 16).reshape(3, 8, 16, 16)
    corrections = np.zeros((3, 8, 16, 16), np.uint8)
    corrections[0, 2, 2:6, 2:6] = 1  # background painted at t=0
    corrections[2, 5, 8:12, 8:12] = 2  # the structure painted at t=2
    sampler = PatchSampler(AxesImage(image, "tzyx"), corrections, PATCH, (0.0, 1000.0),
                           seed=0, augment=False)
    assert sampler.painted_voxels == 32
    images, labels = sampler.sample(8)
    assert images.shape == (8, 1, *PATCH)
    for patch, label in zip(images[:, 0], labels, strict=True):
        (value,) = np.unique(patch)  # one time point per patch
        painted = set(np.unique(label)) - {0}
        assert painted == ({1} if value == pytest.approx(0.0) else {2}), (value, painted)
    np.testing.assert_allclose(np.unique(images), [0.0, 0.2], rtol=1e-6)  # both drawn


def test_the_corrections_must_have_the_images_axes_without_channels():
    image = AxesImage(np.zeros((2, 3, 8, 16, 16), np.float32), "tczyx")
    with pytest.raises(ValueError, match=r"axes TZYX without channels"):
        PatchSampler(image, np.ones((3, 8, 16, 16), np.uint8), PATCH, [(0.0, 1.0)] * 3)


def test_the_channel_choice_is_one_line_naming_it():
    image = AxesImage(np.zeros((2, 8, 16, 16), np.float32), "czyx", ("DAPI", "GFP"))
    with pytest.raises(ChannelChoiceError) as caught:
        image.for_model(1)
    assert str(caught.value) == (
        "the store has 2 channels (0: DAPI, 1: GFP) and the model takes 1: "
        "pass --channel 0 or --channel 1."
    )
    assert image.for_model(1, channel=1).channel_names == ("GFP",)
    assert image.for_model(2) is image
    with pytest.raises(ChannelChoiceError, match="--channel 2: the store has 2 channels"):
        image.for_model(1, channel=2)
    with pytest.raises(ChannelChoiceError, match="the model takes 3 input channels"):
        image.for_model(3)
    with pytest.raises(ValueError, match="NGFF order"):
        AxesImage(np.zeros((2, 8, 16)), "zcy")
