"""What each button does: start a job, then route its events to labels and layers.

Kept apart from the layout (widget.py) so each action reads top to bottom:
check the inputs on the main thread (cheap), copy what the worker needs,
start the job, and handle its events. Errors become napari notifications
with the engine's message, and the widget goes back to idle.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from napari.utils.notifications import show_error, show_info, show_warning

from napari_finetune import palette
from napari_finetune._qt import corrections as corr
from napari_finetune._qt import results
from napari_finetune._qt import worker as jobs
from napari_finetune._qt.layers import (
    PREDICTION_KEY,
    add_empty_predictions_later,
    apply_preview,
    prediction_layers,
    show_predictions,
)
from napari_finetune._qt.state import CheckpointInfo, release_trainer, shut_down
from napari_finetune._qt.trust import ask_to_trust, describe_factory, untrusted_factory


def say(label: Any, template: str, path: str) -> None:
    """``template`` with the file's name; the full path in the tooltip (labels stay narrow)."""
    label.setText(template.format(Path(path).name))
    label.setToolTip(str(path))


def _fail(w: Any, exc: Exception, what: str) -> None:
    message = f"{what}: {exc}"
    w.state.errors.append(message)
    w.status_panel.append_log(message)
    show_error(message)


def run_job(
    w: Any, busy: str | None, job: Any, *args: Any, what: str, **kwargs: Any
) -> None:
    """Start ``job`` with the widget's event routing; ``busy`` marks the widget while it runs."""
    s = w.state
    if s.closed:
        return  # closing: no new work (e.g. the prediction after a run)

    def on_event(event: tuple) -> None:
        if s.closed:  # the widget may be deleted: keep the record, touch no widget
            if event[0] == "trainer":
                s.trainer = event[1]
            elif event[0] == "status":
                s.statuses.append(event[1])
            return
        try:
            handle_event(w, event, what)
        except RuntimeError as exc:  # "wrapped C/C++ object ... has been deleted"
            if "deleted" not in str(exc):
                raise
            shut_down(s, 0.0)  # end the run at the next step

    def on_finished() -> None:
        s.running -= 1
        if worker in s.jobs:
            s.jobs.remove(worker)
        if busy is not None and s.busy == busy:
            s.busy = None
            s.worker = None
        if s.closed:
            return
        w._refresh_buttons()
        if busy == "train":
            after_training(w)

    if busy is not None:
        s.busy = busy
    s.running += 1
    worker = jobs.start_job(job, *args, on_event=on_event, on_finished=on_finished, **kwargs)
    s.worker = worker
    s.jobs.append(worker)
    w._refresh_buttons()


def handle_event(w: Any, event: tuple, what: str) -> None:
    """Main-thread side of every job event."""
    kind, s = event[0], w.state
    if kind == "progress":
        w.status_panel.show_progress(event[1], event[2], event[3])
    elif kind == "info":
        if event[1].path != w.checkpoint_edit.text().strip():
            return  # a file chosen before the current one answered late
        s.info = i = event[1]
        w.checkpoint_label.setText(
            f"{Path(i.path).name}: {i.dims}D, channels {', '.join(i.channel_names)}"
        )
        follow_corrections(w, w.corrections_combo.layer())
    elif kind == "untrusted":
        answer_untrusted(w, event[1], event[2])
    elif kind == "prediction":
        show_predictions(w.viewer, w.image_combo.layer(), s.info.channel_names, s.info.colors,
                         event[1], corr.store_path_of(w.image_combo.layer()))
        w.status_panel.set_idle(f"{s.run_summary}; prediction updated" if s.run_summary
                                else "prediction done")
        s.run_summary = ""
    elif kind == "saved":
        say(w.autosave_label, "corrections saved into {} (labels/corrections)", event[1])
    elif kind == "trainer":
        s.trainer = event[1]
    elif kind == "status":
        s.statuses.append(event[1])
        s.timings.setdefault("first_status_s", time.perf_counter() - s.clicked_at)
        w.status_panel.show_status(event[1])
    elif kind == "preview":
        if apply_preview(w.viewer, s.info.channel_names, event[1], event[2]):
            s.previews += 1
            s.timings.setdefault("first_preview_s", time.perf_counter() - s.clicked_at)
    elif kind == "exported":
        s.exported = event[1]
        say(w.output_label, "exported to {}", event[1])
        show_info(f"Fine-tuned checkpoint exported to {event[1]}")
    elif kind == "written":
        w.output_label.setText(f"predictions written as labels: {', '.join(event[1])}")
        show_info(f"Predictions saved into {corr.store_path_of(w.image_combo.layer())}")
    elif kind in ("uncertainty", "suggestion", "packaged"):
        results.handle_event(w, event)
    elif kind == "error":
        _fail(w, event[1], what)
        if what.startswith("Cannot use this checkpoint"):
            w.checkpoint_label.setText("no usable checkpoint: choose another file")
    w._refresh_buttons()


def warm_up(w: Any) -> None:
    """Start importing the engine and PEFT in the background (see ``warm_up_job``)."""
    run_job(w, None, jobs.warm_up_job, what="Loading the fine-tuning engine failed")


def _info_job(path: str, trust: tuple[str, ...] = ()) -> jobs.Job:
    from napari_finetune.model.checkpoint import CheckpointError, load_checkpoint

    try:
        # The allow-list is checked on the factory's name before anything is imported.
        ckpt = load_checkpoint(path, trust=trust)
    except CheckpointError:
        factory = untrusted_factory(path, trust)
        if factory is None:
            raise
        yield ("untrusted", path, factory)  # the widget asks the user; nothing was imported
        return
    names = ckpt.channel_names
    yield ("info", CheckpointInfo(
        path=path, channel_names=names, colors=palette.channel_colors(names, ckpt.metadata),
        normalization=ckpt.normalization, dims=int(getattr(ckpt.model, "dims", 3)),
        trust=tuple(trust),
    ))


def load_info(w: Any, path: str, trust: tuple[str, ...] = ()) -> None:
    """Read the checkpoint's channels in a worker (a bad file -> notification)."""
    if not path or (w.state.info is not None and w.state.info.path == path):
        return
    release_trainer(w.state)  # a new model: the old run's weights no longer apply
    w.state.info = None
    w.checkpoint_label.setText("reading checkpoint…")
    run_job(w, None, _info_job, path, trust, what="Cannot use this checkpoint")


def answer_untrusted(w: Any, path: str, factory: str) -> None:
    """Ask whether to trust ``factory``; Yes reads the file again with it trusted."""
    if path != w.checkpoint_edit.text().strip():
        return  # another file was chosen meanwhile
    if ask_to_trust(w, path, factory):
        load_info(w, path, trust=(factory,))
        return
    package, _ = describe_factory(factory)
    message = (f"{Path(path).name} was not loaded: its model is built by {factory} "
               f"(package '{package}'), which you did not trust. Nothing from it was "
               "imported or run; choose another checkpoint.")
    w.status_panel.append_log(message)
    show_warning(message)
    w.checkpoint_label.setText("not loaded: its model code was not trusted")


def predict(w: Any) -> None:
    """Whole-volume prediction: with the fine-tuned weights after a run, else the checkpoint's."""
    s, layer = w.state, w.image_combo.layer()
    if layer is None or s.info is None:
        return
    model = s.trainer.model if s.trainer is not None else None
    run_job(w, "predict", jobs.predict_job, s.info.path, corr.image_level0(layer),
         len(s.info.channel_names), w.settings.device.currentText(), model=model,
         normalization=s.info.normalization, trust=s.info.trust, what="Prediction failed")


def new_corrections_layer(w: Any) -> Any:
    """An empty corrections layer with the model's classes, ready to paint."""
    image, info = w.image_combo.layer(), w.state.info
    if image is None or info is None:
        return None
    return corr.add_corrections_layer(w.viewer, image, info.channel_names, info.colors,
                                      corr.store_path_of(image))


def follow_corrections(w: Any, layer: Any) -> None:
    """Autosave ``layer`` into its (or the image's) store; stop following the previous one."""
    s = w.state
    if s.autosaver is not None:
        if s.autosaver.layer is layer:
            return
        s.autosaver.retire()  # a pending save is written, not dropped
        s.retired_savers = [saver for saver in s.retired_savers if saver.jobs]
        s.retired_savers.append(s.autosaver)
        s.autosaver = None
    if layer is None:
        return
    store = corr.store_path_of(layer, w.image_combo.layer())
    if store is None:
        w.autosave_label.setText("corrections: not autosaved (the image is not from an OME-Zarr)")
        return
    names = layer.metadata.get("channel_names") or (s.info.channel_names if s.info else [])
    s.autosaver = corr.Autosaver(
        layer, store, names, jobs.start_call,
        on_saved=lambda p: say(w.autosave_label, "corrections autosaved into {}", p),
        on_error=lambda exc: _fail(w, exc, "Autosave of the corrections failed"),
    )
    say(w.autosave_label, "corrections autosave into {}", store)


def finetune(w: Any) -> None:
    """Copy the corrections, start the training job (save, build, run, preview)."""
    s, image, layer = w.state, w.image_combo.layer(), w.corrections_combo.layer()
    if s.busy is not None or image is None or layer is None or s.info is None:
        return
    data = corr.image_level0(image)
    if tuple(layer.data.shape) != tuple(data.shape):
        _fail(w, ValueError(f"corrections {layer.data.shape} and image {data.shape} differ in "
                            "shape; paint a layer made with 'New corrections layer'."),
              "Cannot fine-tune")
        return
    try:
        config = w.settings.config()
    except ValueError as exc:
        _fail(w, exc, "Invalid settings")
        return
    if s.autosaver is not None and s.autosaver.layer is layer:
        labels, snapshot = s.autosaver.snapshot(), s.autosaver.snapshot_id
    else:
        labels, snapshot = np.array(layer.data, copy=True), corr.next_snapshot()
    store = corr.store_path_of(layer, image)
    release_trainer(s)
    s.statuses, s.previews, s.timings = [], 0, {}
    w.status_panel.start_run(config.steps)
    s.busy, s.stop_requested = "train", False  # the job starts after the layers
    w._refresh_buttons()

    def start() -> None:
        if s.stop_requested:  # Stop was pressed while the layers were added
            s.busy = None
            w._refresh_buttons()
            w.status_panel.set_idle("stopped before the first step")
            return
        run_job(w, "train", jobs.train_job, s.info.path, data, labels, store, s.info.channel_names,
             config, w.settings.preview_interval_s, lambda: s.region,
             model_hook=w._model_hook, trainer_hook=w._trainer_hook, trust=s.info.trust,
             snapshot=snapshot, what="Fine-tuning failed")

    # The previews need the layers, but not this handler: one layer per event-loop turn.
    add_empty_predictions_later(w.viewer, image, s.info.channel_names, s.info.colors,
                                tuple(int(n) for n in data.shape), store,
                                alive=lambda: not s.closed, then=start)


def after_training(w: Any) -> None:
    """Say how the run ended; refresh the whole prediction with the new weights."""
    s = w.state
    last = s.statuses[-1] if s.statuses else None
    s.run_summary = f"{last.kind}: step {last.step} / {last.total_steps}" if last else ""
    w.status_panel.set_idle(s.run_summary or "not started")
    if s.trainer is not None and last is not None and prediction_layers(
        w.viewer, s.info.channel_names
    ):
        predict(w)


def default_export_path(w: Any) -> str:
    """``<store>/../<name>-finetuned.pt`` next to the data, else next to the checkpoint."""
    store = w.store_hint()
    if store is not None:
        stem = store.name.split(".")[0]
        return str(store.parent / f"{stem}-finetuned.pt")
    ckpt = Path(w.state.info.path) if w.state.info else Path.home() / "model.pt"
    return str(ckpt.with_name(f"{ckpt.stem}-finetuned.pt"))


def export(w: Any, path: str) -> None:
    """``trainer.export(path)`` in a worker; the path is shown and notified."""
    if w.state.trainer is None or w.state.busy is not None:
        return
    run_job(w, "export", jobs.export_job, w.state.trainer, path, what="Export failed")


def save_predictions(w: Any) -> None:
    """Write each prediction layer into the store as ``labels/prediction-<channel>``."""
    s = w.state
    store = corr.store_path_of(w.image_combo.layer())
    layers = prediction_layers(w.viewer, s.info.channel_names) if s.info else []
    if store is None or not layers:
        _fail(w, ValueError("predict first, on an image opened from an OME-Zarr store"),
              "Cannot save predictions")
        return
    arrays = [(f"prediction-{layer.metadata[PREDICTION_KEY]}", np.array(layer.data, copy=True))
              for layer in layers]
    run_job(w, "save", jobs.save_predictions_job, store, arrays, what="Saving predictions failed")

