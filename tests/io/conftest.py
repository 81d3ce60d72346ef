"""OME-Zarr stores written by ome-zarr-py itself, in NGFF 0.4 (zarr v2) and 0.5 (zarr v3)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from store_helpers import SHAPE

SCALE = {"z": 2.0, "y": 0.5, "x": 0.5}


def write_store(
    path: Path,
    version: str,
    image: np.ndarray | None = None,
    axes: str = "zyx",
    scale_factors: tuple[int, ...] = (2, 4),
    labels: dict[str, np.ndarray] | None = None,
    scale: dict[str, float] | None = None,
    chunks: tuple[int, ...] | None = None,
) -> Path:
    """An OME-Zarr image (multiscale unless ``scale_factors`` is empty) via ome-zarr-py."""
    import zarr
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image, write_labels

    fmt = FormatV04() if version == "0.4" else FormatV05()
    if image is None:
        rng = np.random.default_rng(0)
        image = (rng.random(SHAPE) * 1000).astype(np.uint16)
    store = parse_url(str(path), mode="w", fmt=fmt).store
    root = zarr.group(store=store, zarr_format=fmt.zarr_format)
    spatial = {a: (scale or SCALE).get(a, 1.0) for a in axes}
    write_image(image, root, axes=axes, fmt=fmt, scale_factors=list(scale_factors),
                scale=spatial, storage_options={"chunks": chunks} if chunks else None)
    for name, data in (labels or {}).items():
        # With the image's levels (NGFF requires them): a valid store to start from.
        write_labels(data, root, name=name, axes=axes, fmt=fmt, scaler=None,
                     scale_factors=list(scale_factors), scale=spatial)
    return path


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> sha256), to show nothing changed."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for f in files:
            full = Path(dirpath) / f
            out[str(full.relative_to(path))] = hashlib.sha256(full.read_bytes()).hexdigest()
    return out


def set_writable(path: Path, writable: bool) -> None:
    """Add or remove every write bit on all directories under ``path`` (and ``path``)."""
    bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for dirpath, _, _ in os.walk(path):
        mode = os.stat(dirpath).st_mode
        os.chmod(dirpath, (mode | stat.S_IWUSR) if writable else (mode & ~bits))


@pytest.fixture(params=["0.4", "0.5"])
def version(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store(tmp_path: Path, version: str) -> Path:
    """A 3-level 16x64x64 image with a ``labels/ground_truth``, in both NGFF versions."""
    gt = np.zeros(SHAPE, np.uint8)
    gt[:, 20:40, 20:40] = 2
    return write_store(tmp_path / f"vol{version}.zarr", version, labels={"ground_truth": gt})


@pytest.fixture
def make_store():
    """``write_store`` as a fixture (tests call it for stores of other shapes/axes)."""
    return write_store


@pytest.fixture
def hash_files():
    """``snapshot`` as a fixture."""
    return snapshot


@pytest.fixture
def read_only():
    """``read_only(path)`` strips write bits; they are restored at teardown for cleanup."""
    done: list[Path] = []

    def strip(path: Path) -> Path:
        set_writable(path, False)
        done.append(path)
        return path

    yield strip
    for path in done:
        set_writable(path, True)
