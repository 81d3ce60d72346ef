"""Every store the project writes is valid NGFF for ome-zarr-models and read by napari-ome-zarr.

NGFF 0.4 (zarr v2) and 0.5 (zarr v3), single-scale and multiscale images.
Before labels carried the image's pyramid, ome-zarr-models rejected every
0.5 multiscale store after a save ("Number of image label multiscale levels
(1) doesn't match number of image multiscale levels (3)"); its 0.4 model does
not check levels, which ``assert_valid_ngff`` does for both versions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from store_helpers import SHAPE, painted_corrections

from napari_finetune.io.omezarr import (
    create_labels_array,
    load_corrections,
    open_volume,
    save_corrections,
    write_labels,
)
from napari_finetune.io.pyramid import fill_pyramid
from ngff_validation import (
    assert_napari_ome_zarr_reads_labels,
    assert_valid_ngff,
    validate_with_ome_zarr_models,
)


@pytest.fixture(params=[(), (2, 4)], ids=["single-scale", "multiscale"])
def image_store(request: pytest.FixtureRequest, tmp_path: Path, make_store,
                version: str) -> Path:
    """An image without labels, written by ome-zarr-py: whatever labels appear are ours."""
    path = make_store(tmp_path / f"img{version}.zarr", version,
                      scale_factors=request.param)
    validate_with_ome_zarr_models(path)  # valid before we touch it
    return path


def test_save_corrections_keeps_the_store_valid(image_store: Path) -> None:
    save_corrections(image_store, painted_corrections(), channel_names=["membrane"])
    assert_valid_ngff(image_store)
    assert_napari_ome_zarr_reads_labels(image_store, ["corrections"])
    save_corrections(image_store, painted_corrections(3))  # over the multi-level one
    assert_valid_ngff(image_store)
    np.testing.assert_array_equal(load_corrections(image_store), painted_corrections(3))
    levels = open_volume(image_store / "labels" / "corrections").levels
    assert len(levels) == len(open_volume(image_store).levels)
    assert int(np.asarray(levels[-1]).max()) == 3  # the smaller levels were updated too


def test_write_labels_and_create_labels_array_keep_the_store_valid(image_store: Path) -> None:
    write_labels(image_store, "mask", np.ones(SHAPE, bool))
    array = create_labels_array(image_store, "prediction", SHAPE, np.uint8, (8, 32, 32))
    array[:8] = 1
    fill_pyramid(zarr.open_group(str(image_store / "labels" / "prediction"), mode="r+"))
    assert_valid_ngff(image_store)
    assert_napari_ome_zarr_reads_labels(image_store, ["mask", "prediction"])


def test_labels_of_another_writer_are_left_as_they_are(store: Path, version: str) -> None:
    """ome-zarr-py writes no version on the labels group; our first save adds it."""
    save_corrections(store, painted_corrections())
    assert_valid_ngff(store)  # ground_truth (ome-zarr-py's, with the image's levels) too
    assert_napari_ome_zarr_reads_labels(store, ["ground_truth", "corrections"])


def test_image_with_a_singleton_channel_axis(tmp_path: Path, make_store, version: str) -> None:
    """Labels keep the spatial axes only (NGFF allows it); both readers accept that."""
    path = make_store(tmp_path / "czyx.zarr", version, image=np.zeros((1, *SHAPE), np.uint8),
                      axes="czyx")
    save_corrections(path, painted_corrections())
    assert_valid_ngff(path)
    assert_napari_ome_zarr_reads_labels(path, ["corrections"])
