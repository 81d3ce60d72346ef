"""A simulated user: paints corrections from the ground truth, and scores the result.

Used by ``napari-finetune demo`` and ``benchmarks/bench_adaptation.py`` (one
painting function, so the benchmark measures exactly what the demo shows).

The painter works like a person with a round brush on a few z slices: most
strokes land where the model is wrong, the rest on correct context of every
class (so the model is also told what to keep), and every painted voxel gets
its true class (background -> 1, ground-truth class k -> k + 1). Deterministic
for a seed, and never more than the voxel budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from napari_finetune.arrays import VolumeArray
    from napari_finetune.model.checkpoint_format import Checkpoint

ERROR_SHARE = 0.7  # of each slice's budget spent on strokes over errors
BRUSH_RADIUS = 2


def split_slices(depth: int, n_painted: int = 4) -> tuple[list[int], slice]:
    """Painted z slices (first half of the volume) and the held-out z range (second half).

    The held-out half is never painted, so IoU there measures generalisation.
    """
    half = depth // 2
    if half < 1:
        raise ValueError(f"the volume needs at least 2 z slices, got {depth}.")
    n = min(n_painted, half)
    painted = sorted({int(z) for z in np.linspace(0, half - 1, n + 2)[1:-1].round()} or {0})
    return painted, slice(half, depth)


def prediction_errors(probabilities: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Voxels where any channel's decision (prob > 0.5) disagrees with the truth."""
    wrong = np.zeros(truth.shape, bool)
    for c, prob in enumerate(probabilities):
        wrong |= (prob > 0.5) != (truth == c + 1)
    return wrong


def _disk(radius: int) -> np.ndarray:
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    return (yy**2 + xx**2) <= radius**2


def simulate_corrections(
    truth: np.ndarray,
    probabilities: np.ndarray,
    slices: Sequence[int],
    budget_fraction: float = 0.01,
    seed: int = 0,
    paintable: np.ndarray | None = None,
) -> np.ndarray:
    """Paint corrections on ``slices`` of a ZYX volume.

    Parameters
    ----------
    truth : numpy.ndarray
        Ground truth, 0 background and k >= 1 for channel k - 1, ZYX.
    probabilities : numpy.ndarray
        The model's ``(C, Z, Y, X)`` prediction before fine-tuning.
    slices : sequence of int
        z indices to paint on.
    budget_fraction : float
        At most this fraction of the volume's voxels is painted.
    seed : int
        Seeds the stroke positions.
    paintable : numpy.ndarray, optional
        ZYX bool: the voxels whose truth is known (a volume labelled in patches).
        Strokes are centred on them and clipped to them, so the whole budget is
        spent where the truth says something. None: every voxel.

    Returns
    -------
    numpy.ndarray
        uint8 corrections: 0 unpainted, 1 background, k + 1 for truth class k.
    """
    truth = np.asarray(truth)
    rng = np.random.default_rng(seed)
    corrections = np.zeros(truth.shape, np.uint8)
    per_slice = int(budget_fraction * truth.size) // max(len(slices), 1)
    disk = _disk(BRUSH_RADIUS)
    wrong = prediction_errors(probabilities, truth)
    for z in slices:
        painted = np.zeros(truth.shape[1:], bool)
        allowed = None if paintable is None else np.asarray(paintable[z], bool)
        where = np.ones(truth.shape[1:], bool) if allowed is None else allowed
        # Strokes over errors first, then correct context, class by class in turn.
        error_centers = np.argwhere(wrong[z] & where)
        centers = [error_centers[rng.permutation(len(error_centers))]]
        budgets = [int(ERROR_SHARE * per_slice), per_slice]
        right = ~wrong[z] & where
        pools = [np.argwhere(right & (truth[z] == k)) for k in np.unique(truth[z])]
        pools = [pool[rng.permutation(len(pool))] for pool in pools if len(pool)]
        interleaved = [
            pool[i]
            for i in range(max(map(len, pools), default=0))
            for pool in pools
            if i < len(pool)
        ]
        centers.append(np.array(interleaved).reshape(-1, 2))
        for stage_centers, budget in zip(centers, budgets, strict=True):
            for cy, cx in stage_centers:
                if painted.sum() >= budget:
                    break
                if painted[cy, cx]:
                    continue
                _stamp(painted, disk, cy, cx, budget, allowed)
        corrections[z][painted] = truth[z][painted] + 1
    return corrections


def _stamp(painted: np.ndarray, disk: np.ndarray, cy: int, cx: int, budget: int,
           allowed: np.ndarray | None = None) -> None:
    """Add one brush stroke at (cy, cx), clipped at the borders, to ``allowed`` (YX bool,
    None: everywhere) and to the budget."""
    r = disk.shape[0] // 2
    y0, x0 = max(cy - r, 0), max(cx - r, 0)
    y1, x1 = min(cy + r + 1, painted.shape[0]), min(cx + r + 1, painted.shape[1])
    stroke = disk[y0 - cy + r : y1 - cy + r, x0 - cx + r : x1 - cx + r]
    region = painted[y0:y1, x0:x1]
    new = stroke & ~region
    if allowed is not None:
        new &= allowed[y0:y1, x0:x1]
    room = budget - int(painted.sum())
    if int(new.sum()) > room:
        # The last stroke is trimmed so the budget is a hard limit.
        keep = np.flatnonzero(new)[: max(room, 0)]
        new = np.zeros_like(new)
        new.flat[keep] = True
    region |= new


def foreground_iou(probabilities: np.ndarray, truth: np.ndarray, region: slice) -> list[float]:
    """Per-channel IoU of ``prob > 0.5`` against ``truth == c + 1`` on z ``region``."""
    scores = []
    for c, prob in enumerate(probabilities):
        pred = prob[region] > 0.5
        gt = np.asarray(truth[region]) == c + 1
        union = np.logical_or(pred, gt).sum()
        scores.append(float(np.logical_and(pred, gt).sum() / union) if union else 1.0)
    return scores


def predict_all(
    model: torch.nn.Module, image: VolumeArray, checkpoint: Checkpoint, device: str = "auto"
) -> np.ndarray:
    """Probabilities ``(C, *spatial)`` of the whole volume, blockwise."""
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.predict import predict_volume

    low_high = intensity_range(image, checkpoint.normalization)
    return predict_volume(model, image, low_high, PredictConfig(device=device))
