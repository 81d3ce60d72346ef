"""The colours of the classes, defined once.

The corrections layer in napari, the labels written into the store (their NGFF
``image-label`` colours), the ground truth of the sample and the demo figure
all draw a channel in the same colour: membrane yellow, mitochondria magenta.
A checkpoint saves the colours of its channels (``metadata["channel_colors"]``,
see :func:`napari_finetune.model.checkpoint.save_checkpoint`) and every reader
takes them from there when they are present and well formed.

Pure Python: no Qt, no numpy, so every layer of the package may use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

METADATA_KEY = "channel_colors"
# Painted background (value 1 of the corrections): a blue none of the channels uses.
BACKGROUND = "#4a6fd6"
# Channel k (value k + 2 of the corrections, k + 1 of a ground truth), cycled.
CHANNELS = ("#ffd21f", "#ff3fd2", "#2fe07a", "#ff7f0e", "#17becf", "#e02f2f", "#bcbd22")
_HEX = re.compile(r"^#[0-9a-fA-F]{6}([0-9a-fA-F]{2})?$")


def default_colors(count: int) -> list[str]:
    """The palette's first ``count`` channel colours (``#rrggbb``), cycled."""
    return [CHANNELS[i % len(CHANNELS)] for i in range(count)]


def channel_colors(
    channel_names: Sequence[str], metadata: Mapping[str, Any] | None = None
) -> list[str]:
    """One colour per channel: the saved ``metadata["channel_colors"]``, else the palette.

    Saved colours are used only when there is one ``#rrggbb`` (or ``#rrggbbaa``)
    string per channel; anything else (another count, a colour name) falls back
    to the palette, so a hand-edited checkpoint cannot break the layers.
    """
    saved = list((metadata or {}).get(METADATA_KEY) or [])
    if len(saved) == len(channel_names) and all(
        isinstance(c, str) and _HEX.match(c) for c in saved
    ):
        return [str(c) for c in saved]
    return default_colors(len(channel_names))


def rgba(color: str) -> list[int]:
    """``"#rrggbb"`` or ``"#rrggbbaa"`` as the 0-255 ``[r, g, b, a]`` NGFF labels use."""
    if not _HEX.match(color):
        raise ValueError(f"{color!r} is not a colour; use '#rrggbb' like {CHANNELS[0]!r}.")
    values = [int(color[i : i + 2], 16) for i in range(1, len(color), 2)]
    return values if len(values) == 4 else [*values, 255]
