"""What each button does: start a job, then route its events and result to labels and layers.

Kept apart from the layout (widget.py) so each action reads top to bottom:
check the inputs on the main thread (cheap), copy what the worker needs,
start the job, and handle what it reports. A failure comes through the
worker's ``errored`` signal and becomes a napari notification with the
engine's message; the buttons follow :class:`WidgetState` on their own.

Every job is the widget's :class:`~napari_finetune.session.session.Session`'s
(run by napari's thread worker): the actions (Predict, Fine-tune, Stop,
Objects, Export), the checkpoint read (its trust question answered with the
dialog), the warm-up and the autosave. The click fills the Session's inputs
and calls it; the Session's ``busy`` becomes the widget's, its job events
feed the status panel, its ``refused`` reason and a failure's one line are
shown, and the prediction it ended with goes into the widget's layers (named
and coloured by channel, so the Session is given no viewer of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from napari.utils.notifications import show_error, show_warning
from qtpy.QtWidgets import QLabel

from napari_finetune._qt import corrections as corr
from napari_finetune._qt.layers import (
    apply_preview,
    fit_prediction_layers_later,
    prediction_layers,
    prediction_name,
    show_predictions,
)
from napari_finetune._qt.objects_step import show_checkpoint_roles
from napari_finetune._qt.state import release_trainer, shut_down
from napari_finetune._qt.trust import ask_to_trust
from napari_finetune._qt.viewer_port import NapariViewerPort
from napari_finetune.session.checkpoint import CheckpointInfo, CheckpointUnusable, Untrusted
from napari_finetune.session.events import (
    Event,
    Preview,
    PreviewFailed,
    Progress,
    RegionPredicted,
    RunStatus,
    Saved,
    TrainerReady,
)
from napari_finetune.session.saving import CorrectionsFailed, CorrectionsSaved
from napari_finetune.session.session import ActionEnd, Busy, Outcome, Session

if TYPE_CHECKING:
    from napari.layers import Image, Labels

    from napari_finetune._qt.view import WidgetView
    from napari_finetune.arrays import AxesImage, VolumeArray
    from napari_finetune.session import jobs  # a type only: the jobs are the Session's

def _nothing() -> None:
    """The default hook: nothing to do."""


def dock_layer_name(name: str) -> str:
    """The dock's layer for a name the Session gives: the Session's
    ``"prediction-<channel>"`` is the dock's ``"<channel> prediction"``."""
    channel = name.removeprefix("prediction-")
    return prediction_name(channel) if channel != name else name


def say(label: QLabel, template: str, path: str) -> None:
    """``template`` with the file's name; the full path in the tooltip (labels stay narrow)."""
    label.setText(template.format(Path(path).name))
    label.setToolTip(str(path))


class Controller:
    """The widget's actions; it reads and writes only the widget's public members."""

    def __init__(self, widget: WidgetView) -> None:
        self.w = widget
        self.state = widget.state
        # The Session writes a prediction's view tiles through the port, in place, into
        # the widget's prediction layers; whole results stay the widget's to show (with
        # its colours, its store, one layer a turn: ``show_predictions``).
        port = NapariViewerPort(widget.viewer, lambda: self.session.region,
                                image=widget.image_layer, below=widget.corrections_layer,
                                layer_name=dock_layer_name, whole=False)
        self.session = Session(self.state.runner, viewer=port)
        self.state.session = self.session
        events = self.session.events
        events.busy.connect(self._session_busy)
        events.job_event.connect(self._session_event)
        events.refused.connect(self._refused)
        events.ended.connect(self._ended)
        events.warmed.connect(self._warmed)
        events.failed.connect(self._background_failed)
        events.checkpoint_read.connect(self._info_read)
        events.trust_asked.connect(self._trust_asked)
        events.checkpoint_unusable.connect(self._unusable)
        events.corrections_saved.connect(self._corrections_saved)
        events.corrections_failed.connect(self._corrections_failed)
        # What to do when the action started last ends done, or failed (its one line shown).
        self._done: Callable[[], None] = _nothing
        self._failed: Callable[[], None] = _nothing
        self._after: Callable[[ActionEnd], None] | None = None
        self.refusal = ""  # the Session's last refusal (a step shows it in its own label)

    def fail(self, exc: BaseException, what: str) -> None:
        """Log and notify ``what: message`` (the engine's own message)."""
        message = f"{what}: {exc}"
        self.state.errors.append(message)
        self.w.status_panel.append_log(message)
        show_error(message)

    # -- the Session's events ----------------------------------------------------------------
    def _session_busy(self, busy: Busy | None) -> None:
        self.state.busy = busy  # the Session's, holds included (its results being shown)

    def _session_event(self, event: Event) -> None:
        s = self.state
        if s.closed:  # the widget may be deleted: keep the run's record, touch no widget
            if isinstance(event, TrainerReady):
                s.trainer = event.trainer
            elif isinstance(event, RunStatus):
                s.statuses.append(event.status)
            return
        try:
            self.handle(event)
        except RuntimeError as exc:  # "wrapped C/C++ object ... has been deleted"
            if "deleted" not in str(exc):
                raise
            shut_down(s, 0.0)  # as if closed: the painting saved, the run ended at its step

    def _refused(self, reason: str) -> None:
        self.refusal = reason
        if not self.state.closed:
            self.w.status_panel.append_log(reason)
            show_warning(reason)

    def start_action(
        self, start: Callable[[], bool], done: Callable[[], None] = _nothing,
        failed: Callable[[], None] = _nothing,
        ended: Callable[[ActionEnd], None] | None = None,
    ) -> bool:
        """Start one of the Session's actions (``start``: e.g. ``session.predict``); ``done``
        runs when it ended done, ``failed`` after its failure's one line was shown, and
        ``ended`` last, however it ended (not once the widget closed). False: refused."""
        if self.state.closed:
            return False  # closing: no new work (e.g. the prediction after a run)
        self._done, self._failed, self._after = done, failed, ended
        if not start():
            self._done, self._failed, self._after = _nothing, _nothing, None
            return False
        self.state.running += 1
        return True

    def _ended(self, end: ActionEnd) -> None:
        s = self.state
        s.running -= 1
        done, failed, after = self._done, self._failed, self._after
        self._done, self._failed, self._after = _nothing, _nothing, None
        if end.outcome is Outcome.FAILED:
            s.errors.append(end.reason)
            if not s.closed:
                self.w.status_panel.append_log(end.reason)
                show_error(end.reason)
                failed()
        elif end.outcome is Outcome.DONE and not s.closed:
            done()
        if after is not None and not s.closed:
            after(end)

    def handle(self, event: Event) -> None:
        """Main-thread side of every job event."""
        s, panel = self.state, self.w.status_panel
        if isinstance(event, Progress):
            panel.show_progress(event.done, event.total, event.what)
        elif isinstance(event, Saved):
            say(self.w.autosave_label, "corrections saved into {} (labels/corrections)",
                event.store)
        elif isinstance(event, TrainerReady):
            s.trainer = event.trainer
        elif isinstance(event, RunStatus):
            s.statuses.append(event.status)
            s.mark("first_status_s")
            panel.show_status(event.status)
        elif isinstance(event, RegionPredicted):  # the Session wrote it through the port
            panel.say("the view shows as it is predicted; the rest follows…")
        elif isinstance(event, PreviewFailed):
            panel.append_log(f"Preview failed, the run goes on: {event.line}")
        elif isinstance(event, Preview) and s.info is not None:
            if apply_preview(self.w.viewer, s.info.channel_names, event.region, event.probs):
                s.previews += 1
                s.mark("first_preview_s")

    # -- the checkpoint ----------------------------------------------------------------------
    def warm_up(self, lora: bool) -> None:
        """Import the engine, and PEFT for a LoRA run, in the background (``warm_up_job``).

        A Predict clicked meanwhile waits for it (:meth:`run_queued`): its job would
        import torch's modules in a second thread beside this one.
        """
        if self.state.closed:
            return  # closing: no new work
        self.session.warm_up(lora)  # through the Session's runner, with its other jobs
        self.state.warming = self.session.warming

    def _warmed(self) -> None:
        s = self.state
        s.warming = self.session.warming
        if not s.closed:
            self.run_queued()

    def _background_failed(self, line: str) -> None:
        s = self.state
        s.errors.append(line)
        if not s.closed:
            self.w.status_panel.append_log(line)
            show_error(line)

    def load_info(self, path: str) -> None:
        """Read the checkpoint's channels through the Session (a bad file -> notification;
        a model code outside the allow-list -> the trust question)."""
        s = self.state
        if s.closed or not path or (s.info is not None and s.info.path == path):
            return
        release_trainer(s)  # a new model: the old run's weights no longer apply
        s.probabilities, s.predicted_image = {}, None  # its roles and channels may differ
        s.roles, s.roles_error = {}, ""
        self.w.roles_editor.show_roles({})  # no rows until this model's channels are known
        s.info = None
        self.w.settings.set_lora_share(0.0)
        self.w.checkpoint_label.setText("reading checkpoint…")
        s.reading = True
        self.session.read_checkpoint(path)

    def _info_read(self, result: CheckpointInfo) -> None:
        s = self.state
        if s.closed or result.path != self.w.checkpoint_path():
            return  # a file chosen before the current one answered late
        s.reading = False
        s.info = result
        saver = s.autosaver
        if saver is not None and (colors := result.colors_for(saver.channel_names)):
            saver.channel_colors = colors  # followed before the file was read
        self.w.settings.set_lora_share(result.lora_share_per_rank)
        self.w.checkpoint_label.setText(
            f"{Path(result.path).name}: {result.dims}D, channels {', '.join(result.channel_names)}"
        )
        show_checkpoint_roles(self)
        self.follow_corrections(self.w.corrections_layer())
        self.run_queued()

    def _trust_asked(self, request: Untrusted) -> None:
        """The Session asks whether to trust the file's model code: the modal dialog, its
        answer given back (a closed widget refuses without asking)."""
        trusted = not self.state.closed and request.path == self.w.checkpoint_path() and (
            ask_to_trust(self.w.dialog_parent(), request.path, request.factory))
        self.session.answer_trust(request, trusted)

    def _unusable(self, end: CheckpointUnusable) -> None:
        s = self.state
        if s.closed or end.path != self.w.checkpoint_path():
            s.errors.append(end.line)
            return  # a file chosen since is being read
        s.reading = False
        self.w.status_panel.append_log(end.line)
        if end.untrusted:
            show_warning(end.line)
            self.w.checkpoint_label.setText("not loaded: its model code was not trusted")
            self.drop_queued("its model code was not trusted")
        else:
            s.errors.append(end.line)
            show_error(end.line)
            self.w.checkpoint_label.setText("no usable checkpoint: choose another file")
            self.drop_queued("no usable checkpoint")

    # -- predict and paint -------------------------------------------------------------------
    def predict(self) -> None:
        """Whole volume: with the fine-tuned weights after a run, else the checkpoint's.

        Clicked before the model is there (its checkpoint being read, the engine
        imported), the click is kept: the prediction starts as soon as both are done.
        """
        s, layer, session = self.state, self.w.image_layer(), self.session
        if s.closed or layer is None:
            return  # closing: no new work (e.g. the prediction after a run)
        if s.info is None and not s.reading:
            self._refused("Cannot predict: no model; choose a checkpoint first.")
            return
        if s.info is None or s.warming:
            s.queued = True
            self.w.status_panel.say("Predict is waiting for the model…")
            return
        s.queued = False  # a kept click is served by this prediction, whoever started it
        info = s.info
        if (image := self.model_image("Cannot predict")) is None:
            return
        session.image, session.checkpoint, session.trust = image, info.path, info.trust
        session.channel_names, session.channel_colors = list(info.channel_names), list(info.colors)
        # The channels with a role (the editor's, now) keep their probability too, for
        # the Objects step.
        session.roles = dict(s.roles)
        session.trainer = s.trainer  # the last run's weights, else the checkpoint's
        session.config = replace(session.config, device=self.w.settings.device_name())
        def stopped(end: ActionEnd) -> None:  # Stop keeps what was predicted: shown too
            if end.outcome is Outcome.STOPPED:
                self.w.status_panel.append_log(end.reason)
                self._show_prediction(session.prediction)

        if self.start_action(session.predict,
                             done=lambda: self._show_prediction(session.prediction),
                             ended=stopped):
            # At once, not at the first block's end: the model is still being loaded.
            self.w.status_panel.say("predicting…")

    def model_image(self, what: str) -> VolumeArray | AxesImage | None:
        """The image the model runs on (the chosen channel of a store of several); None,
        with the one line said, when the channel is not chosen yet."""
        from napari_finetune.arrays import ChannelChoiceError

        try:
            return self.w.model_image()
        except ChannelChoiceError as exc:
            self._refused(f"{what}: {exc}")
            return None

    def run_queued(self) -> None:
        """Start the Predict clicked before the model was there, once it is (and the
        engine imported); still kept while another action runs."""
        s = self.state
        if s.queued and not s.closed and s.info is not None and not s.warming \
                and s.busy is None:
            s.queued = False
            self.predict()

    def drop_queued(self, why: str) -> None:
        """The model will not come: say so to a Predict that waited for it."""
        s = self.state
        if s.queued:
            s.queued = False
            self.w.status_panel.say(f"Predict not started: {why}")

    def _show_prediction(self, prediction: jobs.Prediction | None) -> None:
        s, image = self.state, self.w.image_layer()
        if s.info is None or image is None or prediction is None:
            return
        info, masks = s.info, prediction.masks
        s.probabilities = {info.channel_names[i]: p for i, p in prediction.probabilities.items()}
        s.predicted_image, s.prediction_id = image, s.prediction_id + 1
        if not self.session.hold(Busy.SHOW):  # the buttons wait for the layers
            return

        def show() -> None:  # into layers that are there, so no stall of two add_labels
            show_predictions(self.w.viewer, image, info.channel_names, info.colors, masks,
                             corr.store_path_of(image), below=self.w.corrections_layer())
            self.w.status_panel.set_idle(f"{s.run_summary}; prediction updated"
                                         if s.run_summary else "prediction done")
            s.run_summary = ""
            self.session.release(Busy.SHOW)

        self.prediction_layers_then(image, show, masks)

    def prediction_layers_then(
        self, image: Image, then: Callable[[], None], masks: list[np.ndarray] | None = None,
    ) -> None:
        """Make the prediction layers fit ``image`` (one per event-loop turn; new ones hold
        ``masks`` if given, else nothing), then ``then()``."""
        s = self.state
        if s.info is None:
            return
        fit_prediction_layers_later(
            self.w.viewer, image, s.info.channel_names, s.info.colors,
            tuple(int(n) for n in corr.image_level0(image).shape), corr.store_path_of(image),
            alive=lambda: not s.closed, then=then, below=self.w.corrections_layer(),
            masks=masks)

    def new_corrections_layer(self) -> Labels | None:
        """An empty corrections layer with the model's classes, ready to paint."""
        image, info = self.w.image_layer(), self.state.info
        if image is None or info is None:
            return None
        return corr.add_corrections_layer(self.w.viewer, image, info.channel_names, info.colors,
                                          corr.store_path_of(image))

    def follow_corrections(self, layer: Labels | None) -> None:
        """Autosave ``layer`` into its (or the image's) store; stop following the previous.

        The prediction layers are made here too, so that a run finds them there:
        adding one costs 0.15-0.4 s of main thread, which the Fine-tune click
        must not cost.
        """
        s, label, image = self.state, self.w.autosave_label, self.w.image_layer()
        if layer is not None and image is not None:  # here, not at the Fine-tune click
            self.prediction_layers_then(image, lambda: None)
        if s.autosaver is not None:
            if s.autosaver.layer is layer:
                return
            s.autosaver.retire()  # a pending save is written, not dropped
            s.retired_savers = [saver for saver in s.retired_savers if saver.in_flight]
            s.retired_savers.append(s.autosaver)
            s.autosaver = None
        if layer is None:
            return
        store = corr.store_path_of(layer, image)
        if store is None:
            label.setText("corrections: not autosaved (the image is not from an OME-Zarr)")
            return
        names = layer.metadata.get("channel_names") or (s.info.channel_names if s.info else [])
        s.autosaver = corr.Autosaver(
            layer, store, names, self.session.save_corrections,
            channel_colors=s.info.colors_for(names) if s.info else (),
        )
        self._say_target(store, "corrections autosave into {}")

    def _say_target(self, store: str, template: str) -> None:
        """Where ``store``'s painting goes: the store itself, or its sibling (read-only)."""
        target = corr.corrections_target(store)
        if target != store:
            template += " (the store is read-only)"
        say(self.w.autosave_label, template, target)

    def _corrections_saved(self, saved: CorrectionsSaved) -> None:
        saver = self.state.autosaver
        if not self.state.closed and saver is not None and saver.store_path == saved.store:
            say(self.w.autosave_label, "corrections autosaved into {}", saved.image)

    def _corrections_failed(self, failed: CorrectionsFailed) -> None:
        """A failed save: said once, and the label says where the next one goes (it never
        claims a save that did not happen)."""
        s = self.state
        s.errors.append(failed.line)
        if s.closed:
            return
        self.w.status_panel.append_log(failed.line)
        show_error(failed.line)
        saver = s.autosaver
        if saver is not None and saver.store_path == failed.store:
            say(self.w.autosave_label,
                "corrections: the last save failed; the next save tries {}", failed.next)

    # -- fine-tune ---------------------------------------------------------------------------
    def finetune(self) -> None:
        """Fill the Session's run (a copy of the corrections, the settings) and start it.

        The prediction layers come first (the previews write into them), one per
        event-loop turn; the run starts after them, unless Stop came meanwhile.
        """
        s, image, layer = self.state, self.w.image_layer(), self.w.corrections_layer()
        if s.busy is not None or image is None or layer is None or s.info is None:
            return
        try:
            config = self.w.settings.config()
            scheduler, tls_files = self.w.settings.scheduler(), self.w.settings.security_files()
        except ValueError as exc:
            self.fail(exc, "Invalid settings")
            return
        if (model_image := self.model_image("Cannot fine-tune")) is None:
            return
        session, info = self.session, s.info
        session.scheduler, session.tls_files = scheduler, tls_files
        if s.autosaver is not None and s.autosaver.layer is layer:
            labels, snapshot = s.autosaver.snapshot(), s.autosaver.snapshot_id
        else:
            labels, snapshot = np.array(layer.data, copy=True), corr.next_snapshot()
        session.image, session.corrections = model_image, labels
        session.checkpoint, session.trust = info.path, info.trust
        session.channel_names, session.channel_colors = list(info.channel_names), list(info.colors)
        session.store, session.config = corr.store_path_of(layer, image), config
        session.preview_interval_s = self.w.settings.preview_interval_s
        release_trainer(s)
        s.statuses, s.previews, s.timings = [], 0, {}
        self.w.status_panel.start_run(config.steps, config.batch_size)
        s.stop_requested = False
        if not session.hold(Busy.TRAIN):  # the run starts after the layers, busy meanwhile
            self.w.status_panel.set_idle("not started")
            return

        def start() -> None:
            if s.stop_requested:  # Stop was pressed while the layers were added
                session.release(Busy.TRAIN)
                self.w.status_panel.set_idle("stopped before the first step")
                return
            if not self.start_action(  # the Session's action takes the hold over
                    lambda: session.finetune(snapshot), ended=lambda end: self.after_training(
                        stopped=end.outcome is Outcome.STOPPED)):
                session.release(Busy.TRAIN)
                self.w.status_panel.set_idle("not started")

        # The previews need the layers (made when the corrections layer was chosen; again
        # here if they were deleted since), but not this handler.
        self.prediction_layers_then(image, start)

    def after_training(self, stopped: bool) -> None:
        """Say how the run ended; refresh the whole prediction with the new weights."""
        s = self.state
        last = s.statuses[-1] if s.statuses else None
        if stopped and s.trainer is not None:
            total = last.total_steps if last is not None else "?"
            # On the status line only: the run's own "stopped" status is in the log.
            s.run_summary = (f"stopped after step {s.trainer.steps_done} of {total}; "
                             "the weights of that step are kept")
        elif stopped:
            s.run_summary = "stopped before the first step"
        else:
            s.run_summary = f"{last.kind}: step {last.step} / {last.total_steps}" if last else ""
        self.w.status_panel.set_idle(s.run_summary or "not started")
        if s.trainer is not None and last is not None and s.info is not None and (
            prediction_layers(self.w.viewer, s.info.channel_names)
        ):
            self.predict()
