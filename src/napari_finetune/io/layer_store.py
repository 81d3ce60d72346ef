"""Which OME-Zarr store a napari layer shows, whichever reader opened it.

Our reader records the store in ``layer.metadata["ome_zarr_path"]``. Other
readers (napari-ome-zarr) do not, but napari keeps the path it was asked to
open in ``layer.source.path``: the store root, or a node inside it (an array
such as ``store.zarr/s0``, a labels image ``store.zarr/labels/cells``, or
series ``0`` of a bioformats2raw store). From that path we walk up to the
image group that owns it, reading only the zarr metadata files (no Qt, no
array data), so autosave and "Save predictions" work for those layers too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from napari_finetune.io.ngff import zarr_kind


def _ngff_attrs(path: Path) -> dict[str, Any]:
    """A zarr group's NGFF attributes: inside ``ome`` (0.5) or at the top (0.4); {} if none."""
    try:
        if (path / "zarr.json").is_file():
            attrs = json.loads((path / "zarr.json").read_text()).get("attributes") or {}
            return attrs.get("ome", attrs)
        if (path / ".zattrs").is_file():
            return json.loads((path / ".zattrs").read_text())
    except (OSError, ValueError, AttributeError):
        pass  # unreadable or not JSON: not a store we can save into
    return {}


def _local_path(source: str | os.PathLike) -> Path | None:
    text = os.fspath(source)
    scheme = urlparse(text).scheme
    if scheme == "file":
        return Path(urlparse(text).path)
    if scheme and len(scheme) > 1:  # http(s), s3, ...: nothing local to save into
        return None  # (a one-letter "scheme" is a Windows drive, a local path)
    return Path(text)


def store_from_source(source: str | os.PathLike | None) -> Path | None:
    """The image group (or bioformats2raw root) that ``source`` is, or lies inside; else None.

    Walks up from ``source`` through zarr nodes: a group with NGFF
    ``multiscales`` that is not itself a labels image is the image; a
    ``bioformats2raw.layout`` root is returned as it is (opening it picks
    series 0). A plate, a plain zarr, or a path outside any zarr gives None.
    """
    if not source:
        return None
    path = _local_path(source)
    if path is None:
        return None
    for candidate in (path, *path.parents):
        kind = zarr_kind(candidate)
        if kind is None:
            return None  # left the store without finding its image
        if kind == "array":
            continue
        attrs = _ngff_attrs(candidate)
        if "multiscales" in attrs and "image-label" not in attrs:
            return candidate
        if "bioformats2raw.layout" in attrs:
            return candidate
        if "plate" in attrs or "well" in attrs:
            return None  # one field of a plate is an image; the plate itself is not
    return None


def store_of_layer(
    metadata: Mapping[str, Any] | None, source_path: str | os.PathLike | None
) -> Path | None:
    """The OME-Zarr store a layer belongs to, or None.

    Parameters
    ----------
    metadata : mapping, optional
        ``layer.metadata``; our reader's ``"ome_zarr_path"`` wins when present.
    source_path : str or PathLike, optional
        ``layer.source.path``: where napari opened the layer from.
    """
    recorded = (metadata or {}).get("ome_zarr_path")
    if recorded:
        return Path(recorded)
    return store_from_source(source_path)
