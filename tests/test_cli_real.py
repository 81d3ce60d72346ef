"""The simulated user of the real-volume rows on a volume labelled in a patch
(:func:`napari_finetune.cli.real.paint_sparse`).

CREMI's reference labels a patch of one slice; the rest is *unlabelled* (255 to the
painter). The painter took the unlabelled voxels for a class of their own, centred
strokes on them and the strokes were wiped afterwards: on the CREMI crop 222 voxels
were painted of a budget of 834, 37 of them membrane.
"""

from __future__ import annotations

import numpy as np

from napari_finetune.cli.real import BUDGET, KNOWN_SHARE, paint_sparse, semantic_truth
from napari_finetune.cli.simulate import simulate_corrections
from napari_finetune.samples.real import CATALOGUE, RealVolume


def _patch_labelled() -> RealVolume:
    """Cells labelled on z = 4 in a patch a third of the slice wide; unlabelled around it."""
    shape = (9, 60, 80)
    truth = np.zeros(shape, np.uint32)
    known = np.zeros(shape, bool)
    known[4, 10:50, 10:70] = True
    cells = np.arange(40 * 60).reshape(40, 60) // 10  # bands of cells, 10 pixels wide
    truth[4, 10:50, 10:70] = (cells % 6 + 1) + 10 * (np.arange(60) // 15)[None, :]
    everything = slice(0, None)
    rng = np.random.default_rng(0)
    return RealVolume(CATALOGUE["cremi"], rng.integers(0, 255, shape, np.uint8), truth, known,
                      (everything, everything, slice(0, 40)),
                      (everything, everything, slice(40, 80)))


def test_strokes_land_on_labelled_voxels_and_spend_the_budget_there():
    volume = _patch_labelled()
    semantic = semantic_truth(volume, 0)
    probs = np.zeros((2, *volume.truth.shape), np.float32)
    sparse = paint_sparse(volume, semantic, probs)
    known = volume.known[volume.painted]
    budget = int(min(BUDGET * volume.truth.size, KNOWN_SHARE * int(known.sum())))
    assert not sparse[~volume.known].any() and not sparse[..., 40:].any()
    # The whole budget (less one trimmed stroke's rounding) on labelled voxels; before,
    # strokes centred on unlabelled voxels were wiped and most of it was lost.
    assert (sparse > 0).sum() == budget
    assert set(np.unique(sparse[sparse > 0])) == {1, 2}  # interior and membrane both


def test_the_painter_keeps_to_the_paintable_voxels_and_is_unchanged_without_them():
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 3, (6, 30, 30)).astype(np.uint8)
    probs = rng.random((2, 6, 30, 30)).astype(np.float32)
    paintable = np.zeros(truth.shape, bool)
    paintable[:, 5:15, 5:25] = True
    corr = simulate_corrections(truth, probs, [1, 2], 0.01, seed=3, paintable=paintable)
    assert corr.any() and not corr[~paintable].any()
    assert (corr > 0).sum() == int(0.01 * truth.size) // 2 * 2  # the whole budget
    every = simulate_corrections(truth, probs, [1, 2], 0.01, seed=3,
                                 paintable=np.ones(truth.shape, bool))
    np.testing.assert_array_equal(every, simulate_corrections(truth, probs, [1, 2], 0.01, 3))
