"""Saving a painting: one writer at a time, never an older copy over a newer, never nowhere.

The autosave (``Session.save_corrections``) and a run's save before training
go through :func:`save_corrections_locked`; a copy numbered by
:func:`next_snapshot` when it was taken is not written over a newer one. The
painting goes to the store's ``labels/corrections`` when the store can take
it, else to a sibling image beside it, ``<name>.corrections.ome.zarr``
(:func:`corrections_target`), where reopening the store finds it again.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_SAVE_LOCK = threading.Lock()
# Each copy of a painting gets the next number; a store keeps the newest one written, so a
# save that started late (a worker that waited for the lock) cannot overwrite newer strokes.
_SNAPSHOTS = itertools.count(1)
_WRITTEN: dict[str, int] = {}


def next_snapshot() -> int:
    """The number of a new copy of a painting (increasing across the process)."""
    return next(_SNAPSHOTS)


def corrections_target(path: str) -> str:
    """The image whose ``labels/corrections`` the next save of ``path``'s painting writes:
    the store itself when it can take them, else its sibling ``<name>.corrections.ome.zarr``
    (made at the first save)."""
    from napari_finetune.io.labels import corrections_image

    return str(corrections_image(path))


def save_corrections_locked(
    path: str, labels: np.ndarray, channel_names: Sequence[str] | None = None,
    snapshot: int | None = None, channel_colors: Sequence[str] = (),
) -> str:
    """Write ``labels`` as the corrections of the store ``path`` (one writer at a time),
    with the classes' names and colours (``channel_colors``: the checkpoint's; else the
    palette's), into :func:`corrections_target`; returns the image written.

    With ``snapshot`` (from :func:`next_snapshot`, taken when ``labels`` was
    copied), nothing is written when a newer copy is already saved.
    """
    from napari_finetune.io.labels import ensure_sibling_image
    from napari_finetune.io.omezarr import save_corrections

    names = list(channel_names) if channel_names else None
    with _SAVE_LOCK:
        target = corrections_target(path)
        if snapshot is not None and _WRITTEN.get(str(path), 0) > snapshot:
            return target
        if target != str(path):  # the store is read-only: its sibling takes them
            ensure_sibling_image(path)
        save_corrections(target, labels, name="corrections", channel_names=names,
                         channel_colors=list(channel_colors) or None)
        if snapshot is not None:
            _WRITTEN[str(path)] = snapshot
    return target


def not_yet_written(path: str, snapshot: int) -> bool:
    """Whether the copy numbered ``snapshot`` is newer than what ``path`` holds."""
    with _SAVE_LOCK:
        return _WRITTEN.get(str(path), 0) < snapshot


@dataclass(frozen=True)
class CorrectionsSaved:
    """The painting of ``store`` was saved into ``image``'s ``labels/corrections`` (the
    store itself, or its sibling when the store is read-only)."""

    store: str
    image: str


@dataclass(frozen=True)
class CorrectionsFailed:
    """A save of ``store``'s painting failed (``line``: why); the next one tries ``next``."""

    store: str
    line: str
    next: str
