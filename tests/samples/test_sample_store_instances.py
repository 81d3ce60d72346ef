"""The sample store carries the instance truth as NGFF labels, read back intact."""

import numpy as np
import pytest

from napari_finetune.io.omezarr import load_corrections
from napari_finetune.samples import store as sample_store
from napari_finetune.samples import synthetic_em as gen

SHAPE = (16, 48, 48)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_instance_labels_are_written_and_read_back(cache):
    path = sample_store.ensure_sample("target", SHAPE, seed=2)
    _, truth, instances = gen.generate_volume(SHAPE, 2, "target", instances=True)
    np.testing.assert_array_equal(load_corrections(path, "ground_truth"), truth)
    for name in gen.INSTANCE_CLASSES:
        stored = np.asarray(load_corrections(path, f"ground_truth_{name}"))
        assert stored.dtype == np.uint32, name
        np.testing.assert_array_equal(stored, instances[name])
    assert instances["mitochondria"].max() > 1 and instances["cells"].max() > 1


def test_store_of_the_layout_without_instances_is_written_again(cache):
    path = sample_store.ensure_sample("target", SHAPE, seed=3)
    import zarr

    root = zarr.open_group(str(path), mode="r+")
    old = dict(root.attrs[sample_store.COMPLETE_KEY])
    old["store_layout"] = 2
    del old["instance_labels"]
    root.attrs[sample_store.COMPLETE_KEY] = old  # what a cache written before layout 3 holds
    assert not sample_store.is_complete(path, sample_store._record("target", SHAPE, 3))
    assert sample_store.ensure_sample("target", SHAPE, seed=3) == path
    assert sample_store.is_complete(path, sample_store._record("target", SHAPE, 3))
    assert np.asarray(load_corrections(path, "ground_truth_cells")).max() > 1
