"""Stores still being written in the background: a reader or writer of one waits for it.

The napari sample returns its layers from memory at once and writes its store
in a background thread (writing it on the main thread froze napari for
seconds). The layers already name the store, so an autosave, a run or a save
of predictions may ask for it before it is there: :func:`wait_written` (called
by :func:`~napari_finetune.io.volume.open_volume` and
:func:`~napari_finetune.io.labels.save_corrections`, always in a job's thread)
blocks until the write ended and raises its failure. A store nobody announced
returns at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

_LOCK = threading.Lock()
# A store's final path -> the event set when its write ended, and the write's failure.
_PENDING: dict[str, tuple[threading.Event, list[BaseException]]] = {}
# A write that takes longer is stuck (a full disk retried, a dead mount): say so rather
# than hang the job that waits.
WAIT_S = 600.0


def _key(path: str | os.PathLike) -> str:
    return str(Path(path).expanduser().resolve())


def announce(path: str | os.PathLike) -> Callable[[BaseException | None], None]:
    """Mark ``path`` as being written; call the returned function once, when it ended
    (with the failure, or None when the store is complete)."""
    event, failure = threading.Event(), list[BaseException]()
    key = _key(path)
    with _LOCK:
        _PENDING[key] = (event, failure)

    def ended(exc: BaseException | None) -> None:
        if exc is not None:
            failure.append(exc)
        event.set()
        if exc is None:  # a failure stays: whoever comes later is told it too
            with _LOCK:
                if _PENDING.get(key, (None,))[0] is event:
                    del _PENDING[key]

    return ended


def is_pending(path: str | os.PathLike) -> bool:
    """Whether ``path`` is being written in the background now."""
    with _LOCK:
        entry = _PENDING.get(_key(path))
    return entry is not None and not entry[0].is_set()


def wait_written(path: str | os.PathLike, timeout_s: float = WAIT_S) -> None:
    """Return once ``path`` is no longer being written (at once if it never was).

    Raises
    ------
    OSError
        The background write failed (its reason), or did not end in ``timeout_s``.
    """
    with _LOCK:
        entry = _PENDING.get(_key(path))
    if entry is None:
        return
    event, failure = entry
    if not event.wait(timeout_s):
        raise OSError(f"{path} is still being written after {timeout_s:.0f} s")
    if failure:
        raise OSError(f"{path} could not be written: {failure[0]}") from failure[0]
