"""The Session's Objects measure distances in the store's voxel size, as training does."""

from __future__ import annotations

import numpy as np
from tests.test_cli import make_scaled_store

from napari_finetune.objects import ChannelRole
from napari_finetune.session.jobs import Prediction
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Session


def _stacked_ellipsoids() -> np.ndarray:
    """A larger and a smaller ellipsoid 3 sections apart along z (as in the objects tests:
    one object in voxels, two on 40 x 8 x 8 nm voxels)."""
    z, y, x = np.mgrid[0:16, 0:32, 0:32].astype(float)
    prob = np.zeros((16, 32, 32), np.float32)
    for cz, radius in ((5, 7.0), (8, 5.5)):
        inside = ((z - cz) / 3) ** 2 + ((y - 16) / radius) ** 2 + ((x - 16) / radius) ** 2 < 1
        prob = np.maximum(prob, inside.astype(np.float32))
    return prob


def _objects(tmp_path, scale) -> int:
    store = make_scaled_store(tmp_path / "v.ome.zarr", (16, 32, 32), scale)
    role = ChannelRole("object", split=True, seed_distance=4, min_size=0)
    session = Session(InlineRunner(), channel_names=["membrane", "mito"], roles={"mito": role})
    session.store = str(store)
    prob = _stacked_ellipsoids()
    session.prediction = Prediction([(prob > 0.5).astype(np.uint8)] * 2, {1: prob})
    assert session.objects() is True
    return session.found_objects["mito"].count


def test_objects_use_the_stores_scale(tmp_path):
    # Before, the Session's Objects measured in voxels whatever the store said (its
    # config's voxel size is None unless given): 1 object where training saw 2.
    assert _objects(tmp_path, {"z": 40.0, "y": 8.0, "x": 8.0}) == 2


def test_a_store_without_scale_measures_in_voxels(tmp_path):
    assert _objects(tmp_path, None) == 1
