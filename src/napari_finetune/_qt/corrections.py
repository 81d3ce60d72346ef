"""The corrections Labels layer: names and colours of the classes, and autosave.

Label values: 0 unpainted, 1 background, ``k >= 2`` the
foreground of the model's channel ``k - 2``. The layer carries a
``features`` table (``index``, ``class``) so napari's status bar names the
class under the cursor, and a :class:`DirectLabelColormap` so each class has
the channel's colour.

Autosave: every paint (or data change) restarts a single-shot timer; when it
fires, the array is copied on the main thread (a memcpy, milliseconds) and
written by a job of the Session's runner (``Session.save_corrections``), so a
stroke never waits for the disk: into the store's ``labels/corrections``, or
its sibling ``<name>.corrections.ome.zarr`` when the store is read-only. One
lock serialises all writers (autosave and the save a run does before it starts).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from qtpy.QtCore import QObject, QTimer

from napari_finetune import palette
from napari_finetune.session.saving import (
    corrections_target,
    next_snapshot,
    not_yet_written,
    save_corrections_locked,
)

if TYPE_CHECKING:  # napari's layers and workers import slowly; only their names are needed
    from napari.components import ViewerModel
    from napari.layers import Image, Labels, Layer
    from napari.utils.colormaps import DirectLabelColormap
    from napari.utils.events import Event

    from napari_finetune.arrays import VolumeArray

BACKGROUND_COLOR = palette.BACKGROUND
UNPAINTED = 0
BACKGROUND = 1
METADATA_KEY = "napari_finetune_corrections"


def class_names(channel_names: Sequence[str]) -> list[str]:
    """Label value -> class name: ``["unpainted", "background", *channel_names]``."""
    return ["unpainted", "background", *channel_names]


def corrections_colormap(colors: Sequence[str]) -> DirectLabelColormap:
    """Transparent 0, blue background, then the channel colours."""
    from napari.utils.colormaps import DirectLabelColormap

    color_dict: dict[int | None, Any] = {None: "transparent", UNPAINTED: "transparent"}
    color_dict[BACKGROUND] = BACKGROUND_COLOR
    for i, color in enumerate(colors):
        color_dict[i + 2] = color
    return DirectLabelColormap(color_dict=color_dict)


def add_corrections_layer(
    viewer: ViewerModel,
    image_layer: Image,
    channel_names: Sequence[str],
    colors: Sequence[str],
    store_path: str | None,
) -> Labels:
    """Add an empty corrections layer over ``image_layer``, selected and in paint mode.

    The first channel is the selected label, so the first stroke paints it.
    """
    shape = tuple(int(s) for s in image_level0(image_layer).shape)
    names = class_names(channel_names)
    metadata = {METADATA_KEY: True, "channel_names": list(channel_names)}
    if store_path:
        metadata["ome_zarr_path"] = store_path
    layer = viewer.add_labels(
        np.zeros(shape, dtype=np.uint8),
        name="corrections",
        scale=image_layer.scale,
        translate=image_layer.translate,
        units=image_layer.units,  # napari warns when the layers' units differ
        colormap=corrections_colormap(colors),
        features={"index": np.arange(len(names)), "class": names},
        metadata=metadata,
        opacity=0.6,
    )
    layer.selected_label = 2 if channel_names else BACKGROUND
    viewer.layers.selection.active = layer
    layer.mode = "paint"
    return layer


def image_level0(layer: Image) -> VolumeArray:
    """Full-resolution array of an image layer (multiscale or not)."""
    return layer.data[0] if getattr(layer, "multiscale", False) else layer.data


def store_path_of(*layers: Layer | None) -> str | None:
    """The store of the first of ``layers`` that has one (our reader's or napari-ome-zarr's)."""
    from napari_finetune.io.layer_store import store_of_layer

    for layer in layers:
        source = getattr(getattr(layer, "source", None), "path", None)
        path = store_of_layer(getattr(layer, "metadata", None), source)
        if path:
            return str(path)
    return None


def is_corrections_candidate(layer: Layer) -> bool:
    """Layers offered for training: made by this widget, or named like corrections.

    Other labels (a ground truth, a prediction) use other values for the
    classes; training on them by accident would teach the model nonsense.
    """
    return bool(layer.metadata.get(METADATA_KEY)) or "correction" in layer.name.lower()


class Autosaver(QObject):
    """Debounced save of one corrections layer, each one a job of the Session's runner.

    Parameters
    ----------
    layer : napari.layers.Labels
        The painted layer.
    store_path : str
        OME-Zarr store the corrections belong to (a read-only one's go to its sibling,
        :func:`~napari_finetune.session.saving.corrections_target`).
    save : callable
        ``Session.save_corrections``: ``save(labels, snapshot, store, channel_names,
        channel_colors, on_end=...)`` starts the save through the Session's runner and
        says whether it started; its end comes through the Session's events.
    delay_ms : int
        Quiet time after the last stroke before saving.
    channel_colors : sequence of str
        The classes' colours written with them (the checkpoint's).
    """

    def __init__(
        self,
        layer: Labels,
        store_path: str,
        channel_names: Sequence[str],
        save: Callable[..., bool],
        delay_ms: int = 1500,
        channel_colors: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.layer = layer
        self.store_path = store_path
        self.channel_names = list(channel_names)
        self.channel_colors = list(channel_colors)
        self._save = save
        self.saves = 0
        self.in_flight = 0
        self.snapshot_id = 0  # number of the last copy taken (see next_snapshot)
        self._dirty = False  # painted since the last copy
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(delay_ms)
        self.timer.timeout.connect(self.save_now)
        layer.events.paint.connect(self._changed)
        layer.events.data.connect(self._changed)

    def _changed(self, event: Event | None = None) -> None:
        self._dirty = True
        self.timer.start()  # restarts: one save after the strokes stop

    @property
    def pending(self) -> bool:
        """True while a save is scheduled or being written."""
        return self._timer_active() or self.in_flight > 0

    def _timer_active(self) -> bool:
        try:
            return self.timer.isActive()
        except RuntimeError:  # Qt deleted it (see _stop_timer): nothing is scheduled
            return False

    def _stop_timer(self) -> None:
        try:
            self.timer.stop()
        except RuntimeError:
            # The QTimer is already deleted: a script that ends with napari still open
            # has its Python-owned QObjects (this one, and the timer with it) destroyed
            # by PyQt at exit, in no order, before the widget's ``destroyed`` handler
            # closes this saver; the exception there aborted the process and lost the
            # painting. A deleted timer fires no more: nothing left to stop.
            pass

    @property
    def unwritten(self) -> bool:
        """The last copy taken is not in the store yet (queued, or being written)."""
        return not_yet_written(self.store_path, self.snapshot_id)

    def snapshot(self) -> np.ndarray:
        """A copy of the painted array, taken on the main thread; cancels the pending save."""
        self._stop_timer()
        self._dirty = False
        self.snapshot_id = next_snapshot()
        return np.array(self.layer.data, copy=True)

    def save_now(self) -> None:
        """Copy now, write in the Session's runner."""
        labels = self.snapshot()
        self.in_flight += 1
        if not self._save(labels, self.snapshot_id, self.store_path, self.channel_names,
                          self.channel_colors, on_end=self._ended):
            self.in_flight -= 1

    def _ended(self, saved: bool) -> None:
        self.in_flight -= 1
        self.saves += int(saved)

    def retire(self) -> None:
        """Stop following the layer (another one was chosen, or it was removed).

        A save still waiting for its timer starts now rather than being dropped:
        what was painted on a layer stays saved after the layer is gone.
        """
        pending = self._timer_active()
        self.disconnect_layer()
        if pending:
            self.save_now()

    def close(self) -> bool:
        """Write what is not on disk yet, now, on this thread.

        For closing: a save waiting for its timer would not run any more, and one
        queued in the runner may never begin (a closing front end quits those; the
        snapshot numbers keep one that does begin from writing over this newer copy).
        Waits for a background save that holds the store's lock. Returns True when
        something was written.
        """
        self.disconnect_layer()
        if not (self._dirty or self.unwritten):
            return False
        labels = self.snapshot()
        try:
            save_corrections_locked(self.store_path, labels, self.channel_names,
                                              self.snapshot_id, self.channel_colors)
        except Exception as exc:  # disk full, read-only: one line, then close anyway
            print(f"napari-finetune: the corrections could not be saved into "
                  f"{corrections_target(self.store_path)} at close: {exc}", file=sys.stderr)
            return False
        self.saves += 1
        return True

    def disconnect_layer(self) -> None:
        """Stop following the layer (another layer was chosen, or the widget closes)."""
        self._stop_timer()
        for emitter in (self.layer.events.paint, self.layer.events.data):
            try:
                emitter.disconnect(self._changed)
            except (TypeError, ValueError, RuntimeError):
                pass

