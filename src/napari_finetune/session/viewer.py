"""What a :class:`~napari_finetune.session.session.Session` asks of a viewer: two things.

The Session reads the region the user is looking at (a run's previews are
of it), shows an array as a named layer (added the first time, updated
after) and writes one region of an array into a layer (a tile of the view
predicted before the rest). napari's viewer does this through the widget; a test passes a plain
object, so no Session test needs a viewer or a display.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

import numpy as np


class LayerKind(Enum):
    """How a layer is shown: an intensity image or integer labels."""

    IMAGE = "image"
    LABELS = "labels"


class ViewerPort(Protocol):
    """The viewer as a Session sees it."""

    def shown_region(self) -> tuple[slice, ...] | None:
        """The region of the image on screen now (None: nothing to preview)."""

    def show_layer(self, name: str, data: np.ndarray, kind: LayerKind) -> None:
        """Add the layer ``name`` holding ``data``, or replace the data of the one there."""

    def show_region(
        self, name: str, data: np.ndarray, region: tuple[slice, ...], kind: LayerKind,
    ) -> None:
        """Write ``data[region]`` into the layer ``name`` (added holding ``data`` if absent).

        Only that region changes: a prediction's view comes in nine tiles, and
        replacing the whole layer for each re-shows the whole volume nine times.
        """
