"""Writing labels safely: bad input, read-only stores, killed or failed saves, threads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from store_helpers import SHAPE, ome_zarr_nodes, painted_corrections, staging_dirs

from napari_finetune.io.omezarr import (
    VolumeError,
    check_writable,
    create_labels_array,
    list_labels,
    load_corrections,
    save_corrections,
    write_labels,
)
from ngff_validation import assert_valid_ngff


def test_shape_mismatch_changes_nothing(store: Path, hash_files) -> None:
    save_corrections(store, painted_corrections())
    before = hash_files(store)
    with pytest.raises(VolumeError, match=r"shape \(16, 32, 32\) but the image's level 0 is "
                       r"\(16, 64, 64\) \(ZYX\)"):
        save_corrections(store, np.zeros((16, 32, 32), np.uint8))
    with pytest.raises(VolumeError, match=r"dtype float32; paint them on an integer"):
        save_corrections(store, np.zeros(SHAPE, np.float32))
    with pytest.raises(VolumeError, match=r"not a usable labels name"):
        save_corrections(store, painted_corrections(), name="../escape")
    assert hash_files(store) == before


def test_read_only_store_changes_nothing(store: Path, hash_files, read_only) -> None:
    save_corrections(store, painted_corrections(2))
    before = hash_files(store)
    read_only(store)
    # The explicit permission-bit check also holds as root, where os.access says "writable".
    with pytest.raises(VolumeError, match=r"is read-only .*copy the store somewhere writable"):
        save_corrections(store, painted_corrections(3))
    with pytest.raises(VolumeError, match=r"is read-only"):
        create_labels_array(store, "prediction", SHAPE, np.uint8)
    assert hash_files(store) == before
    np.testing.assert_array_equal(load_corrections(store), painted_corrections(2))  # still readable


def test_read_only_labels_folder_is_detected(store: Path, read_only) -> None:
    save_corrections(store, painted_corrections())
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
from napari_finetune.io import pyramid
from napari_finetune.io.omezarr import save_corrections
path, when = sys.argv[1], sys.argv[2]
if when == "while-writing":
    real = pyramid.fill_pyramid
    def write_then_die(group):
        real(group)
        os._exit(9)  # the new copy (every level) is on disk, but not marked complete
    pyramid.fill_pyramid = write_then_die
elif when == "mid-pyramid":
    real_level = pyramid.downsample_level
    def level_then_die(src, dst, *args):
        real_level(src, dst, *args)
        os._exit(9)  # level 1 written, level 2 not yet
    pyramid.downsample_level = level_then_die
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


@pytest.mark.parametrize("when", ["while-writing", "mid-pyramid", "between-renames"])
def test_killed_save_loses_nothing(store: Path, when: str) -> None:
    save_corrections(store, painted_corrections(2))
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(store), when],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert len(staging_dirs(store)) == 1  # what the killed process left behind
    new = np.zeros(SHAPE, np.uint8)
    new[5] = 3
    expected = new if when == "between-renames" else painted_corrections(2)
    if when == "between-renames":
        assert not (store / "labels" / "corrections").exists()
    np.testing.assert_array_equal(load_corrections(store), expected)  # recovers first
    assert staging_dirs(store) == []
    assert list_labels(store) == ["ground_truth", "corrections"]
    assert_valid_ngff(store)  # whichever copy survived has every level


def test_failed_write_keeps_old_labels(store: Path, monkeypatch, hash_files) -> None:
    save_corrections(store, painted_corrections(2))
    before = hash_files(store)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("napari_finetune.io.pyramid.write_level0", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_corrections(store, painted_corrections(3))
    assert hash_files(store) == before and staging_dirs(store) == []


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
    node = ome_zarr_nodes(store)["prediction-membrane"]
    np.testing.assert_array_equal(np.asarray(node.data[0])[:, 0, 0], [1] * 8 + [9] * 8)
    assert ome_zarr_nodes(store)["mask"].metadata["color"][1] == [1.0, 0.0, 0.0, 1.0]
    # Creating it again starts from zeros, listed once.
    again = create_labels_array(store, "prediction-membrane", SHAPE, np.uint8)
    assert int(np.asarray(again[:]).max()) == 0
    assert list_labels(store).count("prediction-membrane") == 1
    with pytest.raises(VolumeError, match=r"shape \(8, 64, 64\)"):
        create_labels_array(store, "bad", (8, 64, 64), np.uint8)



def test_save_while_another_thread_writes(store: Path, monkeypatch) -> None:
    """The widget autosaves corrections while predictions are being written: neither is lost.

    The prediction's write is held half way (in its staging folder) while the
    corrections are saved, whose start-up recovery must leave that folder alone.
    """
    import threading

    from napari_finetune.io import pyramid

    real, halfway, go_on = pyramid.fill_pyramid, threading.Event(), threading.Event()

    def held_write(group):
        real(group)
        if group.basename == "prediction":
            halfway.set()
            assert go_on.wait(60)

    monkeypatch.setattr(pyramid, "fill_pyramid", held_write)
    mask = np.full(SHAPE, 5, np.uint8)
    writer = threading.Thread(target=write_labels, args=(store, "prediction", mask))
    writer.start()
    try:
        assert halfway.wait(60)
        save_corrections(store, painted_corrections(2))
        assert len(staging_dirs(store)) == 1  # the prediction's, still in progress
    finally:
        go_on.set()
        writer.join(60)
    assert sorted(list_labels(store)) == ["corrections", "ground_truth", "prediction"]
    np.testing.assert_array_equal(load_corrections(store, "prediction"), mask)
    np.testing.assert_array_equal(load_corrections(store), painted_corrections(2))
    assert staging_dirs(store) == []


def test_consolidated_metadata_is_refreshed(store: Path) -> None:
    """A store with consolidated metadata lists new labels there too (zarr readers trust it)."""
    import warnings

    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(store))
    save_corrections(store, painted_corrections())
    create_labels_array(store, "prediction", SHAPE, np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = zarr.open_group(str(store), mode="r")
        assert root["labels/corrections/s0"].shape == SHAPE
        assert root["labels/prediction/s0"].shape == SHAPE
    np.testing.assert_array_equal(load_corrections(store), painted_corrections())
