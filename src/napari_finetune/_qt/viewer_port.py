"""napari's :class:`~napari_finetune.session.viewer.ViewerPort`: a Session's layers in a viewer.

A :class:`~napari_finetune.session.session.Session` shows its results by name
(``show_layer``) and reads the region on screen (``shown_region``). Here
both go to a napari viewer: a new layer takes the image's scale and
translation and goes below the corrections layer (strokes stay on top); a
layer already there gets the new data. Adding a layer costs 0.15-0.4 s of
main thread (napari's ``add_labels``), so the layers a result brings are
added one per event-loop turn, never several in one callback: the viewer
repaints and takes input between two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from qtpy.QtCore import QTimer

from napari_finetune._qt.layers import TURN_GAP_MS
from napari_finetune.session.viewer import LayerKind

if TYPE_CHECKING:
    from napari import Viewer
    from napari.layers import Layer


def _nothing() -> None:
    """The default: no layer to follow."""


def _same(name: str) -> str:
    """The default: a layer is named as the Session names it."""
    return name


class NapariViewerPort:
    """A napari viewer as a Session sees it.

    Parameters
    ----------
    viewer : napari.Viewer
        Where the layers go.
    region : callable
        The region of the image on screen now (the widget keeps it as the camera moves).
    image : callable, optional
        The image layer whose scale and translation new layers take (None: the identity).
    below : callable, optional
        The layer new layers go just below (None or absent: on top).
    layer_name : callable, optional
        The viewer's layer for a name the Session gives (absent: the same name).
    whole : bool, optional
        Whether whole results (``show_layer``) are shown here. False: the front end
        shows them itself (the dock: with its colours, its store, its metadata), and
        a tile goes only into a layer of its shape already there.
    """

    def __init__(
        self, viewer: Viewer, region: Callable[[], tuple[slice, ...] | None],
        image: Callable[[], Layer | None] = _nothing, below: Callable[[], Layer | None] = _nothing,
        *, layer_name: Callable[[str], str] = _same, whole: bool = True,
    ) -> None:
        self.viewer = viewer
        self._region, self._image, self._below = region, image, below
        self._layer_name, self._whole = layer_name, whole
        # name -> (data, kind), oldest first; a second show of a name waiting keeps its
        # place and takes the newer data (a preview overtaken by the next one).
        self._pending: dict[str, tuple[np.ndarray, LayerKind]] = {}
        self._scheduled = False

    def shown_region(self) -> tuple[slice, ...] | None:
        """The region of the image on screen now (None: nothing to preview)."""
        return self._region()

    def show_layer(self, name: str, data: np.ndarray, kind: LayerKind) -> None:
        """Show ``data`` as the layer ``name`` at a coming event-loop turn (one layer a turn);
        nothing when whole results are the front end's (``whole=False``)."""
        if self._whole:
            self._show_later(self._layer_name(name), data, kind)

    def _show_later(self, name: str, data: np.ndarray, kind: LayerKind) -> None:
        self._pending[name] = (data, kind)
        if not self._scheduled:
            self._scheduled = True
            QTimer.singleShot(0, self._next)

    def show_region(
        self, name: str, data: np.ndarray, region: tuple[slice, ...], kind: LayerKind,
    ) -> None:
        """Write ``data[region]`` into the layer ``name`` now; a layer not there yet (or of
        another shape) is shown whole at a coming turn, as :meth:`show_layer` does.

        A tile of the view is small (128 x 128 a slice): copied and refreshed here, where
        replacing the layer's data re-slices and re-checks the whole volume.
        """
        layers, name = self.viewer.layers, self._layer_name(name)
        if name in self._pending or name not in layers or layers[name].data.shape != data.shape:
            if self._whole:  # a show waiting takes the newer data anyway
                self._show_later(name, data, kind)
            return
        layer = layers[name]
        if layer.data is not data:  # the layer holds the prediction's own array: no copy
            layer.data[region] = data[region]
        layer.refresh()

    @property
    def pending(self) -> int:
        """How many layers wait to be shown."""
        return len(self._pending)

    def _next(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        name = next(iter(self._pending))
        data, kind = self._pending.pop(name)
        self._apply(name, data, kind)
        if self._pending:
            self._scheduled = True
            QTimer.singleShot(TURN_GAP_MS, self._next)

    def _apply(self, name: str, data: np.ndarray, kind: LayerKind) -> None:
        layers = self.viewer.layers
        if name in layers:
            there = layers[name]
            if there.data is data:  # its tiles written in place already: only repaint
                there.refresh()
            else:
                there.data = data
            return
        from napari.layers import Image, Labels

        image = self._image()
        # The image's geometry and units (napari warns when the layers' units differ).
        geometry = {} if image is None else {
            "scale": image.scale, "translate": image.translate, "units": image.units,
        }
        layer: Layer = (Labels(data, name=name, opacity=0.5, **geometry)
                        if kind is LayerKind.LABELS
                        else Image(data, name=name, blending="additive", **geometry))
        below = self._below()
        layers.insert(layers.index(below) if below in layers else len(layers), layer)
