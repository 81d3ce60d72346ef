"""The offer of weights a remote run kept beside the store: a row with Use and Discard.

When the image's store is opened, the Session looks beside it for the weights
a remote run kept when it ended early (``Session.open_store``); what it found
comes as ``events.kept_weights``. This row shows its one line and two buttons,
in the dock and never as a modal dialog (docking is not held up by a
question): Use loads the file as the model (through the widget's model
field, as a typed path), Discard sets it aside (renamed, never deleted). The
row hides when no offer stands.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qtpy.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from napari_finetune._qt.parts import WrapLabel
from napari_finetune.session.kept import KeptWeights
from napari_finetune.session.session import Session


class KeptOffer(QWidget):
    """The kept weights' line, with Use and Discard; hidden while nothing is offered.

    Parameters
    ----------
    session : Session
        Whose ``kept_weights`` this row shows and answers.
    load : callable
        ``load(path)``: the front end makes ``path`` its checkpoint (its model field).
    log : callable
        ``log(line)``: one line in the run log (what was found, used or set aside).
    closed : callable
        Whether the front end closed: an offer that arrives later touches no widget.
    """

    def __init__(self, session: Session, load: Callable[[str], None],
                 log: Callable[[str], None], closed: Callable[[], bool]) -> None:
        super().__init__()
        self.session, self._load, self._log, self._closed = session, load, log, closed
        self.line = WrapLabel("")
        self.use_button = QPushButton("Use")
        self.use_button.setToolTip("Load these weights as the model, to go on from them "
                                   "(the file is renamed …remote-last.used-<when>.pt)")
        self.discard_button = QPushButton("Discard")
        self.discard_button.setToolTip("Set the file aside (renamed "
                                       "…remote-last.discarded-<when>.pt, not deleted)")
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.discard_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.line)
        layout.addLayout(buttons)
        self.setVisible(False)
        self.use_button.clicked.connect(self.use)
        self.discard_button.clicked.connect(self.discard)
        session.events.kept_weights.connect(self._offered)
        # The Session outlives the dock: its later offers must not reach a deleted row.
        self.destroyed.connect(lambda *_: session.events.kept_weights.disconnect(
            self._offered, missing_ok=True))

    def _offered(self, kept: KeptWeights | None) -> None:
        if self._closed():
            return
        if kept is None:
            self.setVisible(False)
            return
        self.line.setText(kept.line)
        self.line.setToolTip(kept.path)
        self.use_button.setEnabled(kept.usable)
        self.setVisible(True)
        self._log(kept.line)

    def use(self) -> None:
        """Load the kept weights as the model (a refusal's line comes through the
        Session's ``refused``, which the widget shows)."""
        kept = self.session.kept
        path = self.session.use_kept_weights(read=self._load)
        if path is not None and kept is not None:
            self._log(f"The weights kept at step {kept.steps_done} of {kept.total_steps} are "
                      f"the model now: {Path(path).name} (renamed from "
                      f"{Path(kept.path).name}).")

    def discard(self) -> None:
        """Set the kept weights aside (renamed, not deleted)."""
        kept = self.session.kept
        path = self.session.discard_kept_weights()
        if path is not None and kept is not None:
            self._log(f"The kept weights were set aside: {Path(kept.path).name} is now "
                      f"{Path(path).name}, beside the store.")
