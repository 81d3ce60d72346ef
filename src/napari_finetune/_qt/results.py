"""The result buttons: Export, Save predictions, Paint here next, bioimage.io.

Each is the widget's Session's action: the click fills the Session's inputs
from the widget (layers, checkpoint, roles) and starts it through the
:class:`~napari_finetune._qt.actions.Controller`, which shows how it ended;
what it came to is shown here. The slow parts (predicting the volume, writing
and testing a package) run in workers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from napari.utils.notifications import show_info

from napari_finetune._qt import corrections as corr
from napari_finetune._qt import suggest
from napari_finetune._qt.actions import Controller, say
from napari_finetune._qt.layers import (
    OBJECTS_KEY,
    PREDICTION_KEY,
    objects_layers,
    prediction_layers,
)
from napari_finetune.arrays import AxesImage


def paint_here_next(c: Controller) -> None:
    """The Session's ``suggest``: the uncertainty of the current weights (computed once,
    then shown as a layer), and the view moved to the next region to paint."""
    s, layer, session = c.state, c.w.image_layer(), c.session
    if layer is None or s.info is None or s.busy is not None:
        return
    try:
        config = c.w.settings.config()
    except ValueError as exc:
        c.fail(exc, "Invalid settings")
        return
    # The image the model runs on: a store's time series comes with its axes (an
    # AxesImage), so the suggestion's centre is (t, y, x), not a volume's (z, y, x).
    if (image := c.model_image("Cannot suggest")) is None:
        return
    info, painted = s.info, c.w.corrections_layer()
    session.image, session.checkpoint, session.trust = image, info.path, info.trust
    session.channel_names, session.channel_colors = list(info.channel_names), list(info.colors)
    session.trainer = s.trainer  # the last run's weights, else the checkpoint's
    session.corrections = None if painted is None else painted.data
    # The form's patch: the Session suggests half of it (a region a few strokes cover).
    session.config = replace(config, device=c.w.settings.device_name())
    before = session.uncertainty
    c.start_action(session.suggest, done=lambda: _suggested(c, before))


def _suggested(c: Controller, before: np.ndarray | None) -> None:
    s, session = c.state, c.session
    unsure, suggestion = session.uncertainty, session.suggestion
    if unsure is not None and unsure is not before:  # computed anew: other weights
        suggest.show_uncertainty(c.w.viewer, c.w.image_layer(), unsure)
        c.w.status_panel.set_idle("uncertainty updated")
    s.suggested = list(session.suggested)
    # The painting's axes name the centre's coordinates: t= for a time point, not z=.
    axes = AxesImage.of(session.image).labels_axes if session.image is not None else None
    c.w.status_panel.append_log(suggest.describe(suggestion, axes))
    if suggestion is not None:
        suggest.go_to(c.w.viewer, c.w.image_layer(), suggestion)


def export_bioimageio(c: Controller, path: str) -> None:
    """The Session's bioimage.io export: the fine-tuned weights (or the checkpoint's),
    with the instance roles as the editor holds them, tested by bioimage.io."""
    s, layer, session = c.state, c.w.image_layer(), c.session
    if layer is None or s.info is None or s.busy is not None:
        return
    # The Session refuses invalid roles (the editor shows a value the package could not keep).
    session.image, session.checkpoint, session.trust = (
        corr.image_level0(layer), s.info.path, s.info.trust)
    session.trainer = s.trainer  # the last run's weights, else the checkpoint's
    session.roles, session.roles_error = dict(s.roles), s.roles_error
    c.start_action(lambda: session.export_bioimageio(path), done=lambda: _packaged(c))


def _packaged(c: Controller) -> None:
    written = c.session.package
    if written is not None:
        c.w.output_label.setText(f"bioimage.io package written to {written}")
        c.w.output_label.setToolTip(written)
        show_info(f"bioimage.io model package written to {written} (bioimage.io tests passed)")


def default_export_path(c: Controller) -> str:
    """``<store>/../<name>-finetuned.pt`` next to the data, else next to the checkpoint."""
    store = c.w.store_hint()
    if store is not None:
        return str(store.parent / f"{store.name.split('.')[0]}-finetuned.pt")
    info = c.state.info
    ckpt = Path(info.path) if info else Path.home() / "model.pt"
    return str(ckpt.with_name(f"{ckpt.stem}-finetuned.pt"))


def export(c: Controller, path: str) -> None:
    """``trainer.export(path)`` in a worker, with the instance roles as the editor holds
    them; the path is shown and notified."""
    s = c.state
    if s.trainer is None or s.busy is not None:
        return
    # The Session's action (it refuses invalid roles: the editor shows a value the file
    # could not keep); the Controller shows where it was written when it ends.
    session = c.session
    session.trainer, session.roles, session.roles_error = s.trainer, dict(s.roles), s.roles_error
    c.start_action(lambda: session.export(path), done=lambda: _exported(c))


def _exported(c: Controller) -> None:
    c.state.exported = path = c.session.exported
    if path is not None:  # set before the job ended
        say(c.w.output_label, "exported to {}", path)
        show_info(f"Fine-tuned checkpoint exported to {path}")


def save_predictions(c: Controller) -> None:
    """The Session's save: each prediction layer into the store as
    ``labels/prediction-<channel>``, and the objects layers of that prediction as
    ``labels/objects-<channel>``, as the layers show them (edits included)."""
    s, session = c.state, c.session
    store = corr.store_path_of(c.w.image_layer())
    layers = prediction_layers(c.w.viewer, s.info.channel_names) if s.info else []
    if store is None or not layers or s.info is None:
        c.fail(ValueError("predict first, on an image opened from an OME-Zarr store"),
               "Cannot save predictions")
        return
    # Copies: the user may paint on the layers while the worker writes them.
    masks = {layer.metadata[PREDICTION_KEY]: np.array(layer.data, copy=True) for layer in layers}
    # The Objects of this prediction only: those of an earlier one would not match its masks.
    objects = {layer.metadata[OBJECTS_KEY]: np.array(layer.data, dtype=np.uint32, copy=True)
               for layer in objects_layers(c.w.viewer, s.prediction_id)}
    session.store = store
    session.channel_names, session.channel_colors = (
        list(s.info.channel_names), list(s.info.colors))

    def written() -> None:
        c.w.output_label.setText(f"predictions written as labels: {', '.join(session.saved)}")
        show_info(f"Predictions saved into {store}")

    c.start_action(lambda: session.save_predictions(masks, objects), done=written)
