"""The generator's instance truth: what it drew, object by object, agreeing with
the semantic truth and leaving the default output untouched."""

import numpy as np
import pytest
from scipy import ndimage

from napari_finetune.samples.synthetic_em import INSTANCE_CLASSES, generate_volume

SHAPE = (24, 80, 80)


@pytest.fixture(scope="module")
def drawn():
    return generate_volume(SHAPE, 3, "target", instances=True)


@pytest.mark.parametrize("domain", ["source", "target"])
def test_default_output_is_the_same_with_or_without_instances(domain):
    plain = generate_volume(SHAPE, 3, domain)
    image, truth, labels = generate_volume(SHAPE, 3, domain, instances=True)
    assert len(plain) == 2
    np.testing.assert_array_equal(plain[0], image)
    np.testing.assert_array_equal(plain[1], truth)
    assert set(labels) == set(INSTANCE_CLASSES)


def test_every_mitochondria_voxel_has_an_id_and_only_those(drawn):
    _, truth, labels = drawn
    mito = labels["mitochondria"]
    assert mito.dtype == np.uint32 and mito.shape == SHAPE
    np.testing.assert_array_equal(mito > 0, truth == 2)
    ids = np.unique(mito[mito > 0])
    np.testing.assert_array_equal(ids, np.arange(1, ids.size + 1))  # consecutive
    # Several objects, and more ids than the connected blobs would give only where
    # two drawn mitochondria touch: never fewer.
    _, n_blobs = ndimage.label(truth == 2)
    assert ids.size >= n_blobs >= 3


def test_cells_are_zero_exactly_on_membrane_and_never_cross_one(drawn):
    _, truth, labels = drawn
    cells = labels["cells"]
    assert cells.dtype == np.uint32
    np.testing.assert_array_equal(cells == 0, truth == 1)
    ids = np.unique(cells[cells > 0])
    np.testing.assert_array_equal(ids, np.arange(1, ids.size + 1))
    # Each id is one connected region (ids are unique per region) ...
    for region, box in enumerate(ndimage.find_objects(cells), start=1):
        _, n = ndimage.label(cells[box] == region)
        assert n == 1, f"cell {region} is {n} pieces"
    # ... and a mitochondrion lies inside a single cell.
    mito = labels["mitochondria"]
    for m in np.unique(mito[mito > 0]):
        assert np.unique(cells[mito == m]).size == 1
    # A cell is a real region, not one voxel per id: most of the interior is in big cells.
    sizes = np.bincount(cells.ravel())[1:]
    assert sizes[sizes >= 1000].sum() > 0.95 * sizes.sum()
