"""The Fine-tune panel, the dock's content: a view of the engine and of napari's layers.

Every button starts a job from :mod:`napari_finetune._qt.jobs` in a napari
``thread_worker`` (through :class:`~napari_finetune._qt.actions.Controller`)
and returns at once; the job's events come back on the main thread, which
only assigns labels and layer data. The buttons follow the evented
:class:`~napari_finetune._qt.state.WidgetState` from one connection. No
training logic lives here.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import TYPE_CHECKING

from napari.layers import Image, Labels, Layer
from qtpy.QtCore import QSize, Qt, QTimer
from qtpy.QtGui import QShowEvent
from qtpy.QtWidgets import (
    QFileDialog,
    QFrame,
    QLabel,
    QMenu,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from napari_finetune._qt import objects_step, results, run_on, structure_row
from napari_finetune._qt.actions import Controller
from napari_finetune._qt.channel_pick import CHOOSE_FIRST, ChannelPick, store_image
from napari_finetune._qt.corrections import (
    METADATA_KEY,
    image_level0,
    is_corrections_candidate,
    store_path_of,
)
from napari_finetune._qt.kept_offer import KeptOffer
from napari_finetune._qt.layers import camera_of, visible_region
from napari_finetune._qt.parts import (
    PathEdit,
    SideScroll,
    WrapLabel,
    default_checkpoint,
    disconnect,
    layer_combo,
    qt_app,
    row,
    section,
)
from napari_finetune._qt.roles_editor import RolesEditor
from napari_finetune._qt.run_on import SCHEDULER
from napari_finetune._qt.settings import SettingsForm
from napari_finetune._qt.shutdown import CLOSE_WAIT_S, WindowCloseWatcher, at_exit_of_a_script
from napari_finetune._qt.state import WidgetState, shut_down, stop
from napari_finetune._qt.status_panel import StatusPanel
from napari_finetune.config import FinetuneConfig
from napari_finetune.session.heap import HeapHold
from napari_finetune.session.session import Busy

if TYPE_CHECKING:
    from napari import Viewer

    from napari_finetune.arrays import AxesImage, VolumeArray
    from napari_finetune.session.structure import StructureAdded

MAX_WIDTH = 400  # the dock's content, scroll bar aside: the panel stays within 420 px


class FinetunePanel(QWidget):
    """The dock's panel: pick an image and a checkpoint, predict, paint, fine-tune, export.

    Built by the dock (:class:`~napari_finetune._qt.widget.FinetuneWidget`) on the main
    thread once this module's imports have run in a thread; the dock ends its work when
    napari removes the dock (``close_work``).

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer this panel's dock docks into.
    predict_button : QPushButton, optional
        The dock's Predict button, there before this panel (a new one without it).
    """

    def __init__(self, napari_viewer: Viewer, predict_button: QPushButton | None = None) -> None:
        super().__init__()
        # Nothing slow here: the checkpoint is read and the engine imported in jobs started
        # at the end, so the dock shows at once (a click before they end is kept).
        self.viewer = napari_viewer
        self.state = WidgetState()
        self.controller = Controller(self)
        # A plain tcp:// scheduler of another machine: the user says yes once per address.
        self.controller.session.confirm_unencrypted = (
            lambda address, line: run_on.confirm_unencrypted(self, address, line))
        self.image_combo = layer_combo(napari_viewer, Image, lambda layer: True)
        # A store's channels: which one a single-channel model sees (hidden otherwise).
        self.channel_pick = ChannelPick()
        self.checkpoint_edit = PathEdit(default_checkpoint())
        self.checkpoint_edit.setPlaceholderText("model checkpoint (.pt)")
        # "…" opens a file; its arrow lists the models that ship with the package (the
        # starter for a volume unlike the sample), which a user would not find on disk.
        browse = self.model_button = QToolButton()
        browse.setText("…")
        browse.setToolTip("Choose a checkpoint file; the arrow: a model that ships with "
                          "napari-finetune (the starter, for a volume unlike the sample)")
        browse.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        browse.clicked.connect(self._browse_checkpoint)
        browse.setMenu(self._shipped_menu(browse))
        self.checkpoint_label = QLabel("no checkpoint loaded")
        self.checkpoint_label.setWordWrap(True)
        # The dock's, clicked maybe while this panel loaded (FinetuneWidget keeps that click).
        self.predict_button = predict_button or QPushButton("Predict")
        self.predict_button.setText("Predict")
        self.predict_button.setToolTip("Predict the whole volume with the model")
        self.objects_button = QPushButton("Objects")
        self.objects_button.setToolTip(
            "Count the objects of the last prediction: one layer per channel with a role "
            "(cells from the membranes, mitochondria), each object its own colour")
        self.roles_editor = RolesEditor()
        self.roles_editor.title.setWordWrap(True)  # its one line set the dock's width
        self.objects_label = QLabel("")
        self.objects_label.setWordWrap(True)
        self.corrections_combo = layer_combo(napari_viewer, Labels, is_corrections_candidate)
        self.new_corrections_button = QPushButton("New corrections layer")
        self.structure_row = structure_row.StructureRow()
        self.autosave_label = QLabel("corrections: not saved yet")
        self.autosave_label.setWordWrap(True)
        self.settings = SettingsForm()
        self.finetune_button = QPushButton("Fine-tune")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the run after the current step (the weights are "
                                    "kept), or the prediction (what it predicted is kept)")
        self.status_panel = StatusPanel()
        # Weights a remote run kept beside the image's store: Use / Discard, in the dock.
        self.kept_offer = KeptOffer(self.controller.session, self._use_checkpoint,
                                    self.status_panel.append_log, lambda: self.state.closed)
        self.controller.session.events.placement.connect(self._show_placement)
        self.export_button = QPushButton("Export checkpoint…")
        self.paint_next_button = QPushButton("Paint here next")
        self.paint_next_button.setToolTip(
            "Show where the model is unsure (layer 'uncertainty') and go to the most "
            "uncertain region you have not painted yet; press again for the next one"
        )
        self.bioimageio_button = QPushButton("Export as bioimage.io model…")
        self.bioimageio_button.setToolTip(
            "A model package for ilastik, deepImageJ, Fiji and the bioimage.io zoo, "
            "with test data cut from this image (checked with bioimage.io's own tests)"
        )
        self.save_predictions_button = QPushButton("Save predictions")
        self.save_predictions_button.setToolTip("Write the prediction layers into the OME-Zarr")
        self.output_label = QLabel("")
        self.output_label.setWordWrap(True)

        # What a run will take here (the Session's estimate), read before the click.
        self.estimate_label = WrapLabel("")
        self.estimate_label.setToolTip(
            "From the seconds a step took on this computer (the last run)")

        # Sections that fold (a laptop shows ~700 px of dock): the one in use is open, and
        # a run folds the model and the settings, then opens the Results when it ends.
        self.model_section = section("Data and model", [
            row(QLabel("Image:"), self.image_combo.native), self.channel_pick,
            row(QLabel("Model:"), self.checkpoint_edit, browse),
            self.checkpoint_label, self.kept_offer,
            row(self.predict_button, self.objects_button),
            SideScroll(self.roles_editor), self.objects_label,
        ])
        self.corrections_section = section("Corrections", [
            row(QLabel("Layer:"), self.corrections_combo.native),
            row(self.new_corrections_button, self.paint_next_button), self.structure_row,
            self.autosave_label,
        ])
        self.settings_section = section("Settings", [self.settings], indent=6)
        self.train_section = section("Fine-tune", [
            self.settings_section, self.estimate_label,
            row(self.finetune_button, self.stop_button), self.status_panel,
        ])
        self.results_section = section("Results", [
            row(self.export_button, self.save_predictions_button), self.bioimageio_button,
            self.output_label,
        ], expanded=False)
        self._run_seen = False  # a run began: the Results open when the work ends
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(2)
        for box in (self.model_section, self.corrections_section, self.train_section,
                    self.results_section):
            layout.addWidget(box)
        layout.addStretch(1)
        # A scroll area: on a short screen the status rows keep their height.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        # As wide as the inputs need: no horizontal scrolling, no clipped numbers.
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._scroll = scroll

        a = self.controller
        self.checkpoint_edit.editingFinished.connect(self._checkpoint_changed)
        self.predict_button.clicked.connect(a.predict)
        self.objects_button.clicked.connect(lambda: objects_step.compute_objects(a))
        self.roles_editor.changed.connect(lambda *_: objects_step.roles_edited(a))
        self.new_corrections_button.clicked.connect(self._new_corrections)
        self.corrections_combo.changed.connect(self._corrections_changed)
        self.image_combo.changed.connect(self._image_changed)
        self.channel_pick.changed.connect(self._sync_buttons)
        self.state.events.info.connect(self._show_channels)
        self.state.events.info.connect(self._widen_corrections)
        self.structure_row.add_button.clicked.connect(self._add_structure)
        self.finetune_button.clicked.connect(self._finetune)
        self.stop_button.clicked.connect(lambda: stop(self.state))
        self.export_button.clicked.connect(self._export)
        self.save_predictions_button.clicked.connect(lambda: results.save_predictions(a))
        self.paint_next_button.clicked.connect(lambda: results.paint_here_next(a))
        self.bioimageio_button.clicked.connect(self._export_bioimageio)

        def mode_changed(mode: str) -> None:
            # PEFT is warmed up when LoRA is chosen, not at every dock (see warm_up_job).
            if mode == "lora":
                a.warm_up(lora=True)

        self.settings.mode.changed.connect(mode_changed)
        for setting in (self.settings.steps, self.settings.mode, self.settings.device,
                        self.settings.run_on.where):
            setting.changed.connect(self._show_estimate)
        self.state.events.all.connect(self._sync_buttons)  # the one place buttons follow
        self.state.events.busy.connect(self._fold_sections)
        self._refit_pending = True  # the canvas is refit once the dock is shown
        # napari's long-lived heap hidden from full collections (300+ ms stalls each, see
        # session/heap.py) from the jobs' start until a layer is removed or the dock closes.
        self._heap = heap = HeapHold()
        self._removal_pending = False  # a removed layer's unfreeze waits for the next turn
        # Before the controller's own slot, which starts a Predict kept meanwhile: the
        # engine's modules are hidden while no job runs (not left for every later full
        # collection to walk: 284 ms in a stroke's handler, 314 ms at Fine-tune, measured).
        self.controller.session.events.warmed.connect(self._hide_heap, priority=1)
        layers = self.viewer.layers.events
        self._viewer_hooks = [(self.viewer.events.theme, self._theme_changed),
                              (self.viewer.dims.events.current_step, self._update_region),
                              (camera_of(self.viewer).events.center, self._update_region),
                              *((emitter, self.reset_choices) for emitter in (
                                  layers.inserted, layers.removed, layers.moved,
                                  layers.reordered, layers.renamed)),
                              # A removed layer sits in reference cycles: frozen, its array
                              # would never be freed.
                              (layers.removed, self._layer_removed)]
        for emitter, slot in self._viewer_hooks:
            emitter.connect(slot)
        # Closing: the viewer's window, the app, the dock removed, or the widget deleted.
        state, app = self.state, qt_app()

        def quit_hook() -> None:  # the state, not the widget
            shut_down(state, CLOSE_WAIT_S)

        self._quit_hook = quit_hook
        app.aboutToQuit.connect(quit_hook)
        self._window_watcher = WindowCloseWatcher(self, lambda: self.close_work(CLOSE_WAIT_S))
        at_exit_of_a_script(state, lambda s: shut_down(s, CLOSE_WAIT_S))  # a script's end

        def destroyed(*_: object) -> None:
            # Deleted with its window (viewer.close() deletes it at once, shown or not):
            # wait there too; this touches only the state, and the worker never the widget.
            state.events.all.disconnect()
            heap.release()  # the widget's objects, the viewer's too, collectable again
            shut_down(state, CLOSE_WAIT_S)
            disconnect(app.aboutToQuit, quit_hook)  # nothing keeps the state alive after

        self.destroyed.connect(destroyed)
        self._corrections_changed(self.corrections_combo.value)
        self._image_changed()
        self._theme_changed()
        self._show_estimate()
        if self.checkpoint_edit.text():
            self.state.reading = True  # on its way: a Predict clicked meanwhile is kept
        # The jobs start in the next event-loop turn, after napari has docked the widget:
        # started here, their imports took the GIL from napari's own docking (its settings
        # save went from ~0.05 to ~0.6 s).
        QTimer.singleShot(0, self._start_jobs)

    def _start_jobs(self) -> None:
        """Read the checkpoint and warm the engine up, in jobs (see the constructor)."""
        if self.state.closed:  # closed before this turn: no new work, no widget touched
            return
        # Docked: what lives now (napari, the image, this dock) lives on. Hidden before the
        # jobs' imports, the collections those set off walk only the young objects.
        self._heap.freeze()
        if self.checkpoint_edit.text():
            self._checkpoint_changed()
        self.controller.warm_up(lora=self.settings.mode.value == "lora")

    def _hide_heap(self) -> None:
        """A warm-up ended: hide the modules it imported (torch, PEFT) from full collections.

        During a run too (a LoRA warm-up often ends in it): a trainer frozen here is given
        back before it is dropped (``Session.release_trainer``). Not during another job:
        a prediction's model would stay frozen after it ended.
        """
        s = self.state
        if not s.closed and s.busy in (None, Busy.TRAIN):
            self._heap.freeze()

    def _layer_removed(self, event: object = None) -> None:
        """Give the heap back to the collector at the next event-loop turn, not now.

        napari's removal ends in its own ``gc.collect()``: after an unfreeze here, that
        walked the whole heap in the removal's call (971 ms measured when the viewer
        closed: ``viewer.close()`` removes every layer before the window closes). A turn
        later the dock has closed (and unfrozen) with the window, so no collection
        walks the heap at the close; an open dock unfreezes and collects then.
        """
        if not self._removal_pending:  # several removed in one call: one collection
            self._removal_pending = True
            QTimer.singleShot(0, self._free_removed)

    def _free_removed(self) -> None:
        self._removal_pending = False
        if self._heap.held:  # closed meanwhile: nothing frozen, nothing to collect here
            self._heap.layer_removed()
            gc.collect()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """Wide enough for the inputs: napari sizes the dock from this."""
        hint = super().sizeHint()
        if not hasattr(self, "_scroll"):
            return hint
        bar, inner = self._scroll.verticalScrollBar(), self._scroll.widget()
        if bar is None or inner is None:  # Qt's stubs allow None; both are set in __init__
            return hint
        # At most MAX_WIDTH (a laptop's canvas keeps its room): the rows then shrink to
        # their minimum, which still shows every input whole.
        want = max(inner.minimumSizeHint().width(),
                   min(inner.sizeHint().width(), MAX_WIDTH)) + bar.sizeHint().width() + 2
        return QSize(max(min(hint.width(), MAX_WIDTH), want), hint.height())

    def showEvent(self, event: QShowEvent | None) -> None:  # noqa: N802, D102 (Qt override)
        self._window_watcher.follow(self)  # docked: watch that window's close
        super().showEvent(event)
        if self._refit_pending:
            # The dock took the canvas' width: fit the image to what is left, once napari
            # has laid the window out (the next event-loop turn).
            self._refit_pending = False
            QTimer.singleShot(0, self._refit_canvas)

    def _refit_canvas(self) -> None:
        if not self.state.closed:
            self.viewer.reset_view()

    def close_work(self, wait_s: float) -> bool:
        """Save the pending painting, end the run, wait up to ``wait_s`` s; no events after.

        Called when the viewer's window closes (waiting, so no worker outlives
        the process' teardown) and when the dock is removed (not waiting).
        Returns False when a job was still running at the deadline.
        """
        if self.state.closed:
            return True
        for emitter, slot in self._viewer_hooks:
            emitter.disconnect(slot)
        self.controller.session.events.warmed.disconnect(self._hide_heap)
        self._heap.release()  # a closed dock's objects must be collectable
        self.state.events.all.disconnect(self._sync_buttons)
        self.state.events.busy.disconnect(self._fold_sections)
        self.state.events.info.disconnect(self._show_channels)
        self.state.events.info.disconnect(self._widen_corrections)
        disconnect(qt_app().aboutToQuit, self._quit_hook)
        return shut_down(self.state, wait_s)

    # -- what the user sees follows the state ------------------------------------------------
    def _sync_buttons(self, *_: object) -> None:
        """Enable what makes sense now (connected to every change of the state)."""
        s = self.state
        if s.closed:
            return
        image = self.image_layer() is not None
        ready = image and s.info is not None
        idle = s.busy is None
        # Enabled while the model is on its way: Qt drops a click on a disabled button,
        # and the Controller keeps this one until the model is there.
        waiting = image and (s.reading or (s.info is not None and s.warming > 0))
        self.predict_button.setEnabled(idle and (ready or waiting))
        self.predict_button.setText("Predict (queued)" if s.queued else "Predict")
        self.predict_button.setToolTip(predict_tip(
            image=image, model=s.info is not None, waiting=waiting, busy=s.busy))
        # A prediction of the image in view (Objects says which roles it cannot serve).
        self.objects_button.setEnabled(idle and s.info is not None
                                       and s.predicted_image is not None
                                       and s.predicted_image is self.image_layer())
        channel = not self.channel_pick.needed or self.channel_pick.choice() is not None
        self.new_corrections_button.setEnabled(ready and channel)
        self.new_corrections_button.setToolTip(
            "An empty layer with the model's classes, to paint" if channel else CHOOSE_FIRST)
        if not channel:
            self.predict_button.setEnabled(False)
            self.predict_button.setToolTip(f"Predict: {CHOOSE_FIRST}")
        self.finetune_button.setEnabled(idle and ready and channel
                                        and self.corrections_layer() is not None)
        # A prediction stops too (the one after a run takes a minute on a real crop): what
        # it predicted is kept.
        self.stop_button.setEnabled(s.busy in (Busy.TRAIN, Busy.PREDICT))
        self.export_button.setEnabled(idle and s.trainer is not None)
        self.save_predictions_button.setEnabled(idle and s.info is not None)
        self.paint_next_button.setEnabled(idle and ready)
        self.structure_row.add_button.setEnabled(idle and s.info is not None)
        self.bioimageio_button.setEnabled(idle and ready)
        self.finetune_button.setText("Fine-tuning…" if s.busy is Busy.TRAIN else "Fine-tune")

    def _fold_sections(self, busy: Busy | None) -> None:
        """A run folds the model and its settings; its end opens the Results, in view."""
        if self.state.closed:
            return
        if busy not in (Busy.TRAIN, Busy.PREDICT, Busy.SHOW, None):
            self._run_seen = False  # another action: the user has moved on
        if busy is Busy.TRAIN:
            self._run_seen = True
            self.model_section.collapse(animate=False)
            self.settings_section.collapse(animate=False)
            self.train_section.expand(animate=False)
        elif busy is None and self._run_seen:  # the run, or the prediction after it, ended
            self.results_section.expand(animate=False)
            self._show_estimate()  # the run just timed its steps
            # After the new layout is in place (the next event-loop turn).
            QTimer.singleShot(0, self._scroll_to_results)

    def _scroll_to_results(self) -> None:
        if not self.state.closed:
            self._scroll.ensureWidgetVisible(self.output_label, 0, 4)

    def _show_estimate(self, *_: object) -> None:
        """How long the run set up now takes here (the Session says; shown as is)."""
        s = self.settings
        device = "scheduler" if s.run_on.where.value == SCHEDULER else s.device_name()
        self.estimate_label.setText(self.controller.session.estimate_line(
            int(s.steps.value), device, str(s.mode.value)))

    def _theme_changed(self, *_: object) -> None:
        from napari.utils.theme import get_theme

        self.status_panel.loss_plot.set_theme(get_theme(self.viewer.theme))

    def reset_choices(self, *_: object) -> None:
        """Refresh the layer lists (napari calls this when layers change, as do we)."""
        for combo in (self.image_combo, self.corrections_combo):
            combo.reset_choices()

    def _update_region(self, event: object = None) -> None:
        """Keep the region in view on the Session: a run's live previews are of it (with
        half a patch of context), and a prediction's first part is the view itself."""
        context = max(1, FinetuneConfig().patch_shape[0] // 2)
        layer = self.image_layer()
        session = self.controller.session
        if layer is None:
            session.region = session.view = None
            return
        try:
            ndim = len(layer.data[0].shape if layer.multiscale else layer.data.shape)
            session.region = visible_region(self.viewer, layer, (context,) * ndim)
            session.view = visible_region(self.viewer, layer, (0,) * ndim)
        except Exception:  # a transient state while layers change
            session.region = session.view = None

    # -- public views the controller reads ---------------------------------------------------
    def dialog_parent(self) -> QWidget:
        """The widget a modal dialog (the trust question) is shown over: this one."""
        return self

    def image_layer(self) -> Image | None:
        """The chosen image layer."""
        return self.image_combo.value

    def corrections_layer(self) -> Labels | None:
        """The chosen corrections layer."""
        return self.corrections_combo.value

    def store_image(self) -> AxesImage | None:
        """The chosen image's store with its channels and time points, when it has
        either and the layer is of its shape (napari-ome-zarr's layer of one channel, or
        its time series); None for a plain volume."""
        layer, store = self.image_layer(), self.store_hint()
        # The plugin's own reader (and the sample) opens plain volumes only, and its store
        # may still be on its way (a wait): only napari-ome-zarr's layers are looked at.
        if layer is None or store is None or layer.metadata.get("ome_zarr_path"):
            return None
        found = store_image(str(store))
        if found is None or found.is_plain:
            return None
        shape = tuple(int(n) for n in image_level0(layer).shape)
        return found if found.labels_shape == shape else None

    def model_image(self) -> VolumeArray | AxesImage | None:
        """What the model runs on: the store's image with the chosen channel (or all
        of them for a model of as many), else the layer's own full-resolution array.

        Raises
        ------
        ChannelChoiceError
            A single-channel model on several channels, none chosen yet (one line).
        """
        layer, info, found = self.image_layer(), self.state.info, self.store_image()
        if layer is None:
            return None
        if found is None or info is None:
            return image_level0(layer)
        return found.for_model(info.in_channels, self.channel_pick.choice(),
                               what="the image's store")

    def checkpoint_path(self) -> str:
        """The checkpoint path as typed."""
        return self.checkpoint_edit.text().strip()

    def is_corrections_layer(self, layer: Layer) -> bool:
        """Whether ``layer`` was made by this widget."""
        return bool(layer.metadata.get(METADATA_KEY))

    def store_hint(self) -> Path | None:
        """The OME-Zarr store of the chosen image, if it came from one."""
        path = store_path_of(self.image_layer())
        return Path(path) if path else None

    def _shipped_menu(self, parent: QWidget) -> QMenu:
        """One entry per shipped model: its name and what it is for; choosing one makes
        it the model, as if its path were typed into the model field."""
        from napari_finetune.samples.models import SHIPPED

        menu = QMenu(parent)
        for name, model in SHIPPED.items():
            action = menu.addAction(f"{name}: {model.about}")
            if action is not None:
                action.setData(name)
                action.triggered.connect(
                    lambda _=False, path=str(model.path): self._use_checkpoint(path))
        return menu

    # -- callbacks (thin: each starts a job or updates a label) ------------------------------
    def _browse_checkpoint(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Model checkpoint", self.checkpoint_edit.text(),
            "Checkpoints or bioimage.io packages (*.pt *.pth *.zip)",
        )
        if path:
            self.checkpoint_edit.setText(path)
            self._checkpoint_changed()

    def _checkpoint_changed(self) -> None:
        self.controller.load_info(self.checkpoint_path())

    def _new_corrections(self) -> None:
        layer = self.controller.new_corrections_layer()
        if layer is not None:
            self.corrections_combo.reset_choices()
            self.corrections_combo.value = layer

    def _add_structure(self) -> None:
        name, role = self.structure_row.chosen()
        structure_row.add_structure(self.controller, name, role, self._structure_added)

    def _structure_added(self, added: StructureAdded) -> None:
        """The widened checkpoint becomes the model (read in a job, as any other)."""
        self.structure_row.name.clear()
        self.structure_row.form.setVisible(False)
        self.checkpoint_edit.setText(added.path)
        self._checkpoint_changed()

    def _widen_corrections(self, *_: object) -> None:
        """A model with the corrections layer's channels and more (a structure added):
        the layer gets the new classes, the new one selected to paint."""
        info, layer = self.state.info, self.corrections_layer()
        if self.state.closed or info is None or layer is None:
            return
        if structure_row.widen_corrections(layer, info.channel_names, info.colors):
            layer.selected_label = len(info.channel_names) + 1
            saver = self.state.autosaver
            if saver is not None and saver.layer is layer:
                saver.channel_names = list(info.channel_names)

    def _corrections_changed(self, layer: Labels | None) -> None:
        self.controller.follow_corrections(layer)
        self._sync_buttons()

    def _image_changed(self, *_: object) -> None:
        # Weights kept beside its store are looked for after the dock is shown.
        QTimer.singleShot(0, self._look_for_kept)
        self._update_region()
        self._show_channels()
        self._sync_buttons()

    def _look_for_kept(self) -> None:
        """The Session looks beside the chosen image's store for weights kept by a remote
        run (a stat; the file is read in a job); its offer shows in :attr:`kept_offer`."""
        if not self.state.closed:
            store = self.store_hint()
            self.controller.session.open_store(str(store) if store is not None else None)

    def _use_checkpoint(self, path: str) -> None:
        """``path`` becomes the model, as if typed into the model field."""
        self.checkpoint_edit.setText(path)
        self._checkpoint_changed()

    def _show_placement(self, placement: str) -> None:
        if not self.state.closed:
            self.status_panel.show_placement(placement)

    def _show_channels(self, *_: object) -> None:
        """The Channel row: shown for a single-channel model on a store of several."""
        if self.state.closed:
            return
        found, info = self.store_image(), self.state.info
        self.channel_pick.show_channels(
            found, info is not None and info.in_channels == 1
            and found is not None and found.channels > 1)

    def _finetune(self) -> None:
        self.state.clicked_at = time.perf_counter()
        self.controller.finetune()

    def _export(self) -> None:
        default = results.default_export_path(self.controller)
        path, _ = QFileDialog.getSaveFileName(
            self, "Export fine-tuned checkpoint", default, "Checkpoints (*.pt)"
        )
        if path:
            results.export(self.controller, path)

    def _export_bioimageio(self) -> None:
        default = str(Path(results.default_export_path(self.controller)).with_suffix(".zip"))
        path, _ = QFileDialog.getSaveFileName(
            self, "Export as a bioimage.io model package", default, "bioimage.io (*.zip)"
        )
        if path:
            results.export_bioimageio(self.controller, path)


def predict_tip(image: bool, model: bool, waiting: bool, busy: Busy | None) -> str:
    """The Predict button's tooltip: what it does, or why it cannot act yet."""
    if not image:
        return "Predict: open an image first"
    if busy is not None:
        return f"Predict: waiting for {busy.value} to end"
    if waiting:
        return ("Predict (waiting for the model…): a click now is kept and predicts as soon "
                "as the checkpoint is read")
    if not model:
        return "Predict: choose a model checkpoint first"
    return "Predict the whole volume with the model"
