"""The loss and validation curves, in napari's theme, with the run's recoveries marked.

Drawn with QPainter (repainting costs microseconds, not a figure). What a
recovery changed is read from the status fields (batch, dtype, distillation),
never from the message text: :func:`recovery_marks` compares two statuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QPainter, QPaintEvent, QPen, QPolygonF
from qtpy.QtWidgets import QSizePolicy, QWidget

from napari_finetune.trainer.status import Status

# The letters under each mark (the tooltip explains them).
MARKS = {"batch halved": "½", "fp32": "32", "distillation dropped": "D"}


def recovery_marks(
    previous: Status | None, status: Status, start_batch: int | None = None,
) -> list[str]:
    """What ``status`` gave up compared with ``previous``: keys of :data:`MARKS`.

    Before the first status, ``start_batch`` (the configured batch) is the
    reference: the precision probe may halve it before anything was reported.
    """
    if previous is None:
        return ["batch halved"] if start_batch and status.batch_size < start_batch else []
    marks = []
    if status.batch_size < previous.batch_size:
        marks.append("batch halved")
    if status.dtype == "float32" and previous.dtype != "float32":
        marks.append("fp32")
    if status.distillation == "dropped" and previous.distillation != "dropped":
        marks.append("distillation dropped")
    return marks


@dataclass
class PlotColors:
    """The plot's colours, from a napari theme (``napari.utils.theme.get_theme``)."""

    background: QColor
    text: QColor
    frame: QColor
    loss: QColor
    score: QColor
    mark: QColor

    @classmethod
    def from_theme(cls, theme: object) -> PlotColors:
        """Colours of ``theme``; the curves are shaded to stand out on its background."""
        def color(name: str) -> QColor:
            return QColor(getattr(theme, name).as_hex())

        background = color("background")
        dark = background.lightness() < 128

        def contrast(c: QColor) -> QColor:
            return c.lighter(140) if dark else c.darker(170)

        return cls(background, color("text"), color("primary"), contrast(color("current")),
                   contrast(color("warning")), contrast(color("error")))


class LossPlot(QWidget):
    """A polyline of the loss per step, the held-out IoU, the y range, and recovery marks."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.losses: list[float] = []
        self.scores: list[tuple[int, float]] = []  # (step, mean held-out IoU)
        self.marks: list[tuple[int, str]] = []  # (step, key of MARKS)
        self.colors = PlotColors.from_theme(_default_theme())
        self.setMinimumHeight(80)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setToolTip(
            "Loss per optimizer step (its range on the left) and the mean IoU on the "
            "held-out strokes (0 to 1) at each validation check. Marks under the curve: "
            "½ the batch was halved, 32 fp32 took over, D distillation was dropped "
            "(out-of-memory recoveries; the log says more)."
        )

    def set_theme(self, theme: object) -> None:
        """Repaint in a napari theme's colours."""
        self.colors = PlotColors.from_theme(theme)
        self.update()

    def clear(self) -> None:
        """Forget the curves and marks."""
        self.losses.clear()
        self.scores.clear()
        self.marks.clear()
        self.update()

    def add_score(self, step: int, scores: dict[str, float]) -> None:
        """Append one validation check (its mean IoU over the channels)."""
        if scores:
            self.scores.append((step, sum(scores.values()) / len(scores)))
            self.update()

    def add(self, loss: float | None) -> None:
        """Append one step's loss (non-finite values are skipped) and schedule a repaint."""
        if loss is not None and math.isfinite(loss):
            self.losses.append(float(loss))
            self.update()

    def add_mark(self, step: int, what: str) -> None:
        """Mark a recovery (a key of :data:`MARKS`) at ``step``."""
        self.marks.append((step, what))
        self.update()

    def paintEvent(self, event: QPaintEvent | None) -> None:  # noqa: N802 (Qt's name)
        c, align = self.colors, Qt.AlignmentFlag
        painter = QPainter(self)
        painter.fillRect(self.rect(), c.background)
        painter.setPen(c.frame)
        painter.drawRect(self.rect().adjusted(0, 0, -1, -1))
        width, height = self.width(), self.height()
        if len(self.losses) < 2:
            painter.setPen(c.text)
            painter.drawText(self.rect(), align.AlignCenter, "loss")
            painter.end()
            return
        # At most one point per pixel column: the cost stays flat on long runs.
        stride = max(1, len(self.losses) // max(width, 1))
        values = self.losses[::stride]
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        font = painter.font()
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
        painter.setFont(font)
        left = painter.fontMetrics().horizontalAdvance(f"{-abs(high):.3g}") + 6
        top, bottom, right = 6, height - 16, width - 6
        steps = max(len(self.losses), self.scores[-1][0] if self.scores else 0)

        def x_of(step: float) -> float:
            return left + (step - 1) * (right - left) / max(steps - 1, 1)

        painter.setPen(c.text)  # the axes' ranges: loss max and min, last step
        painter.drawText(QRectF(0, top - 6, left - 3, 14), align.AlignRight, f"{high:.3g}")
        painter.drawText(QRectF(0, bottom - 8, left - 3, 14), align.AlignRight, f"{low:.3g}")
        painter.drawText(QRectF(left, bottom + 2, right - left, 14), align.AlignLeft, "step 1")
        painter.drawText(QRectF(left, bottom + 2, right - left, 14), align.AlignRight,
                         f"{steps}")
        painter.setRenderHint(QPainter.Antialiasing)
        polygon = QPolygonF([QPointF(x_of(1 + i * stride), top + (high - v) / span * (
            bottom - top)) for i, v in enumerate(values)])
        painter.setPen(QPen(c.loss, 1.5))
        painter.drawPolyline(polygon)
        text = f"loss {self.losses[-1]:.4g}"
        if self.scores:  # the score shares the x axis (steps); its y axis is 0..1
            scored = QPolygonF([QPointF(x_of(step), top + (1 - score) * (bottom - top))
                                for step, score in self.scores])
            painter.setPen(QPen(c.score, 1.5))
            painter.drawPolyline(scored)
            for i in range(scored.size()):
                painter.drawEllipse(scored.at(i), 2.0, 2.0)
            text += f"   IoU {self.scores[-1][1]:.2f}"
        painter.setPen(QPen(c.mark, 1.5))
        for step, what in self.marks:
            x = x_of(max(step, 1))
            painter.drawLine(QPointF(x, top), QPointF(x, bottom))
            painter.drawText(QRectF(x + 2, bottom - 14, 30, 14), align.AlignLeft, MARKS[what])
        painter.setPen(c.text)
        painter.drawText(QRectF(left, bottom + 2, right - left, 14), align.AlignHCenter, text)
        painter.end()


def _default_theme() -> object:
    from napari.utils.theme import get_theme

    return get_theme("dark")
