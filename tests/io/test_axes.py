"""Stores with channels and time points, opened with ``keep_axes`` (ome-zarr-py writes them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from napari_finetune.io.omezarr import VolumeError, load_corrections, open_volume, save_corrections
from ngff_stores import omero_metadata
from ngff_validation import assert_napari_ome_zarr_reads_labels, assert_valid_ngff

SHAPE = (2, 3, 8, 32, 32)  # t, c, z, y, x


def tczyx_store(path: Path, version: str) -> Path:
    import zarr
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    fmt = FormatV04() if version == "0.4" else FormatV05()
    image = (np.random.default_rng(0).random(SHAPE) * 200).astype(np.uint8)
    root = zarr.group(store=parse_url(str(path), mode="w", fmt=fmt).store,
                      zarr_format=fmt.zarr_format)
    write_image(image, root, axes="tczyx", fmt=fmt, scale_factors=[2])
    omero = omero_metadata(["a", "b", "c"])
    if fmt.zarr_format == 2:
        root.attrs["omero"] = omero
    else:  # NGFF 0.5 keeps its metadata inside "ome"
        root.attrs["ome"] = {**root.attrs["ome"], "omero": omero}
    return path


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_channels_and_time_points_are_kept_and_labels_have_the_time_axis(tmp_path, version):
    store = tczyx_store(tmp_path / "tczyx.zarr", version)
    with pytest.raises(VolumeError, match="2 time points"):  # the widget's path: refused
        open_volume(store)
    volume = open_volume(store, keep_axes=True)
    assert volume.input.axes == "tczyx" and volume.input.shape == SHAPE
    assert volume.input.channel_names == ("a", "b", "c")
    assert volume.axes == ["t", "z", "y", "x"] and volume.shape == (2, 8, 32, 32)
    assert volume.ndim == 3 and len(volume.levels) == 2
    np.testing.assert_array_equal(np.asarray(volume.input.channel(1).at_time(1).array),
                                  np.asarray(volume.input.array[1, 1]))
    corrections = np.zeros((2, 8, 32, 32), np.uint8)
    corrections[1, 3, 4:9, 4:9] = 2
    save_corrections(store, corrections)
    np.testing.assert_array_equal(load_corrections(store), corrections)
    assert_valid_ngff(store)  # ome-zarr-models; the image's levels, shapes and transforms
    assert_napari_ome_zarr_reads_labels(store, ["corrections"])
    labels = open_volume(store / "labels" / "corrections", keep_axes=True)
    assert labels.axes == ["t", "z", "y", "x"]
