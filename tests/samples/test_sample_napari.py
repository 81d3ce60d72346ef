"""napari's File > Open Sample > synthetic-em, through the real plugin manifest."""

from pathlib import Path

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
    # The first opening: the volume from memory (its store written in the background).
    assert tuple(image.data.shape) == SHAPE
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


def test_first_opening_returns_before_the_store_is_written(small_sample, monkeypatch):
    # Writing the store on napari's main thread froze the viewer ~5 s: the layers come
    # from memory at once, the store follows in a background thread, and whoever opens
    # it (an autosave, a run) waits for it.
    import threading
    import time

    from napari_finetune.io.omezarr import open_volume
    from napari_finetune.io.pending import is_pending
    from napari_finetune.samples import store, synthetic_em_layers

    release, real = threading.Event(), store.write_store

    def slow_write(*args, **kwargs):
        release.wait(5.0)  # the old code waited here, on the caller's thread
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "write_store", slow_write)
    t = time.perf_counter()
    layers = synthetic_em_layers()
    elapsed = time.perf_counter() - t
    assert elapsed < 3.0, f"the sample waited {elapsed:.1f} s for its store"
    (image, image_kw, _), (truth, truth_kw, _) = layers
    path = image_kw["metadata"]["ome_zarr_path"]
    assert truth_kw["metadata"]["ome_zarr_path"] == path
    assert tuple(np.shape(image)) == SHAPE and tuple(np.shape(truth)) == SHAPE
    assert is_pending(path) and not store.is_complete(Path(path))
    opened = {}
    reader = threading.Thread(target=lambda: opened.update(v=open_volume(path)))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive(), "open_volume did not wait for the store being written"
    release.set()
    reader.join(30)
    assert tuple(opened["v"].levels[0].shape) == SHAPE
    assert store.is_complete(Path(path)) and not is_pending(path)
    np.testing.assert_array_equal(np.asarray(opened["v"].levels[0]), image)
    # The second opening reads the cached store, lazily and multiscale.
    (levels, kw, _), _ = synthetic_em_layers()
    assert kw["multiscale"] and tuple(levels[0].shape) == SHAPE


def test_a_failed_background_write_is_raised_to_whoever_waits(small_sample, monkeypatch):
    from napari_finetune.io.pending import wait_written
    from napari_finetune.samples import store, synthetic_em_layers

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store, "write_store", broken)
    (_, kw, _), _ = synthetic_em_layers()
    with pytest.raises(OSError, match="disk full"):
        wait_written(kw["metadata"]["ome_zarr_path"], timeout_s=30)


def test_open_default_sample_reads_the_shipped_volume(make_napari_viewer, tmp_path, monkeypatch):
    # The sample a user opens (no shape set): read from the package, never drawn on
    # napari's main thread (2-3 s there, with scipy's import).
    from napari_finetune.io.pending import wait_written
    from napari_finetune.samples import shipped
    from napari_finetune.samples import synthetic_em as gen

    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path))
    monkeypatch.delenv("NAPARI_FINETUNE_SAMPLE_SHAPE", raising=False)

    def no_drawing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the default sample was drawn, not read")

    monkeypatch.setattr(gen, "generate_volume", no_drawing)
    viewer = make_napari_viewer()
    viewer.open_sample("napari-finetune", "synthetic-em")
    image = viewer.layers["synthetic-em (target)"]
    expected = shipped.read({"domain": "target", "seed": 1, "shape": list(gen.DEFAULT_SHAPE),
                             "generator_version": gen.GENERATOR_VERSION})
    assert expected is not None
    np.testing.assert_array_equal(np.asarray(image.data), expected[0])
    np.testing.assert_array_equal(np.asarray(viewer.layers["ground truth"].data), expected[1])
    wait_written(image.metadata["ome_zarr_path"], timeout_s=120)  # drawn by nobody either
