"""The Fine-tune dock widget (placeholder until the widget issue lands)."""

from __future__ import annotations

from qtpy.QtWidgets import QLabel, QVBoxLayout, QWidget


class FinetuneWidget(QWidget):
    """Dock widget: pick an image and a checkpoint, paint, fine-tune, export."""

    def __init__(self, napari_viewer) -> None:
        super().__init__()
        self.viewer = napari_viewer
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("napari-finetune"))
