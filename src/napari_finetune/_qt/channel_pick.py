"""Which channel of a multi-channel store a single-channel model sees: the "Channel" row.

napari-ome-zarr opens a CZYX store as one image layer per channel (its reader
gives ``channel_axis``), each layer ZYX; the store itself still has all the
channels. A single-channel model needs one of them, and the user names it
here before painting: the row is shown only when the store has several channels
and the model takes one, and lists the store's ``omero`` channel names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from qtpy.QtCore import Signal
from qtpy.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

if TYPE_CHECKING:
    from napari_finetune.arrays import AxesImage

PLACEHOLDER = "choose a channel…"
CHOOSE_FIRST = "choose the channel first"


@lru_cache(maxsize=8)
def store_image(store: str) -> AxesImage | None:
    """The store's level 0 with its channels and time points (lazy: metadata only);
    None when the store cannot be opened that way."""
    from napari_finetune.io.volume import VolumeError, open_volume

    try:
        return open_volume(store, keep_axes=True).input
    except (VolumeError, ValueError, OSError):
        return None


class ChannelPick(QWidget):
    """A "Channel:" label and a combo: entry 0 asks for a choice, entry ``1 + c`` is
    channel ``c``; :attr:`changed` is emitted when the choice changes."""

    changed = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.combo = QComboBox()
        self.combo.setToolTip("The channel of the store the single-channel model sees")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("Channel:"))
        layout.addWidget(self.combo, 1)
        self.combo.currentIndexChanged.connect(lambda *_: self.changed.emit())
        self._names: tuple[str, ...] = ()
        self.setVisible(False)

    def show_channels(self, image: AxesImage | None, needed: bool) -> None:
        """List ``image``'s channels when ``needed`` (a single-channel model on several
        channels), else hide the row; the choice is kept while the channels stay."""
        entries = () if image is None or not needed else tuple(
            image.describe_channel(c) for c in range(image.channels))
        if entries != self._names:
            self._names = entries
            self.combo.blockSignals(True)
            self.combo.clear()
            if entries:
                self.combo.addItems([PLACEHOLDER, *entries])
            self.combo.blockSignals(False)
            self.changed.emit()
        self.setVisible(bool(entries))

    @property
    def needed(self) -> bool:
        """Whether a channel must be chosen here (the row is in use)."""
        return bool(self._names)

    def choice(self) -> int | None:
        """The channel chosen, or None (none yet, or none needed)."""
        index = self.combo.currentIndex()
        return index - 1 if self._names and index >= 1 else None
