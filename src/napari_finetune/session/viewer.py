"""What a :class:`~napari_finetune.session.session.Session` asks of a viewer: two things.

The Session reads the region the user is looking at (a run's previews are
of it) and shows an array as a named layer (added the first time, updated
after). napari's viewer does this through the widget; a test passes a plain
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
