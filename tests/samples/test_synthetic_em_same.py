"""The vectorised generator draws the very volumes the zoom-based one drew.

The sample's figures (the demo's IoUs, the benchmarks) were measured on those
volumes, so a faster generator must not change one voxel. The digests below
were taken from the former implementation (``ndimage.zoom`` per smooth field,
``np.unique`` for the cell ids) before it was replaced.
"""

import hashlib

import numpy as np
import pytest
from scipy import ndimage

from napari_finetune.samples import synthetic_em as gen

# sha256 (first 16 hex digits) of image, truth, cells and mitochondria ids, in that order.
FORMER_DIGESTS = {
    ((16, 48, 40), "source"): "692d8665323f4efc",
    ((16, 48, 40), "target"): "916c5fd19c861ec6",
    ((24, 64, 72), "source"): "735176ebbcb45f1b",
    ((24, 64, 72), "target"): "b91d6910bc274870",
}


def _digest(shape: tuple[int, int, int], domain: str) -> str:
    image, truth, instances = gen.generate_volume(shape, domain=domain, instances=True)
    h = hashlib.sha256()
    for array in (image, truth, instances["cells"], instances["mitochondria"]):
        h.update(array.tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("shape", "domain"), list(FORMER_DIGESTS))
def test_volume_is_the_former_generators(shape, domain):
    assert _digest(shape, domain) == FORMER_DIGESTS[shape, domain]


@pytest.mark.parametrize(("shape", "scale"), [((16, 48, 40), 12.0), ((20, 33, 64), 2.5),
                                              ((8, 8, 9), 1.2)])
def test_upsampling_matches_zoom_to_floats_last_bit(shape, scale):
    """The separable interpolation samples where ``ndimage.zoom(order=1)`` does."""
    rng = np.random.default_rng(3)
    coarse = tuple(max(2, int(np.ceil(s / scale)) + 2) for s in shape)
    field = rng.standard_normal(coarse).astype(np.float32)
    zoom = [(s + 2 * scale) / c for s, c in zip(shape, coarse, strict=True)]
    expected = ndimage.zoom(field, zoom, order=1)
    off = int(scale)
    window = [slice(off, off + s) for s in shape]
    got = gen._upsample_linear(field, list(expected.shape), window)
    cut = expected[tuple(window)]
    assert got.shape == cut.shape == shape
    np.testing.assert_allclose(got, cut, rtol=0, atol=4 * np.finfo(np.float32).eps)


def test_cell_ids_are_numbered_as_unique_would():
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 5, size=(6, 7, 8)).astype(np.int32)
    truth = (rng.random((6, 7, 8)) < 0.3).astype(np.uint8)  # 1: membrane
    got = gen._cell_instances(cells, truth)
    interior = truth != 1
    pieces, _ = ndimage.label(interior)
    key = pieces.astype(np.int64) * (int(cells.max()) + 1) + cells
    _, ids = np.unique(key[interior], return_inverse=True)
    assert np.array_equal(got[interior], ids + 1)
    assert not got[~interior].any()
