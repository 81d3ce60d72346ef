"""open_volume, corrections and labels against stores written by ome-zarr-py (NGFF 0.4 and 0.5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader

from napari_finetune.io.omezarr import (
    VolumeError,
    check_writable,
    create_labels_array,
    list_labels,
    load_corrections,
    open_volume,
    require_ndim,
    save_corrections,
    write_labels,
)

SHAPE = (16, 64, 64)  # as the stores of conftest.py


def _corrections(value: int = 2) -> np.ndarray:
    c = np.zeros(SHAPE, np.int64)  # napari's default Labels dtype is wide; stored as uint8
    c[3, 10:20, 10:20] = value
    c[4, :5, :5] = 1
    return c


def _nodes(path: Path) -> dict[str, object]:
    """ome-zarr-py's own reading of the store: node name -> node."""
    nodes = list(Reader(parse_url(str(path)))())
    return {Path(n.zarr.path).name: n for n in nodes}


def _staging_dirs(path: Path) -> list[Path]:
    return list(path.glob(".napari-finetune-staging-*"))


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
    save_corrections(path, _corrections())
    np.testing.assert_array_equal(load_corrections(path), _corrections())


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
    written = save_corrections(store, _corrections(), channel_names=["membrane", "mito"])
    assert written == store / "labels" / "corrections"
    back = load_corrections(store)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, _corrections())
    assert list_labels(store) == ["ground_truth", "corrections"]
    # Same zarr format / NGFF version as the image.
    meta_file = ".zattrs" if version == "0.4" else "zarr.json"
    assert (written / meta_file).is_file() and (written / "s0" / meta_file).is_file()
    # ome-zarr-py reads it as an NGFF labels image, with our colours and classes.
    node = _nodes(store)["corrections"]
    np.testing.assert_array_equal(np.asarray(node.data[0]), _corrections())
    assert node.metadata["color"][1] == pytest.approx([128 / 255] * 3 + [1.0])
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
    assert _staging_dirs(store) == []


def test_overwrite_replaces_once(store: Path) -> None:
    save_corrections(store, _corrections(2))
    save_corrections(store, _corrections(3))
    np.testing.assert_array_equal(load_corrections(store), _corrections(3))
    assert list_labels(store) == ["ground_truth", "corrections"]
    assert _staging_dirs(store) == []
    assert [n for n in _nodes(store) if n == "corrections"] == ["corrections"]


def test_shape_mismatch_changes_nothing(store: Path, hash_files) -> None:
    save_corrections(store, _corrections())
    before = hash_files(store)
    with pytest.raises(VolumeError, match=r"shape \(16, 32, 32\) but the image's level 0 is "
                       r"\(16, 64, 64\) \(ZYX\)"):
        save_corrections(store, np.zeros((16, 32, 32), np.uint8))
    with pytest.raises(VolumeError, match=r"dtype float32; paint them on an integer"):
        save_corrections(store, np.zeros(SHAPE, np.float32))
    with pytest.raises(VolumeError, match=r"not a usable labels name"):
        save_corrections(store, _corrections(), name="../escape")
    assert hash_files(store) == before


def test_read_only_store_changes_nothing(store: Path, hash_files, read_only) -> None:
    save_corrections(store, _corrections(2))
    before = hash_files(store)
    read_only(store)
    # The explicit permission-bit check also holds as root, where os.access says "writable".
    with pytest.raises(VolumeError, match=r"is read-only .*copy the store somewhere writable"):
        save_corrections(store, _corrections(3))
    with pytest.raises(VolumeError, match=r"is read-only"):
        create_labels_array(store, "prediction", SHAPE, np.uint8)
    assert hash_files(store) == before
    np.testing.assert_array_equal(load_corrections(store), _corrections(2))  # still readable


def test_read_only_labels_folder_is_detected(store: Path, read_only) -> None:
    save_corrections(store, _corrections())
    read_only(store / "labels" / "corrections")
    check_writable(store)  # the store itself is fine
    with pytest.raises(VolumeError, match=r"labels/corrections is not writable"):
        check_writable(store, "corrections")


def test_load_missing_corrections(store: Path) -> None:
    with pytest.raises(VolumeError, match=r"has no labels/corrections \(labels found: "
                       r"ground_truth\)"):
        load_corrections(store)
    np.testing.assert_array_equal(load_corrections(store, "ground_truth")[:, 30, 30], 2)


# A process killed at the two dangerous moments of a save (really killed: os._exit).
_KILLED_SAVE = """
import os, sys
import numpy as np
import ome_zarr.writer
from napari_finetune.io.omezarr import save_corrections
path, when = sys.argv[1], sys.argv[2]
if when == "while-writing":
    real = ome_zarr.writer.write_labels
    def write_then_die(data, group, **kwargs):
        real(data, group, **kwargs)
        os._exit(9)  # the new copy is on disk, but not marked complete
    ome_zarr.writer.write_labels = write_then_die
else:
    real_rename, calls = os.rename, []
    def rename(src, dst):
        calls.append(src)
        if len(calls) == 2:
            os._exit(9)  # old copy moved aside, new one not yet in place
        real_rename(src, dst)
    os.rename = rename
new = np.zeros((16, 64, 64), np.uint8)
new[5] = 3
save_corrections(path, new)
"""


@pytest.mark.parametrize("when", ["while-writing", "between-renames"])
def test_killed_save_loses_nothing(store: Path, when: str) -> None:
    save_corrections(store, _corrections(2))
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(store), when],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert len(_staging_dirs(store)) == 1  # what the killed process left behind
    new = np.zeros(SHAPE, np.uint8)
    new[5] = 3
    expected = _corrections(2) if when == "while-writing" else new
    if when == "between-renames":
        assert not (store / "labels" / "corrections").exists()
    np.testing.assert_array_equal(load_corrections(store), expected)  # recovers first
    assert _staging_dirs(store) == []
    assert list_labels(store) == ["ground_truth", "corrections"]


def test_failed_write_keeps_old_labels(store: Path, monkeypatch, hash_files) -> None:
    save_corrections(store, _corrections(2))
    before = hash_files(store)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ome_zarr.writer.write_labels", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_corrections(store, _corrections(3))
    assert hash_files(store) == before and _staging_dirs(store) == []


# -- labels for predictions -----------------------------------------------------------------


def test_write_labels_and_create_labels_array(store: Path, version: str) -> None:
    mask = np.zeros(SHAPE, bool)
    mask[:, :8] = True
    write_labels(store, "mask", mask, colors=[{"label-value": 1, "rgba": [255, 0, 0, 255]}])
    np.testing.assert_array_equal(load_corrections(store, "mask"), mask.astype(np.uint8))

    array = create_labels_array(store, "prediction-membrane", SHAPE, np.uint8, (8, 32, 32))
    assert array.chunks == (8, 32, 32) and array.metadata.zarr_format == (
        2 if version == "0.4" else 3)
    for z in range(0, 16, 8):  # block by block, as predict_volume does
        array[z:z + 8] = z + 1
    assert list_labels(store) == ["ground_truth", "mask", "prediction-membrane"]
    node = _nodes(store)["prediction-membrane"]
    np.testing.assert_array_equal(np.asarray(node.data[0])[:, 0, 0], [1] * 8 + [9] * 8)
    assert _nodes(store)["mask"].metadata["color"][1] == [1.0, 0.0, 0.0, 1.0]
    # Creating it again starts from zeros, listed once.
    again = create_labels_array(store, "prediction-membrane", SHAPE, np.uint8)
    assert int(np.asarray(again[:]).max()) == 0
    assert list_labels(store).count("prediction-membrane") == 1
    with pytest.raises(VolumeError, match=r"shape \(8, 64, 64\)"):
        create_labels_array(store, "bad", (8, 64, 64), np.uint8)


def test_single_level_store(tmp_path: Path, version: str, make_store) -> None:
    path = make_store(tmp_path / "one.zarr", version, scale_factors=())
    volume = open_volume(path)
    assert len(volume.levels) == 1 and volume.shape == SHAPE
    save_corrections(path, _corrections())
    np.testing.assert_array_equal(load_corrections(path), _corrections())


def test_labels_image_itself_opens_as_volume(store: Path) -> None:
    labels = open_volume(store / "labels" / "ground_truth")
    assert labels.shape == SHAPE and int(np.asarray(labels.data).max()) == 2
    assert os.fspath(labels.path).endswith("ground_truth")


def test_save_while_another_thread_writes(store: Path, monkeypatch) -> None:
    """The widget autosaves corrections while predictions are being written: neither is lost.

    The prediction's write is held half way (in its staging folder) while the
    corrections are saved, whose start-up recovery must leave that folder alone.
    """
    import threading

    import ome_zarr.writer

    real, halfway, go_on = ome_zarr.writer.write_labels, threading.Event(), threading.Event()

    def held_write(data, group, **kwargs):
        real(data, group, **kwargs)
        if kwargs["name"] == "prediction":
            halfway.set()
            assert go_on.wait(60)

    monkeypatch.setattr(ome_zarr.writer, "write_labels", held_write)
    mask = np.full(SHAPE, 5, np.uint8)
    writer = threading.Thread(target=write_labels, args=(store, "prediction", mask))
    writer.start()
    try:
        assert halfway.wait(60)
        save_corrections(store, _corrections(2))
        assert len(_staging_dirs(store)) == 1  # the prediction's, still in progress
    finally:
        go_on.set()
        writer.join(60)
    assert sorted(list_labels(store)) == ["corrections", "ground_truth", "prediction"]
    np.testing.assert_array_equal(load_corrections(store, "prediction"), mask)
    np.testing.assert_array_equal(load_corrections(store), _corrections(2))
    assert _staging_dirs(store) == []


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
    save_corrections(store, _corrections())
    create_labels_array(store, "prediction", SHAPE, np.uint8)
    for name in ("corrections", "prediction"):
        labels = open_volume(store / "labels" / name)
        assert (labels.scale[0], labels.translation[0]) == (volume.scale[0], volume.translation[0])
    np.testing.assert_array_equal(load_corrections(store), _corrections())
