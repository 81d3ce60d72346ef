"""The starter model's synthetic family: EM membranes and fluorescent nuclei and cells.

The sample model (:mod:`.synthetic_em`) knows one EM look: dark membranes and dark
mitochondria on isotropic voxels, so bright nuclei in a fluorescence stack are
nothing it has seen. The starter model (``starter_unet.pt``, trained by
``sample_data/train_starter_model.py``) is trained on volumes drawn here: the EM
generator's two domains and :mod:`.synthetic_fluo`'s nuclei and cells, each with
voxels 1 to 5 times coarser in z than in y-x and with its contrast inverted half of
the time. Its channels are named for what they are in every family:
:data:`CHANNEL_NAMES`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from napari_finetune.samples.synthetic_em import generate_volume
from napari_finetune.samples.synthetic_fluo import CHANNEL_NAMES, generate_fluo_volume

__all__ = ["CHANNEL_NAMES", "FAMILIES", "INSTANCE_ROLES", "starter_checkpoint_path",
           "starter_volume"]

# Drawn with these weights: EM keeps a large share so the starter does not lose
# the sample's membranes; cells are the rarest look.
FAMILIES = {"em": 0.4, "nuclei": 0.4, "cells": 0.2}
MAX_ANISOTROPY = 5
# How the widget's Objects makes instances of each channel (objects.roles): cells
# between boundaries, nuclei as split objects.
INSTANCE_ROLES = {
    "boundaries": {"role": "boundary", "threshold": 0.5, "min_size": 200, "seed_distance": 8.0},
    "objects": {"role": "object", "threshold": 0.5, "min_size": 200, "seed_distance": 4.0,
                "split": True, "seed_threshold": 0.9},
}


def starter_checkpoint_path() -> Path:
    """The starter UNet shipped with the package (trained on :func:`starter_volume`'s)."""
    return Path(__file__).with_name("starter_unet.pt")


def starter_volume(
    shape: tuple[int, int, int], seed: int
) -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    """One volume of the family, its truth per channel, and what was drawn.

    Parameters
    ----------
    shape : (z, y, x)
        z >= 8, y and x >= 16.
    seed : int
        Picks the family, the anisotropy, the inversion and the volume itself.

    Returns
    -------
    image : np.ndarray of uint8, ``shape``
    truth : np.ndarray of bool, (2, *shape)
        Masks of :data:`CHANNEL_NAMES` (``boundaries``, ``objects``).
    drawn : dict
        ``family`` ("em", "nuclei" or "cells"), ``anisotropy`` (int), ``inverted`` (bool).
    """
    rng = np.random.default_rng([int(seed), 0x57A7])
    names = list(FAMILIES)
    family = names[int(rng.choice(len(names), p=list(FAMILIES.values())))]
    anisotropy = int(rng.integers(1, MAX_ANISOTROPY + 1))
    inverted = bool(rng.random() < 0.5)
    sub = int(rng.integers(2**31))
    if family == "em":
        domain = "source" if rng.random() < 0.5 else "target"
        fine = (shape[0] * anisotropy, shape[1], shape[2])
        image, labels = generate_volume(fine, sub, domain)
        # One section of every ``anisotropy``: a serial-section stack's z step.
        keep = slice(int(rng.integers(anisotropy)), None, anisotropy)
        image, labels = image[keep][: shape[0]], labels[keep][: shape[0]]
        truth = np.stack([labels == 1, labels == 2])
        if inverted:
            image = 255 - image
    else:
        image, truth = generate_fluo_volume(shape, sub, family, anisotropy,  # type: ignore[arg-type]
                                            inverted)
    return image, truth, {"family": family, "anisotropy": anisotropy, "inverted": inverted}
