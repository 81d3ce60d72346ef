"""What a folder is on disk: which zarr node, which zarr format, which NGFF version.

The NGFF version is chosen here only, through ``ome_zarr.format``: a store on
zarr v3 speaks NGFF 0.5, one on zarr v2 speaks 0.4 (the newest version
ome-zarr-py writes on each format). Reading a store, writing its labels and
its ``labels`` group all ask :func:`ngff_format`, so they cannot disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # ome-zarr-py is imported when a format is asked for
    from ome_zarr.format import Format

ZarrKind = Literal["group", "array"]


def zarr_kind(path: Path) -> ZarrKind | None:
    """``"group"``, ``"array"`` or None (not zarr) by the metadata files of v2 and v3."""
    if (path / "zarr.json").is_file():
        try:
            node_type = json.loads((path / "zarr.json").read_text()).get("node_type")
        except (OSError, ValueError):
            return None
        return "array" if node_type == "array" else "group"
    if (path / ".zgroup").is_file():
        return "group"
    if (path / ".zarray").is_file():
        return "array"
    return None


def zarr_format_of(path: Path) -> int:
    """3 when ``path`` has v3 metadata (``zarr.json``), else 2."""
    return 3 if (path / "zarr.json").is_file() else 2


def ngff_format(zarr_format: int) -> Format:
    """ome-zarr-py's format object for the newest NGFF version on ``zarr_format``.

    0.5 on zarr v3, 0.4 on zarr v2 (``ome_zarr.format.format_implementations``
    lists the versions newest first, each with its zarr format).
    """
    from ome_zarr.format import format_implementations

    for fmt in format_implementations():
        if fmt.zarr_format == zarr_format:
            return fmt
    raise ValueError(f"no OME-NGFF version is written on zarr format {zarr_format}; use 2 or 3.")
