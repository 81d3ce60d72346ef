"""Uncertainty and "paint here next": the most uncertain unpainted region."""

from __future__ import annotations

import dask.array as da
import numpy as np

from napari_finetune import uncertainty
from napari_finetune.uncertainty import entropy, suggest_region


def test_entropy_is_one_at_a_coin_flip_and_zero_when_sure():
    probs = np.array([[0.5, 0.0, 1.0, 0.9], [0.0, 0.5, 0.0, 0.1]], np.float32)
    bits = entropy(probs)
    np.testing.assert_allclose(bits[:3], [1.0, 1.0, 0.0], atol=1e-4)
    assert 0.4 < bits[3] < 0.5  # H(0.9) = 0.469 bits


def test_suggests_the_most_uncertain_unpainted_region(monkeypatch):
    shape = (20, 40, 40)
    unsure = np.zeros(shape, np.float32)
    unsure[0:10, 0:10, 0:10] = 0.9  # most uncertain, but painted
    unsure[10:20, 30:40, 20:30] = 0.6  # the answer
    unsure[0:10, 30:40, 0:10] = 0.3
    corrections = np.zeros(shape, np.uint8)
    corrections[5, 5, 5] = 1
    # small slabs, so regions are gathered across several reads
    monkeypatch.setattr(uncertainty, "SLAB_VOXELS", 10 * 40 * 40)
    pick = suggest_region(da.from_array(unsure, chunks=5), corrections, (10, 10, 10))
    assert pick.box == (slice(10, 20), slice(30, 40), slice(20, 30))
    assert pick.center == (14, 34, 24)
    np.testing.assert_allclose(pick.uncertainty, 0.6, atol=1e-6)
    # asked again, the region suggested before is skipped
    second = suggest_region(unsure, corrections, (10, 10, 10), exclude=[pick.box])
    assert second.box == (slice(0, 10), slice(30, 40), slice(0, 10))


def test_edge_regions_are_averaged_over_their_own_voxels_and_all_painted_is_none():
    unsure = np.zeros((5, 12, 12), np.float32)
    unsure[:, 10:, 10:] = 0.8  # a partial 5x2x2 corner region
    pick = suggest_region(unsure, None, (8, 10, 10))
    assert pick.box == (slice(0, 5), slice(10, 12), slice(10, 12))
    np.testing.assert_allclose(pick.uncertainty, 0.8, atol=1e-6)
    assert suggest_region(unsure, np.ones(unsure.shape, np.uint8), (8, 10, 10)) is None
