"""Replacing ``labels/<name>`` without ever losing the old one, and write-permission checks.

What :func:`staged_replace` guarantees (the process may be killed at any instant):

1. The caller validated everything (shape, dtype, permission) before this runs;
   the raw image is never opened for writing.
2. The new labels image is written completely into a staging folder inside the
   store (``.napari-finetune-staging-<pid>-<id>``), then a ``COMPLETE`` marker.
3. Only then is the old ``labels/<name>`` moved into the staging folder and the
   new one moved into its place: two directory renames on the same file system.
4. The old copy is deleted last.

So at every instant either ``labels/<name>`` is a complete image (old or new),
or, between the two renames of step 3, both complete copies are in the staging
folder; the next write or load (:func:`recover`) moves the new one, or failing
that the old one, into place. A write that fails with an exception puts the
old one back itself. Not covered: power loss before the OS flushed its caches
(nothing is fsynced), and two *processes* replacing the same name at once
(threads of one process are serialised by a lock).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import threading
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from napari_finetune.io.ngff import ngff_format
from napari_finetune.io.volume import VolumeError
from napari_finetune.processes import process_alive

if TYPE_CHECKING:  # zarr is imported where a store is opened
    import zarr

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".napari-finetune-staging-"
# One swap (and labels-list update) at a time per process; the slow writing
# into a staging folder happens outside it.
_LOCK = threading.RLock()
_IN_FLIGHT: set[Path] = set()


def _dir_writable(d: Path) -> bool:
    # A directory with no write bit for anyone was made read-only on purpose:
    # honour that even as root, for whom os.access always says "writable".
    if not d.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return False
    return os.access(d, os.W_OK | os.X_OK)


def check_writable(store: Path, name: str | None = None) -> None:
    """Raise :class:`VolumeError` unless the directories a labels write touches are writable."""
    dirs = [store, store / "labels"] + ([store / "labels" / name] if name else [])
    for d in dirs:
        if d.is_dir() and not _dir_writable(d):
            raise VolumeError(
                f"{store} is read-only ({d} is not writable), so labels cannot be saved "
                "into it; copy the store somewhere writable (or make it writable) and save again."
            )


def labels_group(store: Path) -> zarr.Group:
    """The store's ``labels`` zarr group, created if missing (in the store's zarr format)."""
    import zarr
    from zarr.storage import LocalStore

    # Consolidated metadata (if any) is a snapshot: read the real hierarchy instead.
    root = zarr.open_group(store=LocalStore(store), mode="r+", use_consolidated=False)
    return root.require_group("labels")


def list_name(group: zarr.Group, name: str) -> None:
    """Make ``name`` appear exactly once in the labels group's NGFF ``labels`` list.

    The group's NGFF ``version`` is written with it.
    """
    from ome_zarr.writer import add_metadata, get_metadata

    fmt = ngff_format(group.metadata.zarr_format)
    with _LOCK:  # read-modify-write of one attribute
        names = [n for n in get_metadata(group).get("labels", []) if n != name] + [name]
        # ome-zarr-models requires the version on a 0.5 labels group (inside "ome"); 0.4
        # readers ignore it there, and it names the group's version for them too.
        add_metadata(group, {"version": fmt.version, "labels": names}, fmt=fmt)


def refresh_consolidated(store: Path) -> None:
    """Re-consolidate a store that has consolidated metadata, so readers that trust it
    (``zarr.open_group(store)["labels/<name>"]``) see the labels just written."""
    import zarr
    from zarr.storage import LocalStore

    if (store / ".zmetadata").is_file():
        consolidated = True
    else:
        try:
            root_meta = json.loads((store / "zarr.json").read_text())
        except (OSError, ValueError) as exc:
            logger.debug("%s: no readable zarr.json, nothing to consolidate (%s)", store, exc)
            return
        consolidated = root_meta.get("consolidated_metadata") is not None
    if consolidated:
        with _LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr's "not part of the v3 spec" notice
            zarr.consolidate_metadata(LocalStore(store))


def recover(store: Path) -> None:
    """Finish or undo a labels swap that a killed process left half done (see module doc)."""
    with _LOCK:
        for staging in store.glob(STAGING_PREFIX + "*"):
            try:
                pid = int(staging.name[len(STAGING_PREFIX):].split("-")[0])
            except ValueError:
                continue
            if staging in _IN_FLIGHT or (pid != os.getpid() and process_alive(pid)):
                continue  # being written right now
            marker = staging / "COMPLETE"
            if marker.is_file():
                name = marker.read_text().strip()
                target = store / "labels" / name
                new, old = staging / "labels" / name, staging / "old"
                if not target.exists() and (new.is_dir() or old.is_dir()):
                    os.rename(new if new.is_dir() else old, target)
                    list_name(labels_group(store), name)
                    refresh_consolidated(store)
            shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def staged_replace(store: Path, name: str) -> Iterator[Path]:
    """Yield a staging folder; what the body writes to ``<it>/labels/<name>`` replaces
    ``<store>/labels/<name>`` when the body returns, with the guarantees of the module doc.
    """
    staging = store / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    target = store / "labels" / name
    with _LOCK:
        _IN_FLIGHT.add(staging)
    try:
        yield staging
        if not (staging / "labels" / name).is_dir():
            raise RuntimeError(f"nothing was written to {staging / 'labels' / name}")
        (staging / "COMPLETE").write_text(name)
        with _LOCK:
            group = labels_group(store)
            if target.exists():
                os.rename(target, staging / "old")
            os.rename(staging / "labels" / name, target)
            list_name(group, name)
            refresh_consolidated(store)
    except BaseException:
        if not target.exists() and (staging / "old").is_dir():
            os.rename(staging / "old", target)  # put the old labels back
        raise
    finally:
        # Never delete the only copy: the old one, if it could not be put back.
        if target.is_dir() or not (staging / "old").is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        with _LOCK:
            _IN_FLIGHT.discard(staging)
