"""What a run looks like from the outside: labels, progress, a loss plot and a log.

The panel only formats :class:`~napari_finetune.trainer.status.Status` events;
it never reaches into the trainer. The text of each label is built by a pure
function (``*_text``) so it can be checked without a display.
"""

from __future__ import annotations

from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from napari_finetune._qt.loss_plot import LossPlot, recovery_marks
from napari_finetune._qt.parts import WrapLabel
from napari_finetune.trainer.status import Status

MAX_LOG_LINES = 500


def dtype_text(status: Status) -> str:
    """"bf16", "fp16 with loss scaling" or "fp32 (mixed precision off)"."""
    # Here, not at the top: trainer.precision imports torch, and this module is imported
    # when the widget docks, on napari's main thread (2.6-8 s there). A Status exists only
    # once a job ran, which imported torch already.
    from napari_finetune.trainer.precision import precision_words

    return precision_words(status.dtype, status.grad_scaler)


def batch_text(status: Status) -> str:
    """"batch 4 × accumulation 2 (effective 8)"."""
    return (
        f"batch {status.batch_size} × accumulation {status.accumulation} "
        f"(effective {status.effective_batch})"
    )


def switch_text(state: str, weight: float | None, dropped_at_step: int | None) -> str:
    """"on (weight 0.5)", "on", "off" or "dropped after out-of-memory at step 12"."""
    if state == "dropped":
        where = f" at step {dropped_at_step}" if dropped_at_step is not None else ""
        return f"dropped after out-of-memory{where}"
    if state == "on" and weight is not None:
        return f"on (weight {weight:g})"
    return state


def format_seconds(seconds: float) -> str:
    """``75`` -> "1:15"; ``3725`` -> "1:02:05"."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def validation_text(scores: dict[str, float]) -> str:
    """"IoU membrane 0.86, mitochondria 0.71 on held-out strokes (0–1)".

    The score of ``trainer/validation.py``: per channel, the intersection over
    union of the model's decisions with the painted voxels kept out of
    training (1 is perfect, 0 no overlap).
    """
    scores_text = ", ".join(f"{name} {iou:.2f}" for name, iou in scores.items())
    return f"IoU {scores_text} on held-out strokes (0–1)"


def progress_text(done: int, total: int, what: str) -> str:
    """"predicting block 3 / 8" after 2 blocks of a prediction; "what: done / total" else."""
    if what == "predict":
        return f"predicting block {min(done + 1, total)} / {total}"
    return f"{what}: {done} / {total}"


def placement_text(placement: str) -> str:
    """"Trains on the dask worker tcp://… (host h, device cuda:0)", or "Queued: waiting for
    a worker with a GPU (GPU=1), 1 run ahead" (a remote run's ``placement``)."""
    if placement.startswith("waiting"):
        return f"Queued: {placement}"
    return f"Trains on {placement}"


def eta_text(status: Status) -> str:
    """"step 12 / 200, ETA 3:10" (no ETA before the first step)."""
    text = f"step {status.step} / {status.total_steps}"
    if status.step > 0 and status.elapsed_s > 0:
        remaining = status.elapsed_s / status.step * (status.total_steps - status.step)
        text += f", ETA {format_seconds(remaining)}"
    return text


class StatusPanel(QWidget):
    """Labels for dtype, batch, distillation and hold; progress with ETA; loss plot; log."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.dtype_label = QLabel("–")
        self.batch_label = QLabel("–")
        self.distillation_label = QLabel("–")
        self.hold_label = QLabel("–")
        self.validation_label = QLabel("–")
        self._last_validation: dict[str, float] | None = None
        self._previous: Status | None = None  # the last status, to see what a recovery changed
        self._start_batch: int | None = None
        self.validation_label.setWordWrap(True)
        self.validation_label.setToolTip(
            "How well the model agrees with painted strokes it was not trained on (the "
            "held-out share): per class, the overlap of what it predicts with what you "
            "painted (intersection over union), from 0 (none) to 1 (perfect)")
        labels = (
            self.dtype_label,
            self.batch_label,
            self.distillation_label,
            self.hold_label,
            self.validation_label,
        )
        for label in labels:
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow("Precision:", self.dtype_label)
        form.addRow("Batch:", self.batch_label)
        form.addRow("Distillation:", self.distillation_label)
        form.addRow("Hold:", self.hold_label)
        form.addRow("Score:", self.validation_label)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("idle")
        # The words go in the line below, wrapped and whole: a bar's text is elided at
        # both ends ("topped after step 4 … prediction update") in a narrow dock.
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(8)
        self.line = WrapLabel("idle")
        self.line.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # A remote run's worker, or what it waits for: its own line, not only a log entry
        # (hidden for a run here).
        self.placement_label = WrapLabel("")
        self.placement_label.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse)
        self.placement_label.setToolTip(
            "Where the dask scheduler put the run: its worker, host and device; or, while "
            "the run is queued, what it waits for and how many runs are ahead")
        self.placement_label.setVisible(False)
        self.loss_plot = LossPlot()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(MAX_LOG_LINES)
        self.log.setMinimumHeight(80)
        self.log.setPlaceholderText("Run log: recoveries and messages appear here.")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(form)
        layout.addWidget(self.placement_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.line)
        layout.addWidget(self.loss_plot)
        layout.addWidget(self.log)

    def _set_bar(self, value: int, maximum: int, text: str) -> None:
        """Move the bar without QProgressBar's synchronous ``repaint()``.

        ``setValue`` repaints at once; in napari's window that flushes the
        whole backing store, GL canvas included (measured ~1 s on a loaded
        software-GL machine). With updates off it only schedules a paint.
        """
        bar = self.progress
        bar.setUpdatesEnabled(False)
        try:
            bar.setRange(0, max(maximum, 1))
            bar.setValue(min(value, max(maximum, 1)))
            bar.setFormat(text)
        finally:
            bar.setUpdatesEnabled(True)  # schedules one ordinary update()
        if self.line.text() != text:
            self.line.setText(text)  # schedules a paint too (and a relayout if it wraps)

    def start_run(self, total_steps: int, batch_size: int | None = None) -> None:
        """Reset for a new run of ``total_steps`` steps starting at ``batch_size``."""
        self._start_batch = batch_size
        self.loss_plot.clear()
        self.validation_label.setText("–")
        self._last_validation = self._previous = None
        self.placement_label.setVisible(False)  # a new run says where, if remote
        self._set_bar(0, total_steps, "starting…")

    def show_status(self, status: Status) -> None:
        """Update every label from one event; log what is not a routine step."""
        self.dtype_label.setText(dtype_text(status))
        self.batch_label.setText(batch_text(status))
        self.distillation_label.setText(
            switch_text(status.distillation, status.distillation_weight, status.dropped_at_step)
        )
        self.hold_label.setText(
            switch_text(status.hold_other_channels, None, status.dropped_at_step)
        )
        self._set_bar(status.step, status.total_steps, eta_text(status))
        if status.kind == "step":
            self.loss_plot.add(status.loss)
        # A recovery comes before the step it saved completes; a step status, after it.
        at = status.step + 1 if status.kind == "recovery" else status.step
        for what in recovery_marks(self._previous, status, self._start_batch):
            self.loss_plot.add_mark(at, what)
        self._previous = status
        validation, checked = status.validation, False
        if validation is not None and validation != self._last_validation:
            checked, self._last_validation = True, validation
            self.validation_label.setText(validation_text(validation))
            self.loss_plot.add_score(status.step, validation)
        if (status.kind != "step" or checked) and status.message:
            self.append_log(status.message)

    def show_placement(self, placement: str) -> None:
        """Where the remote run trains, or what it waits for (see :func:`placement_text`)."""
        self.placement_label.setText(placement_text(placement))
        self.placement_label.setVisible(True)

    def show_progress(self, done: int, total: int, what: str) -> None:
        """Block progress: "predicting block 3 / 8" (the one being computed), "export: 3 / 8"."""
        self._set_bar(done, total, progress_text(done, total, what))

    def say(self, text: str) -> None:
        """What the widget does now, on the bar (before any progress of it is known)."""
        self._set_bar(0, 1, text)

    def set_idle(self, text: str = "idle") -> None:
        """Leave the bar where it stopped but say the run is over."""
        self._set_bar(self.progress.value(), self.progress.maximum(), text)

    def append_log(self, line: str) -> None:
        """One line at the bottom of the log."""
        self.log.appendPlainText(line)
