"""The run's settings as plain Qt inputs, initialised from FinetuneConfig's defaults."""

from __future__ import annotations

from dataclasses import fields

from qtpy.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QLabel,
    QSpinBox,
    QWidget,
)

from napari_finetune.config import FinetuneConfig

DEFAULT_PREVIEW_INTERVAL_S = 5.0
DEVICES = ["auto", "cpu", "cuda", "mps"]


class SettingsForm(QWidget):
    """Steps, learning rate, batch, mode, distillation, hold, precision, device, preview.

    Every default comes from :class:`FinetuneConfig`, so the widget and the
    CLI start from the same numbers.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        d = FinetuneConfig()
        self.steps = _spin(1, 1_000_000, d.steps, "Optimizer steps to run")
        self.learning_rate = QDoubleSpinBox()
        self.learning_rate.setDecimals(5)
        self.learning_rate.setRange(1e-6, 1.0)
        self.learning_rate.setSingleStep(1e-5)
        self.learning_rate.setValue(d.learning_rate)
        self.learning_rate.setToolTip(
            "AdamW learning rate; lower it if the prediction gets worse or jumps"
        )
        self.batch_size = _spin(1, 512, d.batch_size,
                                "Patches per step; halved automatically on out-of-memory")
        self.mode = QComboBox()
        self.mode.addItem("LoRA adapters", "lora")
        self.mode.addItem("Full fine-tune", "full")
        self.mode.setCurrentIndex(0 if d.mode == "lora" else 1)
        self.lora_rank = _spin(1, 256, d.lora_rank, "LoRA rank (LoRA mode only)")
        self.mode.currentIndexChanged.connect(
            lambda _: self.lora_rank.setEnabled(self.mode.currentData() == "lora")
        )
        self.lora_rank.setEnabled(d.mode == "lora")
        self.distillation = QDoubleSpinBox()
        self.distillation.setRange(0.0, 100.0)
        self.distillation.setSingleStep(0.1)
        self.distillation.setValue(d.distillation)
        self.distillation.setToolTip(
            "Weight of the starting model's guidance on unpainted voxels (0 = off)"
        )
        self.hold_other_channels = QCheckBox()
        self.hold_other_channels.setToolTip(
            "Keep the channels no correction touches close to the starting model"
        )
        self.hold_other_channels.setChecked(d.hold_other_channels)
        self.mixed_precision = QCheckBox()
        self.mixed_precision.setToolTip("bf16, or fp16 with a grad scaler, on GPUs")
        self.mixed_precision.setChecked(d.mixed_precision)
        self.device = QComboBox()
        self.device.addItems(DEVICES)
        self.device.setCurrentText(d.device if d.device in DEVICES else "auto")
        self.preview_interval = QDoubleSpinBox()
        self.preview_interval.setRange(0.0, 3600.0)
        self.preview_interval.setPrefix("every ")
        self.preview_interval.setSuffix(" s")
        self.preview_interval.setDecimals(1)
        self.preview_interval.setValue(DEFAULT_PREVIEW_INTERVAL_S)
        self.preview_interval.setToolTip(
            "Refresh the prediction in view every so many seconds while training (0 = never)"
        )
        self.validation = QDoubleSpinBox()
        self.validation.setRange(0.0, 50.0)
        self.validation.setSuffix(" %")
        self.validation.setDecimals(0)
        self.validation.setValue(100 * d.validation_fraction)
        self.validation.setToolTip(
            "Share of your painting held out of training and scored every "
            f"{d.validation_every} steps (IoU per channel); 0 trains on all of it"
        )
        self.resume_degraded = QCheckBox("start from the checkpoint's degraded state")
        self.resume_degraded.setChecked(d.resume_degraded)
        self.resume_degraded.setToolTip(
            "A checkpoint from a run that stepped down (smaller batch, fp32, distillation "
            "dropped) starts there again, so it does not run out of memory the same way. "
            "Settings you change here always win; unticked, nothing is resumed."
        )
        self.hold_other_channels.setText("hold other channels")
        self.mixed_precision.setText("mixed precision")
        # What the user sets explicitly wins over a resumed degraded state; changing
        # one of these also unticks the box (tick it again to resume the rest).
        self._explicit: set[str] = set()
        for name, signal in (
            ("batch_size", self.batch_size.valueChanged),
            ("distillation", self.distillation.valueChanged),
            ("hold_other_channels", self.hold_other_channels.toggled),
            ("mixed_precision", self.mixed_precision.toggled),
        ):
            signal.connect(lambda *_, field=name: self._set_explicitly(field))
        # Two label/input pairs per row: the dock stays short enough to see the status.
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        pairs = [
            ("Steps", self.steps), ("Learning rate", self.learning_rate),
            ("Batch", self.batch_size), ("Mode", self.mode),
            ("LoRA rank", self.lora_rank), ("Distillation", self.distillation),
            ("Device", self.device), ("Preview", self.preview_interval),
            ("Held out", self.validation),
        ]
        for i, (name, widget) in enumerate(pairs):
            row, col = divmod(i, 2)
            grid.addWidget(QLabel(name), row, 2 * col)
            grid.addWidget(widget, row, 2 * col + 1)
        grid.addWidget(self.hold_other_channels, 5, 0, 1, 2)
        grid.addWidget(self.mixed_precision, 5, 2, 1, 2)
        grid.addWidget(self.resume_degraded, 6, 0, 1, 4)
        # No +/- buttons (arrow keys and the wheel still step): half the width.
        for box in (self.steps, self.learning_rate, self.batch_size, self.lora_rank,
                    self.distillation, self.preview_interval, self.validation):
            box.setButtonSymbols(QAbstractSpinBox.NoButtons)
        for box in (self.learning_rate, self.mode, self.preview_interval):
            box.setMinimumWidth(box.sizeHint().width())
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)

    def config(self, **overrides) -> FinetuneConfig:
        """A validated :class:`FinetuneConfig` from the inputs (ValueError if invalid)."""
        values = {f.name: getattr(FinetuneConfig(), f.name) for f in fields(FinetuneConfig)}
        values.update(
            steps=self.steps.value(),
            learning_rate=self.learning_rate.value(),
            batch_size=self.batch_size.value(),
            mode=self.mode.currentData(),
            lora_rank=self.lora_rank.value(),
            distillation=self.distillation.value(),
            hold_other_channels=self.hold_other_channels.isChecked(),
            mixed_precision=self.mixed_precision.isChecked(),
            device=self.device.currentText(),
            validation_fraction=self.validation.value() / 100,
            resume_degraded=self.resume_degraded.isChecked(),
            explicit_settings=tuple(sorted(self._explicit)),
        )
        values.update(overrides)
        return FinetuneConfig(**values)

    def _set_explicitly(self, field: str) -> None:
        self._explicit.add(field)
        self.resume_degraded.setChecked(False)

    @property
    def preview_interval_s(self) -> float:
        """Seconds between live previews (0 = never)."""
        return float(self.preview_interval.value())


def _spin(low: int, high: int, value: int, tip: str) -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    box.setToolTip(tip)
    return box
