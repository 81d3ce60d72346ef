"""Nuclei as a model unsure of a new volume predicts them: speckled inside.

Four balls 25 voxels across on 8 sections of 1 µm at 0.2 µm pixels (a light-sheet
stack's anisotropy), two of them touching side by side. Inside, the probability is
0.45 to 0.95 at random, so it is above 0.4 everywhere there but above 0.9 only in
specks of a voxel or a few: the cores a real nuclei volume's fine-tuned model gave
(50 to 214 per nucleus).
"""

from __future__ import annotations

import numpy as np

from napari_finetune.objects import ChannelRole

SHAPE = (8, 64, 120)
VOXEL_SIZE = (1000.0, 200.0, 200.0)
RADIUS = 12.5
# (y, x) middles in pixels: two apart, two touching along x.
MIDDLES = ((16, 16), (16, 90), (46, 40), (46, 64))


def speckled(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The probability (float32) and the truth (ids 1..4, 0 outside)."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[:SHAPE[0], :SHAPE[1], :SHAPE[2]]
    truth = np.zeros(SHAPE, np.uint8)
    for i, (cy, cx) in enumerate(MIDDLES, 1):
        # z in pixels of 0.2 µm: the 8 sections are 40 pixels deep, the balls 25 wide
        # along y and x and cut by the stack above and below.
        inside = ((z - 3.5) * 5) ** 2 + (y - cy) ** 2 + (x - cx) ** 2 <= RADIUS**2
        truth[inside & (truth == 0)] = i
    noise = rng.uniform(0.45, 0.95, SHAPE).astype(np.float32)
    prob = np.where(truth > 0, noise, 0.05).astype(np.float32)
    return prob, truth


def pair_on_few_sections() -> np.ndarray:
    """Two touching nuclei, unsure everywhere (no core), on 5 of 7 sections: discs of
    radius 30 with centres 50 apart in (Y, X), the same on every section."""
    y, x = np.mgrid[0:80, 0:150]
    disc = ((y - 40) ** 2 + (x - 45) ** 2 < 900) | ((y - 40) ** 2 + (x - 95) ** 2 < 900)
    prob = np.zeros((7, 80, 150), np.float32)
    prob[1:6][:, disc] = 0.6
    return prob


# Sizes as measured from such nuclei's sections; no core: shape-only seeds.
PAIR_ROLE = ChannelRole("object", threshold=0.4, min_size=0, seed_distance=25.0, split=True,
                        seed_threshold=0.9)
