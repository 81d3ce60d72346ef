"""Prediction layers (one Labels layer per named channel) and the region in view.

A prediction layer shows ``prob > 0.5`` of one channel in the channel's
colour; live previews write a region of it in place and refresh, so a
preview costs one slice copy on the main thread, not a new layer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # napari's layers import slowly; only their names are needed
    from napari.components import Camera, ViewerModel
    from napari.layers import Image, Layer
    from napari.utils.colormaps import DirectLabelColormap

PREDICTION_KEY = "napari_finetune_prediction"
# Between two layer additions: time for Qt to paint and take input. With 0 ms the next
# addition could run before any repaint (measured: the corrections layer and the first
# prediction layer made one 0.46 s freeze).
TURN_GAP_MS = 30


def prediction_name(channel: str) -> str:
    """Layer name of a channel's prediction: ``"membrane prediction"``."""
    return f"{channel} prediction"


def _colormap(color: str) -> DirectLabelColormap:
    from napari.utils.colormaps import DirectLabelColormap

    return DirectLabelColormap(color_dict={None: "transparent", 0: "transparent", 1: color})


def show_predictions(
    viewer: ViewerModel, image_layer: Image, channel_names: Sequence[str],
    colors: Sequence[str], masks: Sequence[np.ndarray], store_path: str | None,
    below: Layer | None = None,
) -> list[Layer]:
    """Create or update one Labels layer per channel with the whole-volume masks.

    A new layer gets the image's scale and translation and goes just below
    ``below`` (the corrections layer: strokes stay on top), else on top.
    """
    layers = []
    for name, color, mask in zip(channel_names, colors, masks, strict=True):
        layer_name = prediction_name(name)
        if layer_name in viewer.layers:
            layer = viewer.layers[layer_name]
            if layer.data is mask:
                pass  # made with these masks a turn ago (fit_prediction_layers_later)
            elif layer.data.shape == mask.shape:
                layer.data[...] = mask
                layer.refresh()
            else:  # another image: the layer follows it
                layer.data = mask
                layer.scale, layer.translate = image_layer.scale, image_layer.translate
                layer.units = image_layer.units
        else:
            from napari.layers import Labels

            metadata = {PREDICTION_KEY: name}
            if store_path:
                metadata["ome_zarr_path"] = store_path
            layer = Labels(
                mask, name=layer_name, scale=image_layer.scale, translate=image_layer.translate,
                # The image's units: napari warns when the layers' units differ.
                units=image_layer.units, colormap=_colormap(color), opacity=0.5,
                metadata=metadata,
            )
            at = viewer.layers.index(below) if below in viewer.layers else len(viewer.layers)
            viewer.layers.insert(at, layer)
        layers.append(layer)
    return layers


def fit_prediction_layers_later(
    viewer: ViewerModel, image_layer: Image, channel_names: Sequence[str],
    colors: Sequence[str], shape: tuple[int, ...], store_path: str | None,
    alive: Callable[[], bool], then: Callable[[], None], below: Layer | None = None,
    masks: Sequence[np.ndarray] | None = None,
) -> None:
    """Make the prediction layers fit ``shape``, one per event-loop turn, then call ``then()``.

    Missing layers are added, and layers of another shape (another image)
    refitted, holding ``masks`` (a prediction to show: no second copy of the
    volume) or else empty. napari's ``add_labels`` costs 0.15-0.4 s a
    layer (vispy overlays under Mesa/Xvfb, whatever the size): two in one
    handler froze the UI ~0.6 s. One per turn keeps each stall to one layer.
    The widget calls this when a corrections layer is chosen, before any
    Fine-tune click, so that a run finds them there; ``then`` comes after the
    last one (a worker starting meanwhile would compete with them for the
    GIL: one layer then took up to 0.75 s). ``alive()`` False (the widget
    closed) ends the chain without ``then``. The layer that was active (the
    one being painted) is made active again, in a turn of its own: napari
    activates each layer it adds, and strokes must not land in a prediction.
    """
    from qtpy.QtCore import QTimer

    def fits(name: str) -> bool:
        layer_name = prediction_name(name)
        return layer_name in viewer.layers and tuple(viewer.layers[layer_name].data.shape) == shape

    # Each channel's mask, or None: an empty layer.
    shown: list[np.ndarray | None] = list(masks) if masks else [None] * len(channel_names)
    pending: list[tuple[str, str, np.ndarray | None] | None] = [
        (name, color, mask)
        for name, color, mask in zip(channel_names, colors, shown, strict=True)
        if not fits(name)
    ]
    if pending:
        pending.append(None)
    # Read in the first turn: a layer being inserted is active by then.
    active: list[Layer | None] = []

    def add_next() -> None:
        if not alive():
            return
        if not active:
            active.append(viewer.layers.selection.active)
        if not pending:
            then()
            return
        item = pending.pop(0)
        if item is None:  # the layers are in: the painted layer active again
            if active[0] is not None and active[0] in viewer.layers:
                viewer.layers.selection.active = active[0]
            QTimer.singleShot(TURN_GAP_MS, add_next)
            return
        name, color, mask = item
        if not fits(name):  # a prediction (or another chain) may have come first
            data = np.zeros(shape, dtype=np.uint8) if mask is None else mask
            show_predictions(viewer, image_layer, [name], [color], [data], store_path, below)
        QTimer.singleShot(TURN_GAP_MS, add_next)

    QTimer.singleShot(TURN_GAP_MS, add_next)


def prediction_layers(viewer: ViewerModel, channel_names: Sequence[str]) -> list[Layer]:
    """The existing prediction layers, in channel order (missing ones skipped)."""
    return [
        viewer.layers[prediction_name(n)]
        for n in channel_names
        if prediction_name(n) in viewer.layers
    ]


def apply_preview(
    viewer: ViewerModel, channel_names: Sequence[str], region: tuple[slice, ...],
    probs: np.ndarray,
) -> int:
    """Write ``probs > 0.5`` of ``region`` into the prediction layers; returns layers updated."""
    updated = 0
    for name, channel in zip(channel_names, probs, strict=True):
        layer_name = prediction_name(name)
        if layer_name not in viewer.layers:
            continue
        layer = viewer.layers[layer_name]
        target = layer.data[region]
        if target.shape != channel.shape:
            continue  # the layer was replaced meanwhile; the next preview fits again
        layer.data[region] = (channel > 0.5).astype(layer.data.dtype)
        layer.refresh()
        updated += 1
    return updated


def visible_region(
    viewer: ViewerModel, layer: Layer | None, context: Sequence[int], max_extent: int = 256,
) -> tuple[slice, ...] | None:
    """Data-space slices around what the canvas shows of ``layer``.

    Displayed axes: ``max_extent`` voxels around the camera centre (the
    canvas' pixel size is not public API in napari 0.9, and a fixed window
    keeps each preview's cost bounded whatever the zoom). Not displayed axes (e.g. Z in a
    2D view): the current slice with ``context`` voxels on each side, which a
    3D model needs to see. Returns None when the layer is not in the viewer.
    """
    if layer is None or layer not in viewer.layers:
        return None
    shape = tuple(int(s) for s in (layer.data[0] if layer.multiscale else layer.data).shape)
    ndim = len(shape)
    point = np.asarray(layer.world_to_data(viewer.dims.point), dtype=float)[-ndim:]
    displayed = [d - (viewer.dims.ndim - ndim) for d in viewer.dims.displayed]
    center = point.copy()
    if len(viewer.dims.displayed) == 2:
        cam = np.asarray(layer.world_to_data(_camera_world_point(viewer)), dtype=float)[-ndim:]
        for axis in displayed:
            if 0 <= axis < ndim:
                center[axis] = cam[axis]
    half_view = max_extent / 2.0
    slices = []
    for axis, size in enumerate(shape):
        if axis in displayed:
            lo = int(np.floor(center[axis] - half_view))
            hi = int(np.ceil(center[axis] + half_view))
        else:
            pad = int(context[axis]) if axis < len(context) else 0
            lo, hi = int(round(center[axis])) - pad, int(round(center[axis])) + pad + 1
        lo, hi = max(0, lo), min(size, hi)
        if hi <= lo:
            lo, hi = 0, size
        slices.append(slice(lo, hi))
    return tuple(slices)


def _camera_world_point(viewer: ViewerModel) -> np.ndarray:
    # The camera centre covers the displayed axes; the others come from dims.
    point = np.asarray(viewer.dims.point, dtype=float).copy()
    center = np.asarray(camera_of(viewer).center, dtype=float)[-len(viewer.dims.displayed):]
    for axis, value in zip(viewer.dims.displayed, center, strict=True):
        point[axis] = value
    return point


def camera_of(viewer: ViewerModel) -> Camera:
    """``viewer.scene.camera`` (napari >= 0.9), else the older ``viewer.camera``."""
    scene = getattr(viewer, "scene", None)
    return scene.camera if scene is not None else viewer.camera


OBJECTS_KEY = "napari_finetune_objects"  # metadata: the channel an objects layer counts
OBJECTS_PREDICTION_KEY = "napari_finetune_objects_prediction"  # which prediction it came from


def objects_layer_name(channel: str, role: str | None) -> str:
    """Layer name of a channel's objects: ``"cells"`` for the membrane boundary channel
    (what a biologist counts there), else ``"<channel> objects"``."""
    if role == "boundary" and channel == "membrane":
        return "cells"
    return f"{channel} objects"


def show_objects_later(
    viewer: ViewerModel, image_layer: Image, objects: Sequence[tuple[str, str, np.ndarray]],
    store_path: str | None, prediction_id: int, alive: Callable[[], bool],
    then: Callable[[], None], below: Layer | None = None,
) -> None:
    """Show each ``(layer name, channel, uint32 ids)`` as a plain Labels layer, one per
    event-loop turn, then call ``then()``.

    Plain Labels of uint32 ids: napari gives every id its own colour. A layer
    of that name is refilled (same shape) or replaced (another image), else
    added below ``below`` (the corrections layer: strokes stay on top). One
    layer per turn for the reason :func:`fit_prediction_layers_later` gives,
    and the layer being painted is made active again at the end. ``alive()``
    False (the widget closed) ends the chain without ``then``.
    """
    from napari.layers import Labels
    from qtpy.QtCore import QTimer

    pending = list(objects)
    active = viewer.layers.selection.active  # napari activates each layer it adds

    def add_next() -> None:
        if not alive():
            return
        if not pending:
            if active is not None and active in viewer.layers:
                viewer.layers.selection.active = active
            then()
            return
        name, channel, labels = pending.pop(0)
        metadata = {OBJECTS_KEY: channel, OBJECTS_PREDICTION_KEY: prediction_id}
        if store_path:
            metadata["ome_zarr_path"] = store_path
        if name in viewer.layers and isinstance(viewer.layers[name], Labels):
            layer = viewer.layers[name]
            layer.data = labels
            layer.scale, layer.translate = image_layer.scale, image_layer.translate
            layer.units = image_layer.units
            layer.metadata = {**layer.metadata, **metadata}
        else:
            layer = Labels(labels, name=name, scale=image_layer.scale,
                           translate=image_layer.translate, units=image_layer.units,
                           opacity=0.6, metadata=metadata)
            at = viewer.layers.index(below) if below in viewer.layers else len(viewer.layers)
            viewer.layers.insert(at, layer)
        QTimer.singleShot(TURN_GAP_MS, add_next)

    QTimer.singleShot(TURN_GAP_MS, add_next)


def remove_stale_objects_layers(viewer: ViewerModel, current: Collection[str]) -> None:
    """Remove the objects layers not named in ``current``: those of a channel whose role
    became none, or whose layer name changed with its role ("cells" -> "membrane objects").
    Left in place, Save would write them as objects of today's prediction."""
    for layer in [layer for layer in viewer.layers
                  if layer.metadata.get(OBJECTS_KEY) and layer.name not in current]:
        viewer.layers.remove(layer)


def objects_layers(viewer: ViewerModel, prediction_id: int) -> list[Layer]:
    """The objects layers computed from prediction ``prediction_id`` (older ones skipped)."""
    return [layer for layer in viewer.layers if layer.metadata.get(OBJECTS_KEY)
            and layer.metadata.get(OBJECTS_PREDICTION_KEY) == prediction_id]
