"""The Objects step's role editor: each output channel's instance role, threshold, min size.

magicgui inputs, one row per channel of the chosen model, filled from the
checkpoint's roles (:func:`RolesEditor.show_roles`) and read back as
:class:`~napari_finetune.objects.ChannelRole` values (:func:`RolesEditor.roles`),
which validate themselves: a value no role can have is one ValueError line.
The values live in :class:`~napari_finetune._qt.state.RunState` (``roles``),
not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from magicgui.widgets import ComboBox, Container, FloatSpinBox, SpinBox
from qtpy.QtWidgets import QAbstractSpinBox, QLabel, QVBoxLayout, QWidget

if TYPE_CHECKING:
    from psygnal import SignalInstance

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

    def follow_role(self, role: str) -> None:
        """Threshold and min size mean nothing without a role: greyed out then."""
        self.threshold.enabled = self.min_size.enabled = role != NO_ROLE


class RolesEditor(QWidget):
    """One row per output channel: role (none, boundary, object), threshold, min size.

    ``changed`` emits whenever an input changes (not while :meth:`show_roles`
    fills them).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.inputs: dict[str, RoleInputs] = {}
        self.rows = Container(labels=False)
        self.rows.margins = (0, 0, 0, 0)
        self.rows.native.layout().setSpacing(2)
        self.title = QLabel("Instance roles (Objects uses them; Export keeps them):")
        self.title.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.rows.native)
        self.setVisible(False)  # until a checkpoint's channels are known

    @property
    def changed(self) -> SignalInstance:
        """Emits after any input changed."""
        return self.rows.changed

    def show_roles(self, roles: dict[str, ChannelRole]) -> None:
        """One row per channel of ``roles`` (a new model: new rows), set to its values."""
        with self.rows.changed.blocked():
            self.rows.clear()
            self.inputs = {channel: _inputs(channel, role) for channel, role in roles.items()}
            for inputs in self.inputs.values():
                row = Container(widgets=[inputs.role, inputs.threshold, inputs.min_size],
                                layout="horizontal", labels=True)
                row.margins = (0, 0, 0, 0)
                self.rows.append(row)
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
    inputs.role.changed.connect(inputs.follow_role)
    inputs.follow_role(inputs.role.value)
    return inputs
