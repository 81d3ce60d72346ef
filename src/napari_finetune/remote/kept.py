"""Where a remote run cut short keeps its last weights, and the stamp that ties them to a store.

A panel run that ends before its last step writes the weights received last
beside the store it trained on (:func:`kept_path`), with :func:`kept_stamp` in
the checkpoint's metadata under :data:`KEPT_KEY`: which store, which run, when.
The next start reads the stamp to offer the file for that store only. No torch
here: the Session asks for the path on napari's main thread.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

# The metadata entry of a kept checkpoint: {"store": name, "store_path": path, "run_id",
# "written_at": ISO 8601 UTC}.
KEPT_KEY = "remote_kept"


def kept_path(store: str | os.PathLike) -> Path:
    """Where a remote run cut short keeps its last weights: beside the store whose
    corrections it trained on, ``<store>.remote-last.pt`` (``cell.zarr.remote-last.pt``)."""
    return Path(str(store).rstrip("/\\") + ".remote-last.pt")


def store_name(store: str | os.PathLike) -> str:
    """The store's folder name (``cell.zarr``), which a kept file names as its store."""
    return Path(str(store).rstrip("/\\")).name


def kept_stamp(store: str | os.PathLike, run_id: str | None,
               now: datetime | None = None) -> dict[str, str]:
    """What a kept checkpoint records of where it belongs: the store (its name, which
    survives moving the store with its kept file, and its path then), the run, the time."""
    written = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return {"store": store_name(store), "store_path": str(store), "run_id": run_id or "",
            "written_at": written.isoformat(timespec="seconds")}


__all__ = ["KEPT_KEY", "kept_path", "kept_stamp", "store_name"]
