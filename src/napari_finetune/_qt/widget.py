"""The Fine-tune dock: it shows at once, its panel follows when its modules are imported.

napari (npe2) imports this module and calls :class:`FinetuneWidget` on the main
thread when the user asks for the dock. Importing the panel's modules (the
panel's parts, magicgui, the Session) took 153-188 ms there, and building the
panel another 48-105 ms in the same gap (issue 55's UI walk). So this module
imports only Qt: the dock starts a thread that imports the panel's modules (an
import releases the GIL between bytecodes; it creates no Qt object), and the
panel (:class:`~napari_finetune._qt.panel.FinetunePanel`) is built on the main
thread in the event-loop turn after the import ends.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import TYPE_CHECKING

from qtpy.QtCore import QEvent, QSize, Qt, QTimer, Signal, Slot
from qtpy.QtWidgets import QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

if TYPE_CHECKING:
    from napari import Viewer

    from napari_finetune._qt.panel import FinetunePanel

PANEL_MODULE = "napari_finetune._qt.panel"
LOADING_WIDTH = 400  # the panel's width (its MAX_WIDTH, not imported here: a test compares)
LOADING = "Loading the Fine-tune panel…"

_log = logging.getLogger(__name__)


def import_panel() -> BaseException | None:
    """Import the panel's modules (in the dock's thread); the error, or None.

    Without full collections meanwhile: the import makes tens of thousands of
    long-lived objects, and a full collection in this thread holds the GIL for
    napari's whole heap (200-300 ms).
    """
    from napari_finetune.session.heap import no_full_collections

    try:
        with no_full_collections():
            importlib.import_module(PANEL_MODULE)
    except BaseException as error:  # shown in the dock, not lost in a thread
        return error
    return None


class FinetuneWidget(QWidget):
    """The Fine-tune dock napari asks for: a line at once, the panel a moment later.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer this widget docks into.

    Attributes
    ----------
    panel : FinetunePanel or None
        The panel (buttons, settings, status), None until built (:attr:`panel_ready`
        is emitted then).
    predict_button : QPushButton
        Predict, there from the dock's first turn: a click while the panel loads is
        kept and predicts when the model is ready; the panel takes this same button.
    """

    panel_ready = Signal()
    _imported = Signal(object)  # from the import thread: the error, or None

    def __init__(self, napari_viewer: Viewer) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.panel: FinetunePanel | None = None
        # All the dock's height (the panel scrolls inside): napari adds a vertical stretch
        # below a dock whose policy and children do not expand, and the panel, built
        # later, got only its minimum height beside it (73 of 729 px, measured).
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self._closed = False  # removed before the panel was built: none is built
        self._loading = QLabel(LOADING)
        self._loading.setWordWrap(True)
        self._loading.setAlignment(Qt.AlignmentFlag.AlignTop)
        self._layout = layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._loading)
        # Predict is there at once (a user, or a script, clicks it the moment the dock
        # shows): the click is kept, and the panel takes this button and the click.
        self._early_click = False
        self.predict_button = QPushButton("Predict")
        self.predict_button.setToolTip("The panel is loading: a click now is kept and "
                                       "predicts as soon as the model is ready")
        self.predict_button.clicked.connect(self._click_early)
        layout.addWidget(self.predict_button)
        layout.addStretch(1)
        # Queued: the slot runs on the main thread, in a later event-loop turn; a dock
        # deleted meanwhile (the window closed) never receives it.
        self._imported.connect(self._build,
                               Qt.ConnectionType.QueuedConnection)  # type: ignore[call-arg]
        # The thread starts in the next turn, after napari has docked the widget: its
        # imports would share the GIL with napari's own docking.
        QTimer.singleShot(0, self._start_import)

    def _click_early(self) -> None:
        self._early_click = True
        self.predict_button.setText("Predict (queued)")

    def _start_import(self) -> None:
        if self._closed:
            return
        threading.Thread(target=self._import, name="napari-finetune: the panel's imports",
                         daemon=True).start()

    def _import(self) -> None:
        """The thread's body: import, then tell the main thread (no Qt object made here)."""
        error = import_panel()
        try:
            self._imported.emit(error)
        except RuntimeError:  # the dock was deleted meanwhile: nothing to build
            pass

    @Slot(object)
    def _build(self, error: BaseException | None) -> None:
        """Build the panel (main thread; its modules are imported by now)."""
        if self._closed or self.panel is not None:
            return
        if error is not None:
            _log.error("the Fine-tune panel could not be imported", exc_info=error)
            said = f"The Fine-tune panel could not load: {error}"
            self._loading.setText(said)
            # No panel will take the button: a kept click would be lost, and so would
            # every later one. It says why instead of doing nothing.
            self.predict_button.setText("Predict")
            self.predict_button.setToolTip(said)
            self.predict_button.setEnabled(False)
            return
        from napari_finetune._qt.panel import FinetunePanel

        self.predict_button.clicked.disconnect(self._click_early)
        while self._layout.count():  # the line, the button (the panel takes it), the stretch
            self._layout.takeAt(0)
        self.panel = panel = FinetunePanel(self.viewer, predict_button=self.predict_button)
        self._loading.deleteLater()
        self._layout.addWidget(panel, 1)  # all the dock's height: the panel scrolls inside
        if self._early_click:  # the panel keeps it until the model is there
            panel.controller.predict()
        self.panel_ready.emit()

    def sizeHint(self) -> QSize:  # noqa: N802, D102 (Qt override)
        # Before the panel: its width already, so the dock does not widen when it comes.
        if self.panel is not None:
            return super().sizeHint()
        return QSize(LOADING_WIDTH, super().sizeHint().height())

    def event(self, event: QEvent | None) -> bool:  # noqa: D102 (Qt override)
        # napari's remove_dock_widget unparents the widget: end the panel's work then,
        # without waiting (the app goes on; a run's last events only update the state).
        if (event is not None and event.type() == QEvent.Type.ParentChange
                and self.parent() is None):
            self.close_work(0.0)
        return super().event(event)

    def close_work(self, wait_s: float) -> bool:
        """End the panel's work (see ``FinetunePanel.close_work``); before it: build none.

        Returns False when a job was still running at the deadline.
        """
        self._closed = True
        return True if self.panel is None else self.panel.close_work(wait_s)
