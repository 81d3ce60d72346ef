"""napari's File > Open Sample > synthetic-em, through the real plugin manifest."""

import numpy as np
import pytest

from napari_finetune.samples import sample_shape

SHAPE = (16, 64, 64)


@pytest.fixture
def small_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path))
    monkeypatch.setenv("NAPARI_FINETUNE_SAMPLE_SHAPE", ",".join(map(str, SHAPE)))
    return tmp_path


def test_open_sample_gives_target_image_and_hidden_ground_truth(make_napari_viewer, small_sample):
    viewer = make_napari_viewer()
    viewer.open_sample("napari-finetune", "synthetic-em")
    image = viewer.layers["synthetic-em (target)"]
    assert image.multiscale and tuple(image.data[0].shape) == SHAPE
    path = image.metadata["ome_zarr_path"]
    assert path.startswith(str(small_sample)) and "target" in path
    truth = viewer.layers["ground truth"]
    assert truth.visible is False
    assert set(np.unique(np.asarray(truth.data))) <= {0, 1, 2}


def test_sample_shape_from_environment(monkeypatch):
    monkeypatch.setenv("NAPARI_FINETUNE_SAMPLE_SHAPE", "8x32x48")
    assert sample_shape() == (8, 32, 48)
    monkeypatch.setenv("NAPARI_FINETUNE_SAMPLE_SHAPE", "8,32")
    with pytest.raises(ValueError, match="three sizes"):
        sample_shape()
    monkeypatch.delenv("NAPARI_FINETUNE_SAMPLE_SHAPE")
    assert sample_shape() == (64, 256, 256)
