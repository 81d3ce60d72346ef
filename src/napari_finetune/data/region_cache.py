"""Keep the part of a volume the patch sampler can reach in memory.

Patches are anchored on painted voxels, so the voxels a run can ever read lie
within one patch of a stroke: a few strokes on a big volume reach a tiny part
of it. Reading that part once per run, instead of a patch's worth of zarr
chunks (through dask) per sample, takes the store out of the training step:
measured on the sample store, ``sample(4)`` at 32x64x64 cost ~30-55 ms from
the store and ~3-4 ms from memory (docs/benchmarks.md, "Sample feed").

The reachable part is kept as tiles of a grid whose tile is the patch shape:
every tile holding a painted voxel, and its neighbours on every axis (a patch
anchored in tile ``k`` starts no earlier than tile ``k - 1`` and ends no later
than tile ``k + 1``). Tiles are read from the store once, on the first read
(that is, in the thread that draws samples, never on the Qt main thread), and
only when all of them fit the byte budget; otherwise nothing is cached and
every patch is read from the store as before. Nothing outside the tiles is
ever read, so the whole image is never loaded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from napari_finetune.arrays import VolumeArray

Box = tuple[slice, ...]


def reachable_tiles(
    anchors: Iterable[np.ndarray], patch_shape: Sequence[int], shape: Sequence[int]
) -> np.ndarray:
    """Grid indices of the tiles that patches anchored on ``anchors`` can touch.

    Parameters
    ----------
    anchors : iterable of np.ndarray
        Arrays of shape ``(n, ndim)`` of painted voxel coordinates.
    patch_shape, shape : sequence of int
        The patch (= tile) shape and the volume's shape.

    Returns
    -------
    np.ndarray
        int64, shape ``(m, ndim)``: unique tile indices, sorted.
    """
    tile = np.asarray(patch_shape, dtype=np.int64)
    grid = -(-np.asarray(shape, dtype=np.int64) // tile)  # tiles per axis, ceiling
    own = [np.unique(np.asarray(a, dtype=np.int64) // tile, axis=0) for a in anchors]
    own = [a for a in own if len(a)]
    if not own:
        return np.zeros((0, len(tile)), dtype=np.int64)
    centres = np.unique(np.concatenate(own), axis=0)
    offsets = np.array(list(itertools.product((-1, 0, 1), repeat=len(tile))), dtype=np.int64)
    around = (centres[:, None, :] + offsets[None, :, :]).reshape(-1, len(tile))
    inside = np.all((around >= 0) & (around < grid), axis=1)
    return np.unique(around[inside], axis=0)


def tile_box(index: Sequence[int], tile_shape: Sequence[int], shape: Sequence[int]) -> Box:
    """Tile ``index`` of a grid of ``tile_shape`` as slices of a volume of ``shape``."""
    return tuple(
        slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(index, tile_shape, shape, strict=True)
    )


def tiles_touching(box: Box, tile_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Grid indices of the tiles that ``box`` (unit-step slices) overlaps."""
    spans = (
        range(b.start // t, (b.stop - 1) // t + 1) for b, t in zip(box, tile_shape, strict=True)
    )
    return list(itertools.product(*spans))


def overlap(box: Box, other: Box) -> tuple[Box, Box]:
    """Where two overlapping boxes meet, in ``box``'s and in ``other``'s coordinates."""
    lo = [max(b.start, o.start) for b, o in zip(box, other, strict=True)]
    hi = [min(b.stop, o.stop) for b, o in zip(box, other, strict=True)]
    return (
        tuple(slice(a - b.start, z - b.start) for a, z, b in zip(lo, hi, box, strict=True)),
        tuple(slice(a - o.start, z - o.start) for a, z, o in zip(lo, hi, other, strict=True)),
    )


class RegionCache:
    """In-memory tiles of an array around the painted voxels.

    Parameters
    ----------
    array : VolumeArray
        The image or the corrections.
    tiles : np.ndarray
        Tile indices from :func:`reachable_tiles`.
    tile_shape : sequence of int
        The tile shape (the patch shape).

    Attributes
    ----------
    loaded : bool
        Whether the tiles have been read.
    misses : int
        Reads that were not covered by the tiles and went to ``array``.
    """

    def __init__(self, array: VolumeArray, tiles: np.ndarray, tile_shape: Sequence[int]) -> None:
        self.array = array
        self.tile_shape = tuple(int(t) for t in tile_shape)
        self.shape = tuple(int(s) for s in array.shape)
        self.tile_indices = [tuple(int(i) for i in t) for t in tiles]
        self.tiles: dict[tuple[int, ...], np.ndarray] = {}
        self.loaded = False
        self.misses = 0

    @property
    def nbytes(self) -> int:
        """Bytes the tiles take once read (edge tiles are smaller; this is exact)."""
        itemsize = np.dtype(self.array.dtype).itemsize
        return sum(int(np.prod(self._extent(t))) for t in self.tile_indices) * itemsize

    def _tile_box(self, index: tuple[int, ...]) -> Box:
        return tile_box(index, self.tile_shape, self.shape)

    def _extent(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(b.stop - b.start for b in self._tile_box(index))

    def load(self) -> None:
        """Read every tile from the array (once)."""
        if self.loaded:
            return
        for index in self.tile_indices:
            self.tiles[index] = np.asarray(self.array[self._tile_box(index)])
        self.loaded = True

    def covers(self, box: Box) -> bool:
        """Whether the loaded tiles hold all of ``box`` (unit-step slices)."""
        needed = tiles_touching(box, self.tile_shape)
        return self.loaded and all(index in self.tiles for index in needed)

    def read(self, box: Box) -> np.ndarray:
        """``array[box]`` (a box of unit-step slices), from the tiles where they cover it."""
        self.load()
        needed = tiles_touching(box, self.tile_shape)
        if any(index not in self.tiles for index in needed):
            self.misses += 1
            return np.asarray(self.array[box])
        out = np.empty(tuple(b.stop - b.start for b in box), dtype=self.array.dtype)
        for index in needed:
            dst, src = overlap(box, self._tile_box(index))
            out[dst] = self.tiles[index][src]
        return out
