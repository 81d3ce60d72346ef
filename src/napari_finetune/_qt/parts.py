"""Small parts of the dock: layout helpers, layer combo boxes, the default checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from napari import Viewer
    from qtpy.QtCore import SignalInstance

from magicgui.widgets import ComboBox, create_widget
from napari.layers import Layer
from qtpy.QtCore import QCoreApplication, QEvent, QObject, QSize, Qt, Signal
from qtpy.QtGui import QPainter, QPaintEvent, QPalette, QResizeEvent
from qtpy.QtWidgets import (
    QApplication,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStyle,
    QStyleOptionFrame,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from superqt import QCollapsible


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


class WrapLabel(QLabel):
    """A word-wrapped label always as tall as its text at its width: in a scroll area a
    wrapped QLabel is given the height of its text at some other width, and its last
    line is cut."""

    def __init__(self, text: str = "") -> None:
        super().__init__(text)
        self.setWordWrap(True)

    def setText(self, text: str | None) -> None:  # noqa: N802 (Qt override)
        """Show ``text``, the label's height following it."""
        super().setText(text)
        self._fit()

    def resizeEvent(self, event: QResizeEvent | None) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        height = self.heightForWidth(self.width()) if self.width() > 0 else -1
        if height > 0 and height != self.minimumHeight():
            self.setMinimumHeight(height)


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


class Section(QWidget):
    """A titled section of the dock that folds to its title.

    A hidden body takes no room, in height or width, and an open one is laid out
    like any widget (a wrapped label grows it), unlike an animated collapsible
    whose height is fixed when it opens. ``toggled`` says open (True) or folded.

    Parameters
    ----------
    title
        The header's words.
    """

    toggled = Signal(bool)

    def __init__(self, title: str) -> None:
        super().__init__()
        self.header = QToolButton()
        self.header.setText(title)
        self.header.setCheckable(True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        font = self.header.font()
        font.setBold(True)
        self.header.setFont(font)
        self.header.toggled.connect(self._show)
        self.body = QWidget()
        self._body = QVBoxLayout(self.body)
        self._body.setContentsMargins(0, 0, 0, 4)
        self._body.setSpacing(4)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.header)
        layout.addWidget(self.body)
        self._show(False)

    def addWidget(self, widget: QWidget) -> None:  # noqa: N802 (QCollapsible's name)
        """One more widget in the body, under the others."""
        self._body.addWidget(widget)

    def isExpanded(self) -> bool:  # noqa: N802 (QCollapsible's name)
        """Whether the body shows."""
        return self.header.isChecked()

    def expand(self, animate: bool = False) -> None:
        """Show the body (``animate`` is accepted for QCollapsible's callers, unused)."""
        self.header.setChecked(True)

    def collapse(self, animate: bool = False) -> None:
        """Fold to the title."""
        self.header.setChecked(False)

    def _show(self, shown: bool) -> None:
        self.header.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.body.setVisible(shown)
        self.toggled.emit(shown)


def section(title: str, widgets: list[QWidget], expanded: bool = True,
            indent: int = 0) -> Section:
    """A :class:`Section` of ``widgets``, open or folded, its body indented by ``indent``.

    The dock opens the section in use and folds the others, so a laptop's screen
    shows what matters now without scrolling.
    """
    box = Section(title)
    box._body.setContentsMargins(indent, 0, 0, 4)
    for widget in widgets:
        box.addWidget(widget)
    if expanded:
        box.expand()
    return box


def tight(box: QCollapsible, indent: int = 6) -> None:
    """No animation (a fold is a layout change, done at once) and no margins of its own
    beyond a small indent: nested sections cost the dock's width little."""
    box.setDuration(0)
    if (layout := box.layout()) is not None:
        layout.setContentsMargins(0, 0, 0, 0)
    content = box.content()
    if content is not None and (inner := content.layout()) is not None:
        inner.setContentsMargins(indent, 0, 0, 4)  # below the title, maybe indented
        inner.setSpacing(4)


class SideScroll(QScrollArea):
    """A part that may be wider than the dock scrolls sideways on its own (its height
    follows it), so the dock itself keeps its width and never scrolls sideways.

    Parameters
    ----------
    widget
        The part (e.g. the roles editor, a row per channel).
    """

    def __init__(self, widget: QWidget) -> None:
        super().__init__()
        self.setFrameShape(QScrollArea.NoFrame)
        self.setWidgetResizable(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setWidget(widget)
        widget.installEventFilter(self)

    def eventFilter(self, watched: QObject | None, event: QEvent | None) -> bool:  # noqa: N802
        """The part's layout changed (new rows): this one's height follows."""
        if event is not None and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()
        return super().eventFilter(watched, event)

    def _height(self) -> int:
        inner = self.widget()
        if inner is None:
            return 0
        bar = self.horizontalScrollBar()
        extra = bar.sizeHint().height() if (
            bar is not None and inner.minimumSizeHint().width() > self.width()) else 0
        return inner.sizeHint().height() + extra

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        inner = self.widget()
        width = inner.sizeHint().width() if inner is not None else 0
        return QSize(width, self._height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(60, self._height())

    def resizeEvent(self, event: QResizeEvent | None) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self.updateGeometry()  # the side bar may come or go with the width
