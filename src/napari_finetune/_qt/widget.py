"""The Fine-tune dock widget: a view of the engine and of napari's layers.

Every button starts a job from :mod:`napari_finetune._qt.worker` in a napari
``thread_worker`` and returns at once; the job's events come back to
:meth:`FinetuneWidget._on_event` on the main thread, which only assigns
labels and layer data. No training logic lives here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from qtpy.QtCore import QEvent, QSize, Qt
from qtpy.QtGui import QShowEvent
from qtpy.QtWidgets import (
    QApplication,
    QFileDialog,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from napari_finetune._qt import actions, results
from napari_finetune._qt.corrections import METADATA_KEY, is_corrections_candidate
from napari_finetune._qt.layer_combo import LayerCombo
from napari_finetune._qt.layers import camera_of, visible_region
from napari_finetune._qt.settings import SettingsForm
from napari_finetune._qt.shutdown import CLOSE_WAIT_S, WindowCloseWatcher
from napari_finetune._qt.state import RunState, shut_down, stop
from napari_finetune._qt.status_panel import StatusPanel
from napari_finetune.config import FinetuneConfig


def preload() -> None:
    """Pay the lazy-import costs now, while the dock opens, not mid-run.

    An import holds the GIL; done in the worker it freezes the canvas
    (measured on a 2-core machine: napari.qt.threading ~1.7 s, the first AdamW ~1.6 s).
    """
    import napari.qt.threading  # noqa: F401
    import torch
    import torch.optim

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-4)


def default_checkpoint() -> str:
    """The pretrained sample model, when the sample is installed."""
    try:
        from napari_finetune.samples.synthetic_em import sample_checkpoint_path

        path = sample_checkpoint_path()
        return str(path) if path.is_file() else ""
    except Exception:  # the sample is optional; the user picks a file
        return ""


class FinetuneWidget(QWidget):
    """Dock widget: pick an image and a checkpoint, predict, paint, fine-tune, export.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer this widget docks into.
    """

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        preload()
        from napari.layers import Image, Labels

        self.viewer = napari_viewer
        # Fault injection for tests and benchmarks, applied inside the worker:
        # _model_hook(model) before the trainer exists, _trainer_hook(trainer) once built.
        self._model_hook = None
        self._trainer_hook = None
        self.state = RunState()
        self.image_combo = LayerCombo(napari_viewer, Image)
        self.checkpoint_edit = QLineEdit(default_checkpoint())
        self.checkpoint_edit.setPlaceholderText("model checkpoint (.pt)")
        browse = QPushButton("…")
        browse.setToolTip("Choose a checkpoint file")
        browse.clicked.connect(self._browse_checkpoint)
        self.checkpoint_label = QLabel("no checkpoint loaded")
        self.checkpoint_label.setWordWrap(True)
        self.predict_button = QPushButton("Predict")
        self.predict_button.setToolTip("Predict the whole volume with the model")
        self.corrections_combo = LayerCombo(
            napari_viewer, Labels, accept=is_corrections_candidate
        )
        self.new_corrections_button = QPushButton("New corrections layer")
        self.autosave_label = QLabel("corrections: not saved yet")
        self.autosave_label.setWordWrap(True)
        self.settings = SettingsForm()
        self.finetune_button = QPushButton("Fine-tune")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the run after the current step; the weights are kept")
        self.status_panel = StatusPanel()
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

        model_box = _group("Data and model", [
            _row(QLabel("Image:"), self.image_combo),
            _row(QLabel("Model:"), self.checkpoint_edit, browse),
            self.checkpoint_label, self.predict_button,
        ])
        paint_box = _group("Corrections", [
            _row(QLabel("Layer:"), self.corrections_combo),
            _row(self.new_corrections_button, self.paint_next_button), self.autosave_label,
        ])
        train_box = _group("Fine-tune", [
            self.settings, _row(self.finetune_button, self.stop_button), self.status_panel,
        ])
        out_box = _group("Results", [
            _row(self.export_button, self.save_predictions_button), self.bioimageio_button,
            self.output_label,
        ])
        content = QWidget()
        layout = QVBoxLayout(content)
        for box in (model_box, paint_box, train_box, out_box):
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
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._scroll = scroll

        self.checkpoint_edit.editingFinished.connect(self._checkpoint_changed)
        self.predict_button.clicked.connect(self._predict)
        self.new_corrections_button.clicked.connect(self._new_corrections)
        self.corrections_combo.layer_changed.connect(self._corrections_changed)
        self.image_combo.layer_changed.connect(lambda _: self._update_region())
        self.finetune_button.clicked.connect(self._finetune)
        self.stop_button.clicked.connect(self._stop)
        self.export_button.clicked.connect(self._export)
        self.save_predictions_button.clicked.connect(self._save_predictions)
        self.paint_next_button.clicked.connect(lambda: results.paint_here_next(self))
        self.bioimageio_button.clicked.connect(self._export_bioimageio)
        self._viewer_hooks = [self.viewer.dims.events.current_step,
                              camera_of(self.viewer).events.center]
        for emitter in self._viewer_hooks:
            emitter.connect(self._update_region)
        # Closing: the viewer's window, the app, the dock removed, or the widget deleted.
        state, app = self.state, QApplication.instance()
        self._quit_hook = lambda: shut_down(state, CLOSE_WAIT_S)  # the state, not the widget
        app.aboutToQuit.connect(self._quit_hook)
        self._window_watcher = WindowCloseWatcher(self, lambda: self.close_work(CLOSE_WAIT_S))
        quit_hook = self._quit_hook

        def destroyed(*_: object) -> None:
            # Deleted with its window (viewer.close() deletes it at once, shown or not):
            # wait there too; this touches only the state, and the worker never the widget.
            shut_down(state, CLOSE_WAIT_S)
            _disconnect(app.aboutToQuit, quit_hook)  # nothing keeps the state alive after

        self.destroyed.connect(destroyed)
        self._corrections_changed(self.corrections_combo.layer())
        self._update_region()
        self._refresh_buttons()
        if self.checkpoint_edit.text():
            self._checkpoint_changed()
        actions.warm_up(self)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """Wide enough for the inputs: napari sizes the dock from this."""
        hint = super().sizeHint()
        if not hasattr(self, "_scroll"):
            return hint
        bar = self._scroll.verticalScrollBar().sizeHint().width()
        return QSize(max(hint.width(), self._scroll.widget().sizeHint().width() + bar + 4),
                     hint.height())

    def event(self, event: QEvent) -> bool:  # noqa: D102 (Qt override)
        # napari's remove_dock_widget unparents the widget: end the run then, without
        # waiting (the app goes on; the run's last events only update the state).
        if event.type() == QEvent.ParentChange and self.parent() is None:
            self.close_work(0.0)
        return super().event(event)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802, D102 (Qt override)
        self._window_watcher.follow(self)  # docked: watch that window's close
        super().showEvent(event)

    def close_work(self, wait_s: float) -> bool:
        """Save the pending painting, end the run, wait up to ``wait_s`` s; no events after.

        Called when the viewer's window closes (waiting, so no worker outlives
        the process' teardown) and when the dock is removed (not waiting).
        Returns False when a job was still running at the deadline.
        """
        if self.state.closed:
            return True
        for emitter in self._viewer_hooks:
            emitter.disconnect(self._update_region)
        _disconnect(QApplication.instance().aboutToQuit, self._quit_hook)
        return shut_down(self.state, wait_s)

    # -- state -------------------------------------------------------------------------------
    def _refresh_buttons(self) -> None:
        """Enable what makes sense now; called after every state change."""
        s = self.state
        has_image = self.image_combo.layer() is not None
        idle = s.busy is None
        self.predict_button.setEnabled(idle and has_image and s.info is not None)
        self.new_corrections_button.setEnabled(has_image and s.info is not None)
        self.finetune_button.setEnabled(
            idle and has_image and s.info is not None and self.corrections_combo.layer() is not None
        )
        self.stop_button.setEnabled(s.busy == "train")
        self.export_button.setEnabled(idle and s.trainer is not None)
        self.save_predictions_button.setEnabled(idle and s.info is not None)
        self.paint_next_button.setEnabled(idle and has_image and s.info is not None)
        self.bioimageio_button.setEnabled(idle and has_image and s.info is not None)
        self.finetune_button.setText("Fine-tuning…" if s.busy == "train" else "Fine-tune")

    def _update_region(self, event: Any = None) -> None:
        """Cache the region in view for the training worker's live preview."""
        context = max(1, FinetuneConfig().patch_shape[0] // 2)
        layer = self.image_combo.layer()
        try:
            ndim = len(layer.data[0].shape if layer.multiscale else layer.data.shape)
            self.state.region = visible_region(self.viewer, layer, (context,) * ndim)
        except Exception:  # no layer, or a transient state while layers change
            self.state.region = None

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
        actions.load_info(self, self.checkpoint_edit.text().strip())

    def _predict(self) -> None:
        actions.predict(self)

    def _new_corrections(self) -> None:
        layer = actions.new_corrections_layer(self)
        if layer is not None:
            self.corrections_combo.set_layer(layer)

    def _corrections_changed(self, layer: Any) -> None:
        actions.follow_corrections(self, layer)
        self._refresh_buttons()

    def _finetune(self) -> None:
        self.state.clicked_at = time.perf_counter()
        actions.finetune(self)

    def _stop(self) -> None:
        stop(self.state)

    def _export(self) -> None:
        default = actions.default_export_path(self)
        path, _ = QFileDialog.getSaveFileName(
            self, "Export fine-tuned checkpoint", default, "Checkpoints (*.pt)"
        )
        if path:
            actions.export(self, path)

    def _export_bioimageio(self) -> None:
        default = str(Path(actions.default_export_path(self)).with_suffix(".zip"))
        path, _ = QFileDialog.getSaveFileName(
            self, "Export as a bioimage.io model package", default, "bioimage.io (*.zip)"
        )
        if path:
            results.export_bioimageio(self, path)

    def _save_predictions(self) -> None:
        actions.save_predictions(self)

    def is_corrections_layer(self, layer: Any) -> bool:
        """Whether ``layer`` was made by this widget."""
        return bool(layer.metadata.get(METADATA_KEY))

    def store_hint(self) -> Path | None:
        """The OME-Zarr store of the chosen image, if it came from one."""
        from napari_finetune._qt.corrections import store_path_of

        path = store_path_of(self.image_combo.layer())
        return Path(path) if path else None


def _disconnect(signal: Any, slot: Any) -> None:
    try:
        signal.disconnect(slot)
    except (TypeError, RuntimeError):  # already disconnected
        pass


def _row(*widgets: QWidget) -> QWidget:
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    for widget in widgets:
        narrow = isinstance(widget, QLabel) or (
            isinstance(widget, QPushButton) and widget.text() == "…"
        )
        layout.addWidget(widget, 0 if narrow else 1)
    return row


def _group(title: str, widgets: list[QWidget]) -> QGroupBox:
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    for widget in widgets:
        layout.addWidget(widget)
    return box
