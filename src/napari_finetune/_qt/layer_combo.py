"""A combo box of the viewer's layers of one type that follows the layer list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qtpy.QtCore import Signal
from qtpy.QtWidgets import QComboBox, QWidget


class LayerCombo(QComboBox):
    """Lists the layers of ``layer_type`` that pass ``accept``; kept in sync with the viewer.

    The current layer is kept across changes when it still exists; a new
    matching layer becomes current when nothing was chosen yet.
    """

    layer_changed = Signal(object)  # the new current layer, or None

    def __init__(
        self, viewer: Any, layer_type: type, accept: Callable[[Any], bool] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.viewer = viewer
        self.layer_type = layer_type
        self.accept = accept or (lambda layer: True)
        self._layers: list[Any] = []
        self._current: Any = None
        self.currentIndexChanged.connect(self._index_changed)
        events = viewer.layers.events
        for emitter in (events.inserted, events.removed, events.moved, events.reordered):
            emitter.connect(self.refresh)
        events.inserted.connect(self._follow_names)
        for layer in viewer.layers:
            layer.events.name.connect(self.refresh)
        self.refresh()

    def _follow_names(self, event: Any) -> None:
        event.value.events.name.connect(self.refresh)

    def refresh(self, event: Any = None) -> None:
        """Rebuild the entries from the layer list, keeping the current layer."""
        current = self.layer()
        inserted = getattr(event, "value", None) if event is not None else None
        layers = [
            layer for layer in self.viewer.layers
            if isinstance(layer, self.layer_type) and self.accept(layer)
        ]
        if layers == self._layers and [self.itemText(i) for i in range(self.count())] == [
            layer.name for layer in layers
        ]:
            return
        self.blockSignals(True)
        self.clear()
        self._layers = layers
        for layer in layers:
            self.addItem(layer.name)
        if current in layers:
            index = layers.index(current)
        elif inserted in layers and current is None:
            index = layers.index(inserted)
        else:
            index = 0 if layers else -1
        self.setCurrentIndex(index)
        self.blockSignals(False)
        self._index_changed()

    def _index_changed(self, index: int | None = None) -> None:
        if self.layer() is not self._current:
            self._current = self.layer()
            self.layer_changed.emit(self._current)

    def layer(self) -> Any:
        """The chosen layer, or None."""
        index = self.currentIndex()
        return self._layers[index] if 0 <= index < len(self._layers) else None

    def set_layer(self, layer: Any) -> None:
        """Make ``layer`` current (it must be listed)."""
        self.refresh()
        if layer in self._layers:
            self.setCurrentIndex(self._layers.index(layer))
