"""open_volume and corrections against stores written by ome-zarr-py (NGFF 0.4 and 0.5)."""

from __future__ import annotations

import os
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from store_helpers import SHAPE, ome_zarr_nodes, painted_corrections, staging_dirs

from napari_finetune import palette
from napari_finetune.io.omezarr import (
    VolumeError,
    create_labels_array,
    list_labels,
    load_corrections,
    open_volume,
    require_ndim,
    save_corrections,
)

# -- open_volume ----------------------------------------------------------------------------


def test_open_volume_multiscale(store: Path, version: str) -> None:
    volume = open_volume(store, ndim=3)
    assert volume.axes == ["z", "y", "x"]
    assert [lv.shape for lv in volume.levels] == [(16, 64, 64), (16, 32, 32), (16, 16, 16)]
    assert all(isinstance(lv, da.Array) for lv in volume.levels)  # lazy
    assert volume.scale == [[2.0, 0.5, 0.5], [2.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    assert volume.ngff_version == version
    assert volume.zarr_format == (2 if version == "0.4" else 3)
    assert volume.label_names == ["ground_truth"]
    assert volume.ndim == 3 and volume.shape == SHAPE and volume.data is volume.levels[0]
    expected = (np.random.default_rng(0).random(SHAPE) * 1000).astype(np.uint16)
    np.testing.assert_array_equal(np.asarray(volume.data), expected)


def test_open_volume_squeezes_singleton_t_and_c(tmp_path: Path, version: str, make_store) -> None:
    image = np.arange(np.prod(SHAPE), dtype=np.uint16).reshape((1, 1, *SHAPE))
    path = make_store(tmp_path / "tczyx.zarr", version, image=image, axes="tczyx")
    volume = open_volume(path, ndim=3)
    assert volume.axes == ["z", "y", "x"]
    assert volume.full_axes == ["t", "c", "z", "y", "x"]
    assert [lv.shape for lv in volume.levels] == [(16, 64, 64), (16, 32, 32), (16, 16, 16)]
    np.testing.assert_array_equal(np.asarray(volume.data), image[0, 0])
    # Labels of such an image are ZYX like the volume the user paints on.
    save_corrections(path, painted_corrections())
    np.testing.assert_array_equal(load_corrections(path), painted_corrections())


def test_multichannel_is_an_error(tmp_path: Path, version: str, make_store) -> None:
    image = np.zeros((2, *SHAPE), np.uint8)
    path = make_store(tmp_path / "czyx.zarr", version, image=image, axes="czyx")
    with pytest.raises(VolumeError, match=r"has 2 channels .*CZYX.*own OME-Zarr image"):
        open_volume(path)


def test_2d_where_3d_required(tmp_path: Path, version: str, make_store) -> None:
    path = make_store(tmp_path / "yx.zarr", version, image=np.zeros((64, 64), np.uint8),
                      axes="yx")
    volume = open_volume(path)  # 2D on its own is fine
    assert volume.axes == ["y", "x"] and volume.ndim == 2
    message = r"is 2D \(YX\) but a 3D \(ZYX\) volume is required; open a volume with a z axis"
    with pytest.raises(VolumeError, match=message):
        open_volume(path, ndim=3)
    with pytest.raises(VolumeError, match=message):
        require_ndim(volume, 3)
    assert require_ndim(open_volume(tmp_path / "yx.zarr"), 2).ndim == 2


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(VolumeError, match=r"does not exist; check the path"):
        open_volume(tmp_path / "nope.zarr")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_plain_zarr_is_an_error(tmp_path: Path, zarr_format: int, hash_files) -> None:
    group = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w", zarr_format=zarr_format)
    group.create_array("0", shape=SHAPE, dtype="uint8")
    zarr.create_array(str(tmp_path / "array.zarr"), shape=SHAPE, dtype="uint8",
                      zarr_format=zarr_format)
    before = hash_files(tmp_path)
    with pytest.raises(VolumeError, match=r"zarr group without OME-NGFF 'multiscales'"):
        open_volume(tmp_path / "plain.zarr")
    with pytest.raises(VolumeError, match=r"zarr array without OME-NGFF 'multiscales'"):
        open_volume(tmp_path / "array.zarr")
    with pytest.raises(VolumeError, match=r"plain zarr"):
        save_corrections(tmp_path / "plain.zarr", np.zeros(SHAPE, np.uint8))
    assert hash_files(tmp_path) == before


def test_not_zarr_at_all(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("hello")
    (tmp_path / "image.tif").write_bytes(b"II*\x00")
    for p in (tmp_path / "folder", tmp_path / "image.tif"):
        with pytest.raises(VolumeError, match=r"is not a zarr store .*open an OME-Zarr"):
            open_volume(p)


# -- corrections ----------------------------------------------------------------------------


def test_corrections_round_trip(store: Path, version: str, hash_files) -> None:
    image_files = {k: v for k, v in hash_files(store).items() if not k.startswith("labels")}
    written = save_corrections(store, painted_corrections(), channel_names=["membrane", "mito"])
    assert written == store / "labels" / "corrections"
    back = load_corrections(store)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, painted_corrections())
    assert list_labels(store) == ["ground_truth", "corrections"]
    # Same zarr format / NGFF version as the image.
    meta_file = ".zattrs" if version == "0.4" else "zarr.json"
    assert (written / meta_file).is_file() and (written / "s0" / meta_file).is_file()
    # ome-zarr-py reads it as an NGFF labels image, with our colours and classes.
    node = ome_zarr_nodes(store)["corrections"]
    np.testing.assert_array_equal(np.asarray(node.data[0]), painted_corrections())
    # The palette's colours, as napari's corrections layer shows them.
    for value, color in ((1, palette.BACKGROUND), (2, palette.CHANNELS[0])):
        assert node.metadata["color"][value] == pytest.approx(
            [c / 255 for c in palette.rgba(color)])
    assert node.metadata["properties"][2] == {"class": "membrane"}
    assert node.metadata["properties"][3] == {"class": "mito"}
    attrs = dict(zarr.open_group(str(written), mode="r").attrs)
    attrs = attrs.get("ome", attrs)
    assert attrs["image-label"]["version"] == version
    assert attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"][0]["scale"] == [
        2.0, 0.5, 0.5]
    # The raw image was not touched, and no staging folder is left.
    after = {k: v for k, v in hash_files(store).items() if not k.startswith("labels")}
    assert after == image_files
    assert staging_dirs(store) == []


def test_overwrite_replaces_once(store: Path) -> None:
    save_corrections(store, painted_corrections(2))
    save_corrections(store, painted_corrections(3))
    np.testing.assert_array_equal(load_corrections(store), painted_corrections(3))
    assert list_labels(store) == ["ground_truth", "corrections"]
    assert staging_dirs(store) == []
    assert [n for n in ome_zarr_nodes(store) if n == "corrections"] == ["corrections"]


def test_single_level_store(tmp_path: Path, version: str, make_store) -> None:
    path = make_store(tmp_path / "one.zarr", version, scale_factors=())
    volume = open_volume(path)
    assert len(volume.levels) == 1 and volume.shape == SHAPE
    save_corrections(path, painted_corrections())
    np.testing.assert_array_equal(load_corrections(path), painted_corrections())


def test_labels_image_itself_opens_as_volume(store: Path) -> None:
    labels = open_volume(store / "labels" / "ground_truth")
    assert labels.shape == SHAPE and int(np.asarray(labels.data).max()) == 2
    assert os.fspath(labels.path).endswith("ground_truth")


def test_scale_and_translation_compose(store: Path, version: str) -> None:
    """Dataset transforms, then the multiscales-level one (NGFF order)."""
    group = zarr.open_group(str(store), mode="r+")
    attrs = dict(group.attrs)
    meta = attrs["ome"] if version == "0.5" else attrs
    multiscale = meta["multiscales"][0]
    multiscale["datasets"][0]["coordinateTransformations"] = [
        {"type": "scale", "scale": [2.0, 0.5, 0.5]},
        {"type": "translation", "translation": [10.0, 1.0, 0.0]}]
    multiscale["coordinateTransformations"] = [{"type": "scale", "scale": [1.0, 3.0, 3.0]}]
    group.attrs.update(attrs)
    volume = open_volume(store)
    assert volume.scale[0] == [2.0, 1.5, 1.5]
    assert volume.translation[0] == [10.0, 3.0, 0.0]
    assert volume.scale[1] == [2.0, 3.0, 3.0]
    # Labels written now overlay the image: same level-0 scale and translation.
    save_corrections(store, painted_corrections())
    create_labels_array(store, "prediction", SHAPE, np.uint8)
    for name in ("corrections", "prediction"):
        labels = open_volume(store / "labels" / name)
        assert (labels.scale[0], labels.translation[0]) == (volume.scale[0], volume.translation[0])
    np.testing.assert_array_equal(load_corrections(store), painted_corrections())


def test_bioformats2raw_layout_opens_series_0(tmp_path: Path, version: str, make_store) -> None:
    root = tmp_path / "converted.zarr"
    make_store(root / "0", version)
    group = zarr.open_group(str(root), mode="a", zarr_format=2 if version == "0.4" else 3)
    if version == "0.4":
        group.attrs["bioformats2raw.layout"] = 3
    else:
        group.attrs["ome"] = {"version": "0.5", "bioformats2raw.layout": 3}
    volume = open_volume(root, ndim=3)
    assert volume.path == (root / "0").resolve() and volume.shape == SHAPE
    save_corrections(root, painted_corrections())  # into the image's own labels group
    assert (root / "0" / "labels" / "corrections").is_dir()
    np.testing.assert_array_equal(load_corrections(root / "0"), painted_corrections())


def test_plate_is_an_error(tmp_path: Path) -> None:
    group = zarr.open_group(str(tmp_path / "plate.zarr"), mode="w", zarr_format=2)
    group.attrs["plate"] = {"version": "0.4", "rows": [{"name": "A"}], "columns": [{"name": "1"}],
                            "wells": [{"path": "A/1", "rowIndex": 0, "columnIndex": 0}]}
    with pytest.raises(VolumeError, match=r"is an HCS plate, not one image; open one field"):
        open_volume(tmp_path / "plate.zarr")


@pytest.mark.parametrize(
    ("scale", "units", "expected"),
    [
        ({"z": 40.0, "y": 8.0, "x": 8.0}, "nanometer", (40.0, 8.0, 8.0)),
        ({"z": 1.0, "y": 0.2, "x": 0.2}, None, (1.0, 0.2, 0.2)),  # a scale without units
        ({"z": 1.0, "y": 1.0, "x": 1.0}, "micrometer", (1.0, 1.0, 1.0)),  # 1 um, said so
        (None, None, None),  # what a writer given nothing stores: unknown
    ],
)
def test_the_voxel_size_comes_from_the_ngff_scale(tmp_path, scale, units, expected):
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    path = tmp_path / "v.zarr"
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(np.zeros((4, 8, 8), np.uint8), group, axes="zyx", scale_factors=[],
                scale=scale, axes_units={a: units for a in "zyx"} if units else None)
    assert open_volume(path).voxel_size == expected


def test_axes_in_different_units_are_converted_to_nanometers(tmp_path):
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    path = tmp_path / "v.zarr"
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(np.zeros((4, 8, 8), np.uint8), group, axes="zyx", scale_factors=[],
                scale={"z": 0.04, "y": 8.0, "x": 8.0},
                axes_units={"z": "micrometer", "y": "nanometer", "x": "nanometer"})
    assert open_volume(path).voxel_size == pytest.approx((40.0, 8.0, 8.0))
