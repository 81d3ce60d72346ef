"""The Objects step's role editor: each output channel's instance role, threshold, min size,
seed distance, and where the last two came from (set by you, your painting, the default).

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
    from collections.abc import Mapping

    from napari_finetune.objects import ChannelRole, RolesFromPainting

NO_ROLE = "none"  # the combo's text for role None (magicgui takes None as "no choice")
ROLE_CHOICES = (NO_ROLE, "boundary", "object")
ROLE_TIP = ("boundary: the objects are the regions this channel separates (cells from "
            "membranes); object: the objects are its connected foreground (mitochondria); "
            "none: no objects from this channel")
THRESHOLD_TIP = ("In (0, 1). Boundary: voxels below it are inside a region; object: voxels "
                 "above it are foreground")
MIN_SIZE_TIP = "Objects smaller than this many voxels are dropped"
SEED_DISTANCE_TIP = ("Voxels (of the finest axis), >= 1: about the objects' radius. Object: the "
                     "smallest distance between two objects' middles; boundary: how deep a "
                     "region's middle must be")
MAX_MIN_SIZE = 10**9
MAX_SEED_DISTANCE = 10**4
ESTIMATED = ("min_size", "seed_distance")  # the values Objects may take from the painting
# Where a value comes from until Objects says (napari_finetune.objects.from_painting's words).
SET_BY_YOU, DEFAULT = "set by you", "default"


@dataclass(frozen=True)
class RoleInputs:
    """One channel's inputs."""

    role: ComboBox
    threshold: FloatSpinBox
    min_size: SpinBox
    seed_distance: FloatSpinBox

    @property
    def widgets(self) -> tuple[ComboBox, FloatSpinBox, SpinBox, FloatSpinBox]:
        """The inputs in the grid's column order."""
        return self.role, self.threshold, self.min_size, self.seed_distance

    def follow_role(self, role: str) -> None:
        """Threshold, min size and seed distance mean nothing without a role: greyed out."""
        enabled = role != NO_ROLE
        self.threshold.enabled = self.min_size.enabled = self.seed_distance.enabled = enabled

    def show_source(self, field: str, source: str) -> None:
        """The tooltip of ``field``'s input says where its value came from."""
        tip = MIN_SIZE_TIP if field == "min_size" else SEED_DISTANCE_TIP
        getattr(self, field).tooltip = f"{tip}. This value: {source}"


class RolesEditor(QWidget):
    """A grid, one row per output channel: its name, role (none, boundary, object),
    threshold, min size and seed distance under one header (the dock stays as narrow as
    the settings), and below it where each min size and seed distance came from.

    ``changed`` emits whenever an input changes (not while :meth:`show_roles` or
    :meth:`show_found` fill them). :meth:`set_by_you` names the min sizes and seed
    distances the user typed: Objects estimates the others from the painting.
    """

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.inputs: dict[str, RoleInputs] = {}
        self._set: dict[str, set[str]] = {}  # per channel, the estimated fields the user set
        self._filling = False  # show_found writes the inputs: not the user's values
        self._sources: dict[str, dict[str, str]] = {}  # per channel with a role, per field
        self.title = QLabel("Instance roles (Objects uses them; Export keeps them):")
        self.title.setWordWrap(True)
        self.grid = QWidget()
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addWidget(self.title)
        self._layout.addWidget(self.grid)
        self.sources = QLabel()  # where the values came from, one line per channel
        self.sources.setWordWrap(True)
        self._layout.addWidget(self.sources)
        self.setVisible(False)  # until a checkpoint's channels are known

    def show_roles(
        self, roles: dict[str, ChannelRole],
        sources: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """One row per channel of ``roles`` (a new model: new rows), set to its values;
        ``sources`` are where the checkpoint recorded they came from (a value it says the
        user set stays the user's)."""
        sources = sources or {}
        self.inputs = {channel: _inputs(channel, role) for channel, role in roles.items()}
        self._set = {channel: {f for f in ESTIMATED
                               if sources.get(channel, {}).get(f) == SET_BY_YOU}
                     for channel in roles}
        grid = QWidget()
        layout = QGridLayout(grid)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setVerticalSpacing(2)
        for column, text in enumerate(("channel", "role", "threshold", "min size", "seed dist.")):
            layout.addWidget(QLabel(text), 0, column)
        for row, (channel, inputs) in enumerate(self.inputs.items(), start=1):
            layout.addWidget(QLabel(channel), row, 0)
            for column, widget in enumerate(inputs.widgets, start=1):
                layout.addWidget(widget.native, row, column)
                widget.changed.connect(lambda *_: self._edited())
            for field in ESTIMATED:
                getattr(inputs, field).changed.connect(
                    lambda *_, c=channel, f=field: self._typed(c, f))
        for column in (1, 2, 3, 4):
            layout.setColumnStretch(column, 1)
        # The old rows go with their grid (a new model may have other channels).
        self._layout.replaceWidget(self.grid, grid)
        self.grid.setParent(None)  # off the editor now (it would cover the title until deleted)
        self.grid.deleteLater()
        self.grid = grid
        self._show_sources(roles, {channel: {f: sources.get(channel, {}).get(f, DEFAULT)
                                             for f in ESTIMATED} for channel in roles})
        self.setVisible(bool(roles))

    def _edited(self) -> None:
        if not self._filling:
            self.changed.emit()

    def _typed(self, channel: str, field: str) -> None:
        if self._filling:
            return
        self._set.setdefault(channel, set()).add(field)
        self.inputs[channel].show_source(field, SET_BY_YOU)
        self.sources.setText(self._describe())

    def set_by_you(self) -> dict[str, set[str]]:
        """Per channel, the min size and seed distance the user set (typed, or recorded so
        in the checkpoint): Objects keeps these and estimates the others."""
        return {channel: set(fields) for channel, fields in self._set.items() if fields}

    def show_found(self, found: RolesFromPainting) -> None:
        """The min sizes and seed distances Objects used (the painting's where the user set
        none) in the inputs, and where each came from; ``changed`` does not emit."""
        self._filling = True
        try:
            for channel, role in found.roles.items():
                inputs = self.inputs.get(channel)
                if inputs is not None:
                    inputs.min_size.value = role.min_size
                    inputs.seed_distance.value = role.seed_distance
        finally:
            self._filling = False
        self._show_sources(found.roles, found.sources)

    def _show_sources(self, roles: Mapping[str, ChannelRole],
                      sources: Mapping[str, Mapping[str, str]]) -> None:
        self._sources = {channel: dict(sources[channel]) for channel in roles
                         if channel in sources and roles[channel].role is not None}
        for channel, per in self._sources.items():
            if channel in self.inputs:
                for field, source in per.items():
                    self.inputs[channel].show_source(field, source)
        self.sources.setText(self._describe())

    def _describe(self) -> str:
        """One line per channel with a role: its min size and seed distance, and whence."""
        lines = []
        for channel, per in self._sources.items():
            inputs = self.inputs.get(channel)
            if inputs is None or inputs.role.value == NO_ROLE:
                continue
            per = {**per, **{f: SET_BY_YOU for f in self._set.get(channel, ())}}
            size = f"min size {inputs.min_size.value}"
            seed = f"seed distance {inputs.seed_distance.value:g}"
            if per.get("min_size") == per.get("seed_distance"):
                lines.append(f"{channel}: {size}, {seed}: {per.get('min_size')}")
            else:
                lines.append(f"{channel}: {size} ({per.get('min_size')}), "
                             f"{seed} ({per.get('seed_distance')})")
        return "\n".join(lines)

    def roles(self, base: dict[str, ChannelRole]) -> dict[str, ChannelRole]:
        """``base`` (every channel's role) with the inputs' role, threshold, min size and
        seed distance; the other fields (split, seed threshold) are kept. A value no role can
        have raises a one-line ValueError naming the channel and the fix."""
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
                "seed_distance": float(inputs.seed_distance.value),
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
        # Below 1 stays reachable too: ChannelRole says why it cannot be.
        seed_distance=FloatSpinBox(value=role.seed_distance, min=0.0, max=MAX_SEED_DISTANCE,
                                   step=0.5, label="seed distance", tooltip=SEED_DISTANCE_TIP),
    )
    inputs.threshold.native.setDecimals(3)
    inputs.threshold.value = role.threshold  # again, at three decimals (0.125 stays)
    inputs.seed_distance.native.setDecimals(2)
    inputs.seed_distance.value = role.seed_distance
    for box in (inputs.threshold, inputs.min_size, inputs.seed_distance):
        box.native.setButtonSymbols(QAbstractSpinBox.NoButtons)  # arrows and wheel still step
    inputs.role.native.setSizeAdjustPolicy(QComboBox.AdjustToContents)  # "boundary" whole
    inputs.role.changed.connect(inputs.follow_role)
    inputs.follow_role(inputs.role.value)
    return inputs
