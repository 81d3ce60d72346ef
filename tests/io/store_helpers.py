"""Plain helpers shared by the IO tests (imported as ``from store_helpers import ...``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader

SHAPE = (16, 64, 64)  # the stores of conftest.py


def painted_corrections(value: int = 2) -> np.ndarray:
    """Corrections of SHAPE: a square of ``value`` and a background patch.

    int64 because napari's default Labels dtype is wide; they are stored as uint8.
    """
    c = np.zeros(SHAPE, np.int64)
    c[3, 10:20, 10:20] = value
    c[4, :5, :5] = 1
    return c


def ome_zarr_nodes(path: Path) -> dict[str, object]:
    """ome-zarr-py's own reading of the store: node name -> node."""
    return {Path(n.zarr.path).name: n for n in Reader(parse_url(str(path)))()}


def staging_dirs(path: Path) -> list[Path]:
    """Staging folders a labels write leaves while it runs (none once it is done)."""
    return list(path.glob(".napari-finetune-staging-*"))
