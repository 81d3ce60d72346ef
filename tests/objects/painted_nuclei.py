"""Two touching nuclei about 30 voxels across, their probability and a painting of them.

Each nucleus is peanut-shaped (two balls, radius 15 and 14, 12 voxels apart along x),
so the distance to the background has two maxima 12 apart in each: the sample's seed
distance (4, mitochondria-sized) seeds and splits each nucleus in two. They lie side by
side along y, 30 apart, touching: one connected foreground, to be cut between them.
"""

from __future__ import annotations

import numpy as np

from napari_finetune.objects import ChannelRole

SHAPE = (40, 80, 90)
MIDDLES_Y = (24, 54)
# Today's values for an object channel: the sample's, sized for mitochondria.
TODAY = ChannelRole("object", threshold=0.5, min_size=200, seed_distance=4.0, split=True)
PAINTED_SLICES = (14, 20, 26)


def _signed_distance() -> np.ndarray:
    z, y, x = np.ogrid[:SHAPE[0], :SHAPE[1], :SHAPE[2]]
    balls = [np.sqrt((z - 20) ** 2 + (y - yc) ** 2 + (x - xc) ** 2) - r
             for yc in MIDDLES_Y for xc, r in ((38, 15), (50, 14))]
    return np.minimum.reduce(balls)


def nuclei() -> tuple[np.ndarray, np.ndarray]:
    """The nuclei's probability (float32) and truth (1 and 2, 0 outside)."""
    distance = _signed_distance()
    prob = (1 / (1 + np.exp(distance / 1.5))).astype(np.float32)
    y = np.arange(SHAPE[1])[None, :, None]
    truth = np.where(distance < 0, np.where(y < sum(MIDDLES_Y) / 2, 1, 2), 0).astype(np.uint8)
    return prob, truth


def painting(channel: int = 0, slices: tuple[int, ...] = PAINTED_SLICES) -> np.ndarray:
    """The nuclei filled in with ``channel``'s label on a few slices, a background stroke."""
    corrections = np.zeros(SHAPE, np.uint8)
    inside = _signed_distance() < 0
    for z in slices:
        corrections[z][inside[z]] = channel + 2
        corrections[z, 2:4, 5:60] = 1  # background painted around them changes nothing
    return corrections


def whole(labels: np.ndarray, truth: np.ndarray) -> list[int]:
    """Per nucleus, how many object ids cover it."""
    return [int(np.unique(labels[truth == k]).size) for k in (1, 2)]
