"""The "Add a structure…" control: a name and a role, then the Session's add_structure.

The Session writes the widened checkpoint (:mod:`napari_finetune.session.structure`);
the widget then reads it as its model, and once its channels are known the
corrections layer gets the new class (:func:`widen_corrections`), painted with the
next label. What was painted stays: the old labels keep their meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from qtpy.QtWidgets import QComboBox, QHBoxLayout, QLineEdit, QPushButton, QVBoxLayout, QWidget

from napari_finetune._qt.corrections import class_names, corrections_colormap

if TYPE_CHECKING:
    from napari.layers import Labels

    from napari_finetune._qt.actions import Controller
    from napari_finetune.session.structure import StructureAdded

ROLES = ("object", "boundary")


class StructureRow(QWidget):
    """The "Add a structure…" button; it opens a row of a name, a role and "Add"."""

    def __init__(self) -> None:
        super().__init__()
        self.toggle = QPushButton("Add a structure…")
        self.toggle.setToolTip(
            "Teach the model a structure it does not know: one more channel, painted with "
            "the next label (the model's own channels are kept)")
        self.name = QLineEdit()
        self.name.setPlaceholderText("name, e.g. nuclei")
        self.role = QComboBox()
        self.role.addItems(list(ROLES))
        self.role.setToolTip("object: high on the things to count; boundary: high between them")
        self.add_button = QPushButton("Add")
        self.form = QWidget()
        form = QHBoxLayout(self.form)
        form.setContentsMargins(0, 0, 0, 0)
        for widget in (self.name, self.role, self.add_button):
            form.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.toggle)
        layout.addWidget(self.form)
        self.form.setVisible(False)
        self.toggle.clicked.connect(lambda: self.form.setVisible(self.form.isHidden()))

    def chosen(self) -> tuple[str, str]:
        """The name typed and the role chosen."""
        return self.name.text().strip(), ROLES[max(0, self.role.currentIndex())]


def add_structure(c: Controller, name: str, role: str,
                  added: Callable[[StructureAdded], None]) -> None:
    """Start the Session's add_structure on the widget's model; ``added`` gets what it
    wrote when it ended done (a taken name: its one line, as every failure)."""
    s, session = c.state, c.session
    if s.info is None or s.busy is not None:
        return
    session.checkpoint, session.trust = s.info.path, s.info.trust

    def done() -> None:
        if session.added is not None:
            c.w.status_panel.append_log(session.added.describe())
            added(session.added)

    c.start_action(lambda: session.add_structure(name, role), done=done)


def widen_corrections(layer: Labels, channel_names: Sequence[str],
                      colors: Sequence[str]) -> bool:
    """Give ``layer`` the classes of ``channel_names`` when they extend its own (a
    structure was added): the names, the status bar's class table and the colours.
    False, and nothing changed, when they do not (another model's channels)."""
    names, old = list(channel_names), list(layer.metadata.get("channel_names") or [])
    if len(names) <= len(old) or names[: len(old)] != old:
        return False
    classes = class_names(names)
    layer.metadata = {**layer.metadata, "channel_names": names}
    layer.features = {"index": list(range(len(classes))), "class": classes}
    layer.colormap = corrections_colormap(colors)
    return True
