"""Asking the user before a checkpoint's model code is imported: the Qt dialog.

The Session reads the checkpoint (:mod:`napari_finetune.session.checkpoint`) and,
for a factory outside the allow-list, emits ``events.trust_asked`` with the
request; the widget asks with :func:`ask_to_trust` and answers through
``Session.answer_trust``. Only a Yes reads the file again with that one name
trusted.
"""

from __future__ import annotations

from qtpy.QtWidgets import QMessageBox, QWidget

from napari_finetune.session.checkpoint import trust_question


def ask_to_trust(parent: QWidget, path: str, factory: str) -> bool:
    """Ask with a modal Yes/No dialog (No is the default); True on Yes."""
    answer = QMessageBox.question(
        parent,
        "Trust this model's code?",
        trust_question(path, factory),
        QMessageBox.Yes | QMessageBox.No,
        QMessageBox.No,
    )
    return answer == QMessageBox.Yes
