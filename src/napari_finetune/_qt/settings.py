"""The run's settings: magicgui inputs generated from FinetuneConfig and its field ranges.

Each input's default comes from :class:`FinetuneConfig`, its range, step and
label from :data:`napari_finetune.config_fields.FIELDS` and its tooltip from
the field's docstring entry: the same sources as the CLI's options, so the
widget and the CLI accept the same values. The advanced settings sit in a
collapsed section (superqt's ``QCollapsible``). "Run on" (this machine or a
dask scheduler, remembered across napari starts) is a :class:`RunOnChoice`:
its choice and address in the main rows, its TLS files under Advanced.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from magicgui.widgets import (
    CheckBox,
    ComboBox,
    Container,
    FloatSpinBox,
    LineEdit,
    SpinBox,
    Widget,
)
from magicgui.widgets.bases import ValueWidget
from qtpy.QtCore import QSettings
from qtpy.QtWidgets import QAbstractSpinBox, QComboBox, QLabel, QVBoxLayout, QWidget
from superqt import QCollapsible

from napari_finetune._qt.parts import tight
from napari_finetune._qt.run_on import SCHEDULER, RunOnChoice
from napari_finetune.config import FinetuneConfig
from napari_finetune.config_fields import DEVICES, FIELDS, field_docs

DEFAULT_PREVIEW_INTERVAL_S = 5.0
# Shown in percent in the widget (0.1 -> 10 %); the range is scaled alike.
PERCENT_FIELDS = ("validation_fraction",)
# What the user sets explicitly wins over a resumed degraded state.
EXPLICIT_FIELDS = ("batch_size", "distillation", "hold_other_channels", "mixed_precision")
DEFAULT_SNAPSHOT = str(Path.home() / "napari-finetune-memory-snapshot.pickle")
AUTOBATCH_CHOICES = [("auto (on for GPUs)", None), ("on", True), ("off", False)]
# Tooltips in a biologist's words where the config's docstring (the CLI's help) speaks the
# engine's (teacher, AdamW, PEFT, None); the other fields keep their docstring's sentence.
PLAIN_TIPS = {
    "learning_rate": "How big a change each step makes to the model (the default suits "
                     "both modes)",
    "mode": "LoRA trains a few small added weights (the model changes less); full "
            "fine-tune changes every weight",
    "distillation": "Where you did not paint, keep the model's answers close to the "
                    "original model's; 0 turns this off",
    "hold_other_channels": "Classes you did not paint stay as the original model "
                           "predicted them, everywhere",
    "mixed_precision": "Faster, slightly less exact arithmetic on a GPU, checked against "
                       "full precision before the first step; the CPU always computes "
                       "in full precision",
    "autobatch": "Measure the GPU's free memory before the first step and pick how many "
                 "patches fit at once (the learning is the same); auto: on for GPUs, off "
                 "on the CPU",
    "memory_snapshot": "Write a record of the GPU's memory use to this file when it runs "
                       "out and at the end of the run, for a bug report",
    "max_grad_norm": "Limit how big one step's change may be (off: no limit); it helps "
                     "when the loss jumps",
    "voxel_size": "The size of a voxel along z, y, x (any one unit, such as '1 0.2 0.2' "
                  "µm) when the volume's file does not say it; empty: the file's, or "
                  "none. Training patches and object sizes follow it",
}


def tip_of(name: str) -> str:
    """A field's tooltip: its plain words here, else its docstring's first sentence."""
    return PLAIN_TIPS.get(name) or field_docs(FinetuneConfig).get(name, "")


def field_input(name: str, value: str | float) -> ValueWidget:
    """The magicgui input of one FinetuneConfig field, from its :class:`FieldSpec`.

    ``value`` is the field's default: a choice's string, a switch or a number (``bool``
    and ``int`` are ``float`` to a type checker).
    """
    spec, tip = FIELDS[name], tip_of(name)
    label = spec.label
    if spec.choices:
        return ComboBox(value=value, choices=[(text, v) for text, v in spec.choices],
                        label=label, tooltip=tip)
    if isinstance(value, bool):
        return CheckBox(value=value, text=label, tooltip=tip)
    # Every number field shown has a range (config_fields.FIELDS); one without would be
    # a mistake there, named here rather than as a TypeError from None * 100.
    if isinstance(value, str) or spec.low is None or spec.high is None:
        raise ValueError(f"{name}: a number input needs a number default and a range")
    scale = 100 if name in PERCENT_FIELDS else 1
    low, high = spec.low * scale, spec.high * scale
    step = None if spec.step is None else spec.step * scale  # None: magicgui's step of 1
    box: SpinBox | FloatSpinBox
    if isinstance(value, int):
        box = SpinBox(value=value * scale, min=low, max=high, step=step, label=label,
                      tooltip=tip)
    else:
        box = FloatSpinBox(value=value * scale, min=low, max=high, step=step, label=label,
                           tooltip=tip)
    box.native.setButtonSymbols(QAbstractSpinBox.NoButtons)  # arrows and wheel still step
    return box


class SettingsForm(QWidget):
    """Steps, learning rate, batch, mode, distillation, hold, precision, device, preview,
    held-out share, where to run; under "Advanced": autobatch, memory, clipping, LoRA alpha,
    patch, seed, the scheduler's TLS files.

    ``inputs`` maps each FinetuneConfig field shown to its magicgui input.

    Parameters
    ----------
    parent
        The Qt parent.
    store
        Where "Run on" is remembered (the user's napari-finetune settings when None).
    """

    def __init__(self, parent: QWidget | None = None, store: QSettings | None = None) -> None:
        super().__init__(parent)
        self.run_on = RunOnChoice(store)
        d = FinetuneConfig()
        self.inputs: dict[str, ValueWidget] = {
            name: field_input(name, getattr(d, name))
            for name in ("steps", "learning_rate", "batch_size", "mode", "lora_rank",
                         "distillation", "validation_fraction", "hold_other_channels",
                         "mixed_precision", "memory_fraction", "lora_alpha", "seed")
        }
        i = self.inputs
        self.steps, self.learning_rate, self.batch_size = (
            i["steps"], i["learning_rate"], i["batch_size"])
        self.mode, self.lora_rank, self.distillation = i["mode"], i["lora_rank"], i["distillation"]
        self.validation = i["validation_fraction"]
        self.validation.native.setSuffix(" %")
        self.validation.native.setDecimals(0)
        self.hold_other_channels, self.mixed_precision = (
            i["hold_other_channels"], i["mixed_precision"])
        self.device = ComboBox(value=d.device if d.device in DEVICES else "auto",
                               choices=list(DEVICES), label="Device",
                               tooltip=tip_of("device"))
        self.preview_interval = FloatSpinBox(
            value=DEFAULT_PREVIEW_INTERVAL_S, min=0.0, max=3600.0, step=0.5, label="Preview",
            tooltip="Refresh the prediction in view every so many seconds while training "
                    "(0 = never)")
        self.preview_interval.native.setPrefix("every ")
        self.preview_interval.native.setSuffix(" s")
        self.preview_interval.native.setDecimals(1)
        self.preview_interval.native.setButtonSymbols(QAbstractSpinBox.NoButtons)
        self.resume_degraded = CheckBox(
            value=d.resume_degraded, text="resume degraded state",
            tooltip="A checkpoint from a run that stepped down (smaller batch, fp32, "
                    "distillation dropped) starts there again, so it does not run out of "
                    "memory the same way. Settings you change here always win; unticked, "
                    "nothing is resumed.")
        # Advanced: each None-able field gets an explicit "off"/"auto" value.
        self.autobatch = ComboBox(value=d.autobatch, choices=AUTOBATCH_CHOICES,
                                  label=FIELDS["autobatch"].label,
                                  tooltip=tip_of("autobatch"))
        self.memory_fraction = i["memory_fraction"]
        tip = tip_of("memory_snapshot")
        self.record_memory = CheckBox(value=d.memory_snapshot is not None,
                                      text=FIELDS["memory_snapshot"].label, tooltip=tip)
        self.memory_snapshot = LineEdit(value=d.memory_snapshot or DEFAULT_SNAPSHOT,
                                        tooltip=tip)
        self.record_memory.changed.connect(
            lambda on: setattr(self.memory_snapshot, "enabled", on))
        self.memory_snapshot.enabled = self.record_memory.value
        self.max_grad_norm = field_input("max_grad_norm", d.max_grad_norm or 0.0)
        self.max_grad_norm.native.setSpecialValueText("off")  # 0 shows "off": no clipping
        self.lora_alpha, self.seed = i["lora_alpha"], i["seed"]
        self.patch_shape = LineEdit(value=" ".join(str(n) for n in d.patch_shape),
                                    label=FIELDS["patch_shape"].label,
                                    tooltip=tip_of("patch_shape"))
        # Empty: the store's NGFF scale (read when a run starts), or none.
        self.voxel_size = LineEdit(
            value=" ".join(f"{v:g}" for v in d.voxel_size) if d.voxel_size else "",
            label="Voxel size", tooltip=tip_of("voxel_size"))
        self.voxel_size.native.setPlaceholderText("from the file")
        self.inputs.update(autobatch=self.autobatch, memory_snapshot=self.memory_snapshot,
                           max_grad_norm=self.max_grad_norm, patch_shape=self.patch_shape,
                           device=self.device, voxel_size=self.voxel_size)

        self._lora_share_per_rank = 0.0
        self.lora_advice = QLabel()
        self.lora_advice.setWordWrap(True)
        self.mode.changed.connect(self._mode_changed)
        self.lora_rank.changed.connect(lambda *_: self._show_lora_advice())
        self._mode_changed(self.mode.value)
        self._explicit: set[str] = set()
        for name in EXPLICIT_FIELDS:
            self.inputs[name].changed.connect(lambda *_, field=name: self._set_explicitly(field))

        # Two inputs per row: the dock stays short enough to see the status.
        self.main = Container(widgets=[
            _pair(self.steps, self.learning_rate), _pair(self.batch_size, self.mode),
            _pair(self.lora_rank, self.distillation), _pair(self.device, self.preview_interval),
            _pair(self.validation, self.hold_other_channels),
            _pair(self.mixed_precision, self.resume_degraded),
            _pair(self.run_on.where), address := _pair(self.run_on.address),
        ], labels=False)
        tls = tuple(_pair(box) for box in self.run_on.tls.values())
        # Rows narrow enough for a dock of at most 420 px.
        self.advanced = Container(widgets=[
            _pair(self.autobatch), _pair(self.memory_fraction, self.seed),
            _pair(self.record_memory), _pair(self.memory_snapshot),
            _pair(self.max_grad_norm), _pair(self.lora_alpha, self.patch_shape),
            _pair(self.voxel_size), *tls,
        ], labels=False)
        # The scheduler's address and TLS files only when "Run on" is a scheduler.
        self.scheduler_rows = (address, *tls)
        self.run_on.where.changed.connect(self._run_on_changed)
        self._run_on_changed(self.run_on.where.value)
        for box in (self.main, self.advanced):
            box.margins = (0, 0, 0, 0)
            box.native.layout().setSpacing(2)
        self.advanced_box = QCollapsible("Advanced")
        tight(self.advanced_box)
        self.advanced_box.addWidget(self.advanced.native)
        self.advanced_box.collapse(animate=False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.main.native)
        layout.addWidget(self.lora_advice)
        layout.addWidget(self.advanced_box)
        for combo in (self.mode, self.device, self.autobatch, self.run_on.where):
            # The whole choice is read ("Full fine-tune", not "Full fine-tur").
            combo.native.setSizeAdjustPolicy(QComboBox.AdjustToContents)

    def _run_on_changed(self, where: str) -> None:
        for box in self.scheduler_rows:
            box.visible = where == SCHEDULER

    def _mode_changed(self, mode: str) -> None:
        self.lora_rank.enabled = self.lora_alpha.enabled = mode == "lora"
        self._show_lora_advice()

    def set_lora_share(self, share_per_rank: float) -> None:
        """The chosen model's LoRA weights per unit of rank (0 when no model is read)."""
        self._lora_share_per_rank = share_per_rank
        self._show_lora_advice()

    def _show_lora_advice(self) -> None:
        # The advice only speaks when LoRA is picked for a network it does not suit.
        rank, share = int(self.lora_rank.value), self._lora_share_per_rank
        text = ""
        if share > 0:  # a model was read (in a worker, which imported torch): no cost here
            from napari_finetune.model.lora import advice_for_share

            text = advice_for_share(share * rank, rank)
        self.lora_advice.setText(text if self.mode.value == "lora" else "")
        self.lora_advice.setVisible(bool(self.lora_advice.text()))

    def config(self, **overrides: object) -> FinetuneConfig:
        """A validated :class:`FinetuneConfig` from the inputs (ValueError if invalid).

        ``overrides`` are field values of any of the fields' types; FinetuneConfig
        checks them.
        """
        values = {f.name: getattr(FinetuneConfig(), f.name) for f in fields(FinetuneConfig)}
        for name, widget in self.inputs.items():
            values[name] = widget.value
        for name in PERCENT_FIELDS:
            values[name] = self.inputs[name].value / 100
        values.update(
            patch_shape=_sizes(self.patch_shape.value),
            voxel_size=_voxel_size(self.voxel_size.value),
            memory_snapshot=(self.memory_snapshot.value.strip() or DEFAULT_SNAPSHOT)
            if self.record_memory.value else None,
            max_grad_norm=self.max_grad_norm.value or None,
            resume_degraded=self.resume_degraded.value,
            explicit_settings=tuple(sorted(self._explicit)),
            # A starting model that gets most of the painting wrong is no teacher.
            distillation_check=True,
        )
        values.update(overrides)
        return FinetuneConfig(**values)

    def _set_explicitly(self, field: str) -> None:
        self._explicit.add(field)
        self.resume_degraded.value = False

    def device_name(self) -> str:
        """The chosen device ("auto", "cpu", "cuda" or "mps")."""
        return self.device.value

    def scheduler(self) -> str | None:
        """The dask scheduler's address, None for "this machine" (ValueError if invalid)."""
        return self.run_on.scheduler()

    def security_files(self) -> tuple[str, str, str] | None:
        """(CA file, certificate, key) for ``distributed.Security``; None: no TLS files
        or "this machine" (ValueError if incomplete, missing, or the address is tcp://)."""
        return self.run_on.security_files()

    @property
    def preview_interval_s(self) -> float:
        """Seconds between live previews (0 = never)."""
        return float(self.preview_interval.value)


def _pair(*widgets: Widget) -> Container:
    """A row of inputs, each with its label on the left (check boxes carry their own)."""
    row = Container(widgets=list(widgets), layout="horizontal", labels=True)
    row.margins = (0, 0, 0, 0)
    return row


def _sizes(text: str) -> tuple[int, ...]:
    """ "32 64 64" (or "32, 64, 64") -> (32, 64, 64), each size checked against its range."""
    spec = FIELDS["patch_shape"]
    try:
        sizes = tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        sizes = ()
    if not sizes:
        raise ValueError(f"Patch must be whole numbers such as '32 64 64', got {text!r}.")
    for size in sizes:
        spec.check("each patch size", size)
    return sizes


def _voxel_size(text: str) -> tuple[float, ...] | None:
    """ "40 8 8" (or "1, 0.2, 0.2") -> (40.0, 8.0, 8.0); empty -> None (the file's scale)."""
    if not text.strip():
        return None
    try:
        sizes = tuple(float(part) for part in text.replace(",", " ").split())
    except ValueError:
        sizes = ()
    if not sizes or not all(v > 0 and v < float("inf") for v in sizes):
        raise ValueError(f"Voxel size must be positive numbers such as '40 8 8' (z y x), got "
                         f"{text!r}; leave it empty to use the file's.")
    return sizes
