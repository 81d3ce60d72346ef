"""'Paint here next': show where the model is unsure and go to the best place to paint.

After a run (or with the checkpoint as it is), the whole volume is predicted in
a worker and the entropy of each voxel's prediction becomes an image layer
("uncertainty"); the view then moves to the most uncertain region of a patch's
size that holds no painting yet. Asked again, the next region is suggested
(the ones suggested before are skipped) without predicting again, until the
weights change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from napari_finetune._qt.layers import camera_of
from napari_finetune.uncertainty import Suggestion

if TYPE_CHECKING:  # napari's layers import slowly; only their names are needed
    from napari.components import ViewerModel
    from napari.layers import Image, Layer

LAYER_NAME = "uncertainty"


def show_uncertainty(viewer: ViewerModel, image_layer: Image, unsure: np.ndarray) -> Layer:
    """Add (or refresh) the uncertainty layer over the image, in the image's space."""
    if LAYER_NAME in viewer.layers:
        layer = viewer.layers[LAYER_NAME]
        layer.data = unsure
        return layer
    return viewer.add_image(
        unsure,
        name=LAYER_NAME,
        colormap="inferno",
        blending="additive",
        opacity=0.6,
        contrast_limits=(0.0, 1.0),
        scale=image_layer.scale,
        translate=image_layer.translate,
    )


def go_to(viewer: ViewerModel, image_layer: Image, suggestion: Suggestion) -> None:
    """Move the slider and the camera to the centre of ``suggestion``."""
    world = image_layer.data_to_world(np.asarray(suggestion.center, dtype=float))
    axes = list(range(viewer.dims.ndim - len(world), viewer.dims.ndim))
    viewer.dims.set_point(axes, tuple(float(w) for w in world))
    camera_of(viewer).center = tuple(float(w) for w in world[-2:])


def describe(suggestion: Suggestion | None, axes: str | None = None) -> str:
    """The log line for a suggestion; ``axes`` names its centre's axes (the painting's,
    e.g. ``"tzyx"``; by default ZYX or YX, and TZYX for four)."""
    if suggestion is None:
        return "paint here next: every region is painted or was suggested already"
    names = axes or "tzyx"[-len(suggestion.center):]
    where = " ".join(f"{axis}={c}" for axis, c in zip(names, suggestion.center, strict=True))
    return (
        f"paint here next: {where} (mean uncertainty {suggestion.uncertainty:.2f}, "
        "the most uncertain region with nothing painted)"
    )

