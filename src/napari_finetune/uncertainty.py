"""Where the model is least sure, and where to paint next.

The active-learning loop: after a run, show the user where the prediction is
most uncertain and take them to the most uncertain region they have not painted
yet. Uncertainty is the binary entropy of each channel's probability (1 at
p = 0.5, 0 at p = 0 or 1), the largest over the channels. Both functions work
on numpy, zarr or dask arrays one slab at a time, so a whole volume is never
in memory at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from napari_finetune.arrays import VolumeArray

SLAB_VOXELS = 8_000_000


def entropy(probabilities: np.ndarray) -> np.ndarray:
    """Binary entropy in bits of ``(C, *spatial)`` probabilities, largest over ``C``.

    Returns float32 of shape ``spatial``, 0 (certain) to 1 (p = 0.5).
    """
    p = np.clip(np.asarray(probabilities, dtype=np.float32), 1e-6, 1 - 1e-6)
    bits = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    return bits.max(axis=0).astype(np.float32)


def _slabs(shape: Sequence[int], rows: int) -> list[slice]:
    """First-axis slabs of whole multiples of ``rows`` planes, about SLAB_VOXELS each."""
    per_plane = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    step = max(rows, SLAB_VOXELS // max(per_plane, 1) // rows * rows)
    return [slice(z, min(z + step, shape[0])) for z in range(0, shape[0], step)]


@dataclass(frozen=True)
class Suggestion:
    """A region to paint next.

    Attributes
    ----------
    center : tuple of int
        Its centre voxel (where to move the view).
    box : tuple of slice
        The region.
    uncertainty : float
        Its mean uncertainty (0 to 1).
    """

    center: tuple[int, ...]
    box: tuple[slice, ...]
    uncertainty: float


def suggest_region(
    uncertainty: VolumeArray,
    corrections: VolumeArray | None,
    region_shape: Sequence[int],
    exclude: Sequence[tuple[slice, ...]] = (),
) -> Suggestion | None:
    """The region of ``region_shape`` with the highest mean uncertainty and nothing painted.

    The volume is cut into a grid of regions (the last one on each axis may be
    smaller); regions holding any painted voxel, and regions in ``exclude``
    (suggested before), are skipped. None when every region is painted or
    excluded.
    """
    shape = tuple(int(s) for s in uncertainty.shape)
    region = tuple(min(int(r), s) for r, s in zip(region_shape, shape, strict=True))
    grid = tuple(-(-s // r) for s, r in zip(shape, region, strict=True))
    sums = np.zeros(grid, np.float64)
    counts = np.zeros(grid, np.int64)
    painted = np.zeros(grid, bool)
    for slab in _slabs(shape, region[0]):
        # Slabs hold whole rows of regions, so each adds to its own rows of the grid.
        rows = slice(slab.start // region[0], -(-slab.stop // region[0]))
        values = np.asarray(uncertainty[(slab,)], dtype=np.float64)
        sums[rows] += _block_sum(values, region)
        counts[rows] += _block_sum(np.ones(values.shape, np.int64), region)
        if corrections is not None:
            marks = (np.asarray(corrections[(slab,)]) > 0).astype(np.int64)
            painted[rows] |= _block_sum(marks, region) > 0
    means = np.where(counts > 0, sums / np.maximum(counts, 1), -1.0)
    means[painted] = -1.0
    for box in exclude:
        means[tuple(b.start // r for b, r in zip(box, region, strict=True))] = -1.0
    best = np.unravel_index(int(np.argmax(means)), grid)
    if means[best] < 0:
        return None
    box = tuple(
        slice(i * r, min((i + 1) * r, s)) for i, r, s in zip(best, region, shape, strict=True)
    )
    center = tuple((b.start + b.stop - 1) // 2 for b in box)
    return Suggestion(center=center, box=box, uncertainty=float(means[best]))


def _block_sum(values: np.ndarray, block: Sequence[int]) -> np.ndarray:
    """Sums over blocks of ``block`` (edge blocks partial), one entry per block."""
    pad = [(0, -(-s // b) * b - s) for s, b in zip(values.shape, block, strict=True)]
    padded = np.pad(values, pad)
    split = []
    for n, b in zip(padded.shape, block, strict=True):
        split += [n // b, b]
    return padded.reshape(split).sum(axis=tuple(range(1, 2 * len(block), 2)))
