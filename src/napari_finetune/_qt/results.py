"""The result buttons: Export, Save predictions, Paint here next, bioimage.io.

Export is the widget's Session's action; the others start a job through the
:class:`~napari_finetune._qt.actions.Controller` and handle its result here;
the slow parts (predicting the volume, writing and testing a package) run in workers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from napari.utils.notifications import show_info

from napari_finetune._qt import corrections as corr
from napari_finetune._qt import share, suggest
from napari_finetune._qt.actions import Controller, say
from napari_finetune._qt.layers import (
    OBJECTS_KEY,
    PREDICTION_KEY,
    objects_layers,
    prediction_layers,
)
from napari_finetune.session import derived, jobs
from napari_finetune.session.session import Busy
from napari_finetune.uncertainty import Suggestion


def _weights_key(c: Controller) -> tuple:
    """Which weights an uncertainty map belongs to (a new run or checkpoint: a new map)."""
    s = c.state
    if s.trainer is not None:
        return ("trainer", id(s.trainer), s.trainer.steps_done)
    return ("checkpoint", s.info.path if s.info else None)


def paint_here_next(c: Controller) -> None:
    """Predict the uncertainty (once per set of weights), then suggest the next region."""
    s, layer = c.state, c.w.image_layer()
    if layer is None or s.info is None or s.busy is not None:
        return
    key = _weights_key(c)
    if s.uncertainty is not None and s.uncertainty_key == key:
        _suggest(c)
        return
    s.uncertainty, s.uncertainty_key, s.suggested = None, key, []
    model = s.trainer.model if s.trainer is not None else None

    def computed(unsure: np.ndarray) -> None:
        s.uncertainty = unsure
        suggest.show_uncertainty(c.w.viewer, c.w.image_layer(), unsure)
        c.w.status_panel.set_idle("uncertainty updated")
        _suggest(c)

    c.run_job(Busy.SUGGEST, derived.uncertainty_job, s.info.path, corr.image_level0(layer),
              len(s.info.channel_names), c.w.settings.device_name(), model=model,
              normalization=s.info.normalization, trust=s.info.trust,
              what="Computing the uncertainty failed", on_result=computed)


def _suggest(c: Controller) -> None:
    s = c.state
    if s.uncertainty is None:
        return
    painted = c.w.corrections_layer()
    corrections = None if painted is None else painted.data
    # Half a training patch: a region a few strokes cover, and a patch's context around it.
    patch = c.w.settings.config().patch_shape[-s.uncertainty.ndim:]
    region = tuple(max(1, p // 2) for p in patch)

    def suggested(suggestion: Suggestion | None) -> None:
        c.w.status_panel.append_log(suggest.describe(suggestion))
        if suggestion is not None:
            s.suggested.append(suggestion.box)
            suggest.go_to(c.w.viewer, c.w.image_layer(), suggestion)

    c.run_job(None, derived.suggest_job, s.uncertainty, corrections, region,
              list(s.suggested), what="Suggesting a region failed", on_result=suggested)


def export_bioimageio(c: Controller, path: str) -> None:
    """Write a bioimage.io package of the fine-tuned weights (or the checkpoint's), with
    the instance roles as the editor holds them."""
    s, layer = c.state, c.w.image_layer()
    if layer is None or s.info is None or s.busy is not None:
        return
    if s.roles_error:  # the editor shows a value the package could not keep
        c.fail(ValueError(s.roles_error), "Cannot export")
        return
    source = s.trainer if s.trainer is not None else s.info.path

    def packaged(written: str) -> None:
        c.w.output_label.setText(f"bioimage.io package written to {written}")
        c.w.output_label.setToolTip(written)
        show_info(f"bioimage.io model package written to {written} (bioimage.io tests passed)")

    c.run_job(Busy.EXPORT, share.bioimageio_job, source, path, corr.image_level0(layer),
              trust=s.info.trust, roles=dict(s.roles), what="bioimage.io export failed",
              on_result=packaged)


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
    if s.roles_error:  # the editor shows a value the file could not keep
        c.fail(ValueError(s.roles_error), "Cannot export")
        return
    # The Session's action; the Controller shows where it was written when it ends.
    session = c.session
    session.trainer, session.roles = s.trainer, dict(s.roles)
    c.start_action(lambda: session.export(path), done=lambda: _exported(c))


def _exported(c: Controller) -> None:
    c.state.exported = path = c.session.exported
    if path is not None:  # set before the job ended
        say(c.w.output_label, "exported to {}", path)
        show_info(f"Fine-tuned checkpoint exported to {path}")


def save_predictions(c: Controller) -> None:
    """Write each prediction layer into the store as ``labels/prediction-<channel>``, and
    the objects layers of that prediction as ``labels/objects-<channel>``."""
    s = c.state
    store = corr.store_path_of(c.w.image_layer())
    layers = prediction_layers(c.w.viewer, s.info.channel_names) if s.info else []
    if store is None or not layers:
        c.fail(ValueError("predict first, on an image opened from an OME-Zarr store"),
               "Cannot save predictions")
        return
    colors = dict(zip(s.info.channel_names, s.info.colors, strict=True))
    arrays = [(layer.metadata[PREDICTION_KEY], colors[layer.metadata[PREDICTION_KEY]],
               np.array(layer.data, copy=True)) for layer in layers]
    # The Objects of this prediction only: those of an earlier one would not match its masks.
    objects = [(layer.metadata[OBJECTS_KEY], np.array(layer.data, dtype=np.uint32, copy=True))
               for layer in objects_layers(c.w.viewer, s.prediction_id)
               if tuple(layer.data.shape) == tuple(arrays[0][2].shape)]

    def written(names: list[str]) -> None:
        c.w.output_label.setText(f"predictions written as labels: {', '.join(names)}")
        show_info(f"Predictions saved into {store}")

    c.run_job(Busy.SAVE, jobs.save_predictions_job, store, arrays, objects,
              what="Saving predictions failed", on_result=written)
