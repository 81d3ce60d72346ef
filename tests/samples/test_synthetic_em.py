"""The generator: deterministic, sensible ground truth, and a domain gap that
survives the model's percentile normalisation."""

import numpy as np
import pytest
from scipy import ndimage

from napari_finetune.data.normalization import intensity_range, normalize
from napari_finetune.samples.synthetic_em import CHANNEL_NAMES, generate_volume

SHAPE = (24, 64, 64)
NORM = {"method": "percentile", "low": 1.0, "high": 99.0}


def test_same_seed_same_arrays_and_other_seed_differs():
    a_image, a_truth = generate_volume(SHAPE, 5, "source")
    b_image, b_truth = generate_volume(SHAPE, 5, "source")
    np.testing.assert_array_equal(a_image, b_image)
    np.testing.assert_array_equal(a_truth, b_truth)
    c_image, c_truth = generate_volume(SHAPE, 6, "source")
    assert not np.array_equal(a_truth, c_truth)
    assert not np.array_equal(a_image, c_image)


def test_ground_truth_classes_and_dtypes():
    image, truth = generate_volume(SHAPE, 2, "target")
    assert image.dtype == np.uint8 and truth.dtype == np.uint8
    assert image.shape == truth.shape == SHAPE
    assert set(np.unique(truth)) == {0, 1, 2}
    fractions = np.bincount(truth.ravel(), minlength=3) / truth.size
    assert 0.05 < fractions[1] < 0.35, fractions  # membranes: a network, not everything
    assert 0.005 < fractions[2] < 0.15, fractions  # some mitochondria
    assert len(CHANNEL_NAMES) == 2 and CHANNEL_NAMES == ["membrane", "mitochondria"]
    # Membranes are dark in both domains (EM contrast), mitochondria darker than cytoplasm.
    means = [image[truth == k].mean() for k in range(3)]
    assert means[1] < means[0] and means[2] < means[0]


def test_domains_share_geometry_but_not_appearance():
    s_image, s_truth = generate_volume(SHAPE, 4, "source")
    t_image, t_truth = generate_volume(SHAPE, 4, "target")
    np.testing.assert_array_equal(s_truth, t_truth)
    assert not np.array_equal(s_image, t_image)


def _normalised(image):
    return normalize(image, *intensity_range(image, NORM))


def test_target_is_noisier_and_blurrier_after_normalisation():
    """What 1st/99th percentile scaling cannot undo: noise, blur, lost contrast."""
    stats = {}
    for domain in ("source", "target"):
        image, truth = generate_volume((32, 96, 96), 3, domain)
        x = _normalised(image)
        # Noise: high-frequency residual in cytoplasm far from any structure.
        calm = ndimage.binary_erosion(truth == 0, iterations=4)
        noise = float((x - ndimage.uniform_filter(x, 3))[calm].std())
        # Contrast of membranes against cytoplasm, on the normalised scale.
        level = np.median(x[calm])
        contrast = float(level - np.median(x[truth == 1]))
        # Blur: how much of the membranes' darkness spreads to the cytoplasm 1-2
        # voxels away from them.
        dist = ndimage.distance_transform_edt(truth != 1)
        near = (truth == 0) & (dist > 1) & (dist <= 2)
        spread = float(level - np.median(x[near])) / contrast
        stats[domain] = (noise, contrast, spread)
    (s_noise, s_contrast, s_spread), (t_noise, t_contrast, t_spread) = stats.values()
    assert t_noise > 1.3 * s_noise, stats
    assert t_contrast < 0.9 * s_contrast, stats
    assert t_spread > 3 * s_spread, stats


@pytest.mark.parametrize("shape", [(4, 64, 64), (8, 64), (8, 8, 8, 8)])
def test_bad_shapes_are_refused(shape):
    with pytest.raises(ValueError, match="shape"):
        generate_volume(shape, 0, "source")


def test_unknown_domain_is_refused():
    with pytest.raises(ValueError, match="domain"):
        generate_volume(SHAPE, 0, "other")
