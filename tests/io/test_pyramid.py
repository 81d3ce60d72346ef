"""Labels pyramids: the image's levels and transforms, nearest-neighbour, bounded memory."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zarr

from napari_finetune.io.omezarr import (
    create_labels_array,
    list_labels,
    load_corrections,
    open_volume,
    write_labels,
)
from napari_finetune.io.pyramid import fill_pyramid, nearest_indices


def brute_nearest(n_dst: int, n_src: int, dst: tuple[float, float],
                  src: tuple[float, float]) -> np.ndarray:
    """Nearest source voxel centre by exhaustive search (ties: the higher index)."""
    dst_centres = dst[1] + np.arange(n_dst) * dst[0]
    src_centres = src[1] + np.arange(n_src) * src[0]
    dist = np.abs(dst_centres[:, None] - src_centres[None, :])
    best = dist.min(axis=1, keepdims=True)
    ties = np.isclose(dist, best, rtol=0, atol=1e-9)
    return n_src - 1 - np.argmax(ties[:, ::-1], axis=1)


@pytest.mark.parametrize(("n_dst", "n_src", "dst", "src"), [
    (32, 64, (1.0, 0.25), (0.5, 0.0)),  # ome-zarr-py's levels: centred on the footprint
    (32, 64, (2.0, 0.0), (1.0, 0.0)),  # same origin at every level
    (33, 65, (2.0, 0.5), (1.0, 0.0)),  # odd size: the last one clipped
    (16, 64, (4.0, 1.5), (1.0, 0.0)),  # factor 4
    (10, 30, (3.0, 7.0), (1.0, 6.0)),  # factor 3, with an origin offset
    (16, 16, (2.0, 0.0), (2.0, 0.0)),  # an axis that is not downsampled
])
def test_nearest_indices_match_exhaustive_search(n_dst, n_src, dst, src) -> None:
    np.testing.assert_array_equal(nearest_indices(n_dst, n_src, dst, src),
                                  brute_nearest(n_dst, n_src, dst, src))


def test_nearest_indices_trust_shapes_when_metadata_is_wrong() -> None:
    # The same scale on both levels although one is half the size: the shapes decide.
    np.testing.assert_array_equal(nearest_indices(4, 8, (1.0, 0.0), (1.0, 0.0)), [1, 3, 5, 7])


def _assert_pyramid(store: Path, name: str, level0: np.ndarray) -> None:
    """Every level has the image's shape and transforms, and samples the level above."""
    image, labels = open_volume(store), open_volume(store / "labels" / name)
    assert len(labels.levels) == len(image.levels) > 1
    assert labels.scale == image.scale and labels.translation == image.translation
    np.testing.assert_array_equal(np.asarray(labels.levels[0]), level0)
    for k in range(1, len(image.levels)):
        assert labels.levels[k].shape == image.levels[k].shape
        above = np.asarray(labels.levels[k - 1])
        picks = [
            brute_nearest(n_dst, n_src, (s_dst, t_dst), (s_src, t_src))
            for n_dst, n_src, s_dst, t_dst, s_src, t_src in zip(
                labels.levels[k].shape, above.shape, labels.scale[k], labels.translation[k],
                labels.scale[k - 1], labels.translation[k - 1], strict=True)
        ]
        np.testing.assert_array_equal(np.asarray(labels.levels[k]), above[np.ix_(*picks)])


def test_labels_get_every_level_of_an_odd_sized_image(tmp_path: Path, make_store,
                                                     version: str) -> None:
    image = np.zeros((15, 63, 65), np.uint16)
    store = make_store(tmp_path / "odd.zarr", version, image=image, scale_factors=(2, 4))
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 5, image.shape).astype(np.uint8)
    write_labels(store, "cells", labels)
    _assert_pyramid(store, "cells", labels)


@pytest.mark.filterwarnings("ignore:The 'coordinate_transformations' argument:DeprecationWarning")
def test_z_downsampled_image_with_an_origin(tmp_path: Path, version: str) -> None:
    """Levels that shrink z too, and a translation on every level, are copied as they are."""
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    fmt = FormatV04() if version == "0.4" else FormatV05()
    path = tmp_path / "zdown.zarr"
    root = zarr.group(store=parse_url(str(path), mode="w", fmt=fmt).store,
                      zarr_format=fmt.zarr_format)
    transforms = [
        [{"type": "scale", "scale": [1.0 * f, 0.5 * f, 0.5 * f]},
         {"type": "translation", "translation": [10.0, 20.0 + 0.25 * (f - 1), -5.0]}]
        for f in (1, 2, 4)
    ]
    write_image(np.zeros((16, 32, 32), np.uint8), root, axes="zyx", fmt=fmt,
                scale_factors=[{"z": 2, "y": 2, "x": 2}, {"z": 4, "y": 4, "x": 4}],
                coordinate_transformations=transforms)
    labels = np.zeros((16, 32, 32), np.uint8)
    labels[4:12, 8:24, 8:24] = 3
    labels[0, 0, 0] = 7
    write_labels(path, "cells", labels)
    _assert_pyramid(path, "cells", labels)
    assert open_volume(path / "labels" / "cells").levels[2].shape == (4, 8, 8)


def test_two_dimensional_image(tmp_path: Path, make_store, version: str) -> None:
    image = np.zeros((64, 48), np.uint8)
    store = make_store(tmp_path / "yx.zarr", version, image=image, axes="yx")
    labels = np.zeros_like(image)
    labels[10:30, 5:40] = 2
    write_labels(store, "cells", labels)
    _assert_pyramid(store, "cells", labels)


def test_create_labels_array_then_fill_pyramid(store: Path) -> None:
    """Filled block by block in place, the smaller levels follow once fill_pyramid runs."""
    level0 = create_labels_array(store, "prediction", (16, 64, 64), np.uint8, (8, 32, 32))
    group = zarr.open_group(str(store / "labels" / "prediction"), mode="r+")
    assert sorted(group.array_keys()) == ["s0", "s1", "s2"]
    expected = np.zeros((16, 64, 64), np.uint8)
    for z in range(0, 16, 8):
        level0[z:z + 8] = z + 1
        expected[z:z + 8] = z + 1
    fill_pyramid(group)
    _assert_pyramid(store, "prediction", expected)
    assert list_labels(store)[-1] == "prediction"


def test_saving_again_updates_every_level(store: Path) -> None:
    """A save over a multi-level labels image keeps all its levels, with the new values."""
    first = np.zeros((16, 64, 64), np.uint8)
    first[:, :32] = 2
    write_labels(store, "cells", first)
    second = np.zeros_like(first)
    second[:, 32:] = 4
    write_labels(store, "cells", second)
    _assert_pyramid(store, "cells", second)
    np.testing.assert_array_equal(load_corrections(store, "cells"), second)


def test_pyramid_is_written_with_bounded_memory(tmp_path: Path, make_store) -> None:
    """A 16 MiB labels volume read from zarr and written as 3 levels, a few chunks at a time.

    tracemalloc sees numpy's buffers and zarr's decoded chunks; loading a whole
    level (as ``np.asarray(labels)`` did) would show at least 16 MiB. Measured:
    1.6 MiB with 64 KiB chunks.
    """
    shape, chunks = (64, 512, 512), (16, 64, 64)  # chunks of 64 KiB
    image = zarr.create_array(str(tmp_path / "src.zarr"), shape=shape, chunks=chunks,
                              dtype=np.uint8, fill_value=0)
    store = make_store(tmp_path / "big.zarr", "0.5", image=np.zeros(shape, np.uint8),
                       scale_factors=(2, 4), chunks=chunks)
    image[:, 100:300, 200:400] = 3
    size = int(np.prod(shape))

    tracemalloc.start()
    try:
        write_labels(store, "big", image)  # a zarr array in, as a big prediction would be
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB volume"
    levels = open_volume(store / "labels" / "big").levels
    assert [lv.shape for lv in levels] == [shape, (64, 256, 256), (64, 128, 128)]
    assert int(np.asarray(levels[2][0, 40, 60])) == 3 and int(np.asarray(levels[2][0, 0, 0])) == 0


def test_an_image_in_one_big_chunk_gets_labels_in_bounded_chunks(tmp_path: Path,
                                                                 make_store) -> None:
    from napari_finetune.io.pyramid import MAX_CHUNK_VOXELS, bounded_chunks

    assert bounded_chunks((64, 1024, 1024), 2**20) == (64, 128, 128)
    assert bounded_chunks((8, 32, 32), 2**20) == (8, 32, 32)
    store = make_store(tmp_path / "one_chunk.zarr", "0.5", image=np.zeros((32, 512, 512),
                                                                           np.uint8))
    assert open_volume(store).data.chunksize == (32, 512, 512)  # one chunk of 8 MiB
    write_labels(store, "cells", np.ones((32, 512, 512), np.uint8))
    chunks = zarr.open_array(str(store / "labels" / "cells" / "s0"), mode="r").chunks
    assert int(np.prod(chunks)) <= MAX_CHUNK_VOXELS


def test_save_corrections_from_a_lazy_wide_array(store: Path, tmp_path: Path) -> None:
    """A zarr int32 array in: its range is found lazily, it is stored as uint8 on every level."""
    from napari_finetune.io.omezarr import save_corrections

    wide = zarr.create_array(str(tmp_path / "wide.zarr"), shape=(16, 64, 64), chunks=(8, 32, 32),
                             dtype=np.int32, fill_value=0)
    wide[3, 10:20, 10:20] = 3
    save_corrections(store, wide)
    levels = open_volume(store / "labels" / "corrections").levels
    assert {lv.dtype for lv in levels} == {np.dtype(np.uint8)}
    np.testing.assert_array_equal(load_corrections(store), np.asarray(wide[:]))
