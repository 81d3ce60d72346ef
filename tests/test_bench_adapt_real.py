"""``benchmarks/bench_adapt_real.py``: its crop and its positive weighting, without training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from napari_finetune.samples.real import CATALOGUE, RealVolume
from napari_finetune.trainer.losses import corrected_channels, finetune_loss, step_normalisers

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """``bench_adapt_real`` imported as the script imports it (its folder on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_adapt_real

    return bench_adapt_real


def test_the_crop_keeps_labelled_z_and_resplits_the_halves(bench):
    truth = np.arange(10 * 12 * 16, dtype=np.uint32).reshape(10, 12, 16)
    everything = slice(0, None)
    volume = RealVolume(CATALOGUE["cremi"], truth.astype(np.uint8), truth, truth > 0,
                        (everything, everything, slice(0, 8)),
                        (everything, everything, slice(8, 16)))
    crop = bench.crop_volume(volume, (slice(0, 9), slice(0, 6), slice(0, 10)))
    assert crop.image.shape == crop.truth.shape == crop.known.shape == (9, 6, 10)
    assert crop.labelled_z == [4]  # z indices keep their meaning
    assert crop.painted[2] == slice(0, 5) and crop.scored[2] == slice(5, 10)
    np.testing.assert_array_equal(crop.truth, truth[:9, :6, :10])


def test_positives_weighted_w_times_add_w_minus_1_of_their_bce(bench):
    torch.manual_seed(0)
    logits = torch.randn(2, 2, 3, 4, 4)
    labels = torch.randint(0, 4, (2, 3, 4, 4))
    corrected = corrected_channels([1, 2, 3], 2)
    norms = step_normalisers(labels, corrected, 0.0, False)
    base = finetune_loss(logits, labels, corrected, norms)
    # weight 1 is the library's loss
    assert torch.allclose(bench.weighted_positives(1.0)(logits, labels, corrected, norms), base)
    weighted = bench.weighted_positives(5.0)(logits, labels, corrected, norms)
    positive = torch.stack([labels == 2, labels == 3], dim=1)
    bce = F.binary_cross_entropy_with_logits(logits[positive], torch.ones(int(positive.sum())),
                                             reduction="sum")
    assert torch.allclose(weighted, base + 4.0 * bce / norms.supervised)
