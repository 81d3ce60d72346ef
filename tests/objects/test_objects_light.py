"""The objects package runs with numpy, scipy and scikit-image alone: no torch, napari,
Qt, zarr or dask (a headless worker labelling blocks of a prediction)."""

from __future__ import annotations

from import_blocker import run_without

BLOCKED = [
    "torch", "napari", "npe2", "vispy", "qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6",
    "magicgui", "superqt", "psygnal", "zarr", "ome_zarr", "dask", "distributed", "bioimageio",
]

BODY = """
import numpy as np

from napari_finetune.objects import (
    ChannelRole, boundary_instances, object_instances, roles_from_metadata,
)
from napari_finetune.objects.scores import object_scores, region_scores

prob = np.zeros((8, 32, 32), np.float32)
prob[:, 16, :] = 1.0
cells = boundary_instances(prob, ChannelRole("boundary", seed_distance=2))
assert cells.max() == 2, cells.max()
blobs = object_instances(1.0 - prob, ChannelRole("object"))
assert object_scores(blobs, cells)["f1"] == 1.0
assert region_scores(cells, cells)["adapted_rand_error"] == 0.0
assert roles_from_metadata({}, ["membrane", "mitochondria"])["membrane"].role == "boundary"
"""


def test_objects_need_only_numpy_scipy_and_scikit_image():
    run_without(BLOCKED, BODY, timeout=120)
