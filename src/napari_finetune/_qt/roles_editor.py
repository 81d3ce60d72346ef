"""The Objects step's role editor: each output channel's instance role, threshold, min size.

magicgui inputs in a grid, one row per channel of the chosen model, filled from the
checkpoint's roles (:func:`RolesEditor.show_roles`) and read back as
:class:`~napari_finetune.objects.ChannelRole` values (:func:`RolesEditor.roles`),
which validate themselves: a value no role can have is one ValueError line.
The values live in :class:`~napari_finetune._qt.state.WidgetState` (``roles``),
not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from magicgui.widgets import ComboBox, FloatSpinBox, SpinBox
from qtpy.QtCore import Signal
from qtpy.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QGridLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from napari_finetune.objects import ChannelRole

NO_ROLE = "none"  # the combo's text for role None (magicgui takes None as "no choice")
ROLE_CHOICES = (NO_ROLE, "boundary", "object")
ROLE_TIP = ("boundary: the objects are the regions this channel separates (cells from "
            "membranes); object: the objects are its connected foreground (mitochondria); "
            "none: no objects from this channel")
THRESHOLD_TIP = ("In (0, 1). Boundary: voxels below it are inside a region; object: voxels "
                 "above it are foreground")
MIN_SIZE_TIP = "Objects smaller than this many voxels are dropped"
MAX_MIN_SIZE = 10**9


@dataclass(frozen=True)
class RoleInputs:
    """One channel's inputs."""

    role: ComboBox
    threshold: FloatSpinBox
    min_size: SpinBox

    @property
    def widgets(self) -> tuple[ComboBox, FloatSpinBox, SpinBox]:
        """The inputs in the grid's column order."""
        return self.role, self.threshold, self.min_size

    def follow_role(self, role: str) -> None:
        """Threshold and min size mean nothing without a role: greyed out then."""
        self.threshold.enabled = self.min_size.enabled = role != NO_ROLE


class RolesEditor(QWidget):
    """A grid, one row per output channel: its name, role (none, boundary, object),
    threshold and min size under one header (the dock stays as narrow as the settings).

    ``changed`` emits whenever an input changes (not while :meth:`show_roles`
    fills them).
    """

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.inputs: dict[str, RoleInputs] = {}
        self.title = QLabel("Instance roles (Objects uses them; Export keeps them):")
        self.title.setWordWrap(True)
        self.grid = QWidget()
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addWidget(self.title)
        self._layout.addWidget(self.grid)
        self.setVisible(False)  # until a checkpoint's channels are known

    def show_roles(self, roles: dict[str, ChannelRole]) -> None:
        """One row per channel of ``roles`` (a new model: new rows), set to its values."""
        self.inputs = {channel: _inputs(channel, role) for channel, role in roles.items()}
        grid = QWidget()
        layout = QGridLayout(grid)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setVerticalSpacing(2)
        for column, text in enumerate(("channel", "role", "threshold", "min size")):
            layout.addWidget(QLabel(text), 0, column)
        for row, (channel, inputs) in enumerate(self.inputs.items(), start=1):
            layout.addWidget(QLabel(channel), row, 0)
            for column, widget in enumerate(inputs.widgets, start=1):
                layout.addWidget(widget.native, row, column)
                widget.changed.connect(lambda *_: self.changed.emit())
        for column in (1, 2, 3):
            layout.setColumnStretch(column, 1)
        # The old rows go with their grid (a new model may have other channels).
        self._layout.replaceWidget(self.grid, grid)
        self.grid.setParent(None)  # off the editor now (it would cover the title until deleted)
        self.grid.deleteLater()
        self.grid = grid
        self.setVisible(bool(roles))

    def roles(self, base: dict[str, ChannelRole]) -> dict[str, ChannelRole]:
        """``base`` (every channel's role) with the inputs' role, threshold and min size;
        the other fields (seed distance, split) are kept. A value no role can have raises
        a one-line ValueError naming the channel and the fix."""
        from napari_finetune.objects import ChannelRole  # imported by info_job already

        out = {}
        for channel, role in base.items():
            inputs = self.inputs.get(channel)
            if inputs is None:
                out[channel] = role
                continue
            chosen = inputs.role.value
            out[channel] = ChannelRole.from_dict({
                **role.to_dict(), "role": None if chosen == NO_ROLE else chosen,
                "threshold": float(inputs.threshold.value),
                "min_size": int(inputs.min_size.value),
            }, channel)
        return out


def _inputs(channel: str, role: ChannelRole) -> RoleInputs:
    """The inputs of one channel, labelled with its name, set to ``role``."""
    inputs = RoleInputs(
        role=ComboBox(value=role.role or NO_ROLE, choices=list(ROLE_CHOICES), label=channel,
                      tooltip=f"{channel}: {ROLE_TIP}"),
        # 0 and 1 stay reachable: ChannelRole says why they cannot be, in one line.
        threshold=FloatSpinBox(value=role.threshold, min=0.0, max=1.0, step=0.05,
                               label="threshold", tooltip=THRESHOLD_TIP),
        min_size=SpinBox(value=role.min_size, min=0, max=MAX_MIN_SIZE, step=10,
                         label="min size", tooltip=MIN_SIZE_TIP),
    )
    inputs.threshold.native.setDecimals(3)
    inputs.threshold.value = role.threshold  # again, at three decimals (0.125 stays)
    for box in (inputs.threshold, inputs.min_size):
        box.native.setButtonSymbols(QAbstractSpinBox.NoButtons)  # arrows and wheel still step
    inputs.role.native.setSizeAdjustPolicy(QComboBox.AdjustToContents)  # "boundary" whole
    inputs.role.changed.connect(inputs.follow_role)
    inputs.follow_role(inputs.role.value)
    return inputs
