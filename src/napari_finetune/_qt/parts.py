"""Small parts of the dock: layout helpers, layer combo boxes, the default checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from napari import Viewer
    from qtpy.QtCore import SignalInstance

from magicgui.widgets import ComboBox, create_widget
from napari.layers import Layer
from qtpy.QtCore import QCoreApplication, Qt
from qtpy.QtGui import QPainter, QPaintEvent, QPalette
from qtpy.QtWidgets import (
    QApplication,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QStyle,
    QStyleOptionFrame,
    QVBoxLayout,
    QWidget,
)


class PathEdit(QLineEdit):
    """A path field that, unless being edited, shows the path elided from the left.

    The file name is what tells checkpoints apart ("…/samples/synthetic_em_unet.pt");
    the whole path is in the tooltip and comes back on focus. ``text()`` is
    always the whole path.
    """

    def __init__(self, text: str = "") -> None:
        super().__init__(text)
        self.textChanged.connect(self.setToolTip)
        self.setToolTip(text)

    def paintEvent(self, event: QPaintEvent | None) -> None:  # noqa: N802 (Qt override)
        if self.hasFocus() or not self.text():
            super().paintEvent(event)
            return
        option = QStyleOptionFrame()
        self.initStyleOption(option)
        painter, style = QPainter(self), widget_style(self)
        style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelLineEdit, option, painter, self)
        rect = style.subElementRect(QStyle.SubElement.SE_LineEditContents, option, self)
        rect.adjust(2, 0, -2, 0)
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideLeft, rect.width())
        painter.setPen(self.palette().color(QPalette.Text))
        painter.drawText(
            rect, int(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft), shown)
        painter.end()


def widget_style(widget: QWidget) -> QStyle:
    """``widget.style()``, which Qt gives every widget (the application's, unless set).

    PyQt's stubs say it may be None; a None here would be a Qt bug, so it raises.
    """
    style = widget.style()
    if style is None:
        raise RuntimeError(f"Qt gave {type(widget).__name__} no style")
    return style


def qt_app() -> QCoreApplication:
    """The running Qt application: there is one from the first widget on.

    ``QApplication.instance()`` is None only before one was made (or after it was
    deleted); a widget that asked then would have no event loop to run in.
    """
    app = QApplication.instance()
    if app is None:
        raise RuntimeError("no Qt application is running")
    return app


def default_checkpoint() -> str:
    """The pretrained sample model, when the sample is installed."""
    try:
        from napari_finetune.samples.synthetic_em import sample_checkpoint_path

        path = sample_checkpoint_path()
        return str(path) if path.is_file() else ""
    except Exception:  # the sample is optional; the user picks a file
        return ""


def layer_combo(viewer: Viewer, kind: type[Layer], accept: Callable[[Layer], bool]) -> ComboBox:
    """magicgui's combo box of the viewer's ``kind`` layers that ``accept`` takes.

    The choices come from this viewer (magicgui's own lookup finds the viewer
    only once the dock is in its window); the widget resets them on layer events.
    """
    combo = create_widget(annotation=kind, options={"choices": lambda _: [
        (layer.name, layer) for layer in viewer.layers
        if isinstance(layer, kind) and accept(layer)
    ]})
    if not isinstance(combo, ComboBox):  # napari registers a ComboBox for its layer types
        raise TypeError(f"magicgui made a {type(combo).__name__} for {kind.__name__} layers")
    combo.native.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
    return combo


def disconnect(signal: SignalInstance, slot: Callable[..., Any]) -> None:
    """Disconnect ``slot`` from a Qt ``signal``, if it still is connected."""
    try:
        signal.disconnect(slot)
    except (TypeError, RuntimeError):  # already disconnected
        pass


def row(*widgets: QWidget) -> QWidget:
    """The widgets side by side; labels and the "…" button keep their width."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    for widget in widgets:
        narrow = isinstance(widget, QLabel) or (
            isinstance(widget, QPushButton) and widget.text() == "…"
        )
        layout.addWidget(widget, 0 if narrow else 1)
    return row


def group(title: str, widgets: list[QWidget]) -> QGroupBox:
    """A titled box of the widgets, one under the other."""
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    for widget in widgets:
        layout.addWidget(widget)
    return box
