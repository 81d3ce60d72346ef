"""Saving a painting into its store: one writer at a time, never an older copy over a newer.

The widget's autosave and a run's save before training (and a Session's) go
through :func:`save_corrections_locked`; a copy numbered by
:func:`next_snapshot` when it was taken is not written over a newer one.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np

_SAVE_LOCK = threading.Lock()
# Each copy of a painting gets the next number; a store keeps the newest one written, so a
# save that started late (a worker that waited for the lock) cannot overwrite newer strokes.
_SNAPSHOTS = itertools.count(1)
_WRITTEN: dict[str, int] = {}


def next_snapshot() -> int:
    """The number of a new copy of a painting (increasing across the process)."""
    return next(_SNAPSHOTS)


def save_corrections_locked(
    path: str, labels: np.ndarray, channel_names: Sequence[str] | None = None,
    snapshot: int | None = None, channel_colors: Sequence[str] = (),
) -> str:
    """Write ``labels`` to ``<path>/labels/corrections`` (one writer at a time), with the
    classes' names and colours (``channel_colors``: the checkpoint's; else the palette's).

    With ``snapshot`` (from :func:`next_snapshot`, taken when ``labels`` was
    copied), nothing is written when a newer copy is already in the store.
    """
    from napari_finetune.io.omezarr import save_corrections

    names = list(channel_names) if channel_names else None
    with _SAVE_LOCK:
        if snapshot is not None and _WRITTEN.get(str(path), 0) > snapshot:
            return path
        save_corrections(path, labels, name="corrections", channel_names=names,
                         channel_colors=list(channel_colors) or None)
        if snapshot is not None:
            _WRITTEN[str(path)] = snapshot
    return path


def not_yet_written(path: str, snapshot: int) -> bool:
    """Whether the copy numbered ``snapshot`` is newer than what ``path`` holds."""
    with _SAVE_LOCK:
        return _WRITTEN.get(str(path), 0) < snapshot
