"""What of a volume travels to a remote run: the painting and the tiles its patches can reach.

A run's patches are anchored on painted voxels, so everything it reads lies in
the tiles :func:`~napari_finetune.data.region_cache.reachable_tiles` names
(the region cache's own rule). The client reads those tiles once and ships
them with the painted voxels (flat indices and values); the worker rebuilds
the painting as a dense array and serves the image from the tiles through a
:class:`TileVolume`, which reads exactly the bytes the whole volume would give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_finetune.data.region_cache import (
    Box,
    overlap,
    reachable_tiles,
    tile_box,
    tiles_touching,
)


@dataclass(frozen=True)
class Painting:
    """The painted voxels of a corrections volume: flat indices and their labels."""

    shape: tuple[int, ...]
    flat: np.ndarray  # int64 flat indices of painted voxels
    values: np.ndarray  # uint8 (or the painting's dtype) labels there
    dtype: str

    @classmethod
    def of(cls, corrections: Any) -> Painting:
        """The painting of ``corrections`` (numpy, zarr or dask)."""
        dense = np.asarray(corrections)
        flat = np.flatnonzero(dense)
        return cls(tuple(int(s) for s in dense.shape), flat.astype(np.int64),
                   dense.reshape(-1)[flat], str(dense.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes that travel."""
        return int(self.flat.nbytes + self.values.nbytes)

    def dense(self) -> np.ndarray:
        """The corrections volume again (0 where nothing is painted)."""
        out = np.zeros(self.shape, dtype=self.dtype)
        out.reshape(-1)[self.flat] = self.values
        return out

    def coordinates(self) -> np.ndarray:
        """``(n, ndim)`` coordinates of the painted voxels."""
        return np.stack(np.unravel_index(self.flat, self.shape), axis=1)


@dataclass(frozen=True)
class ImageTiles:
    """The image tiles a run can reach, read on the client, with the volume's shape and dtype."""

    shape: tuple[int, ...]
    dtype: str
    tile_shape: tuple[int, ...]
    tiles: dict[tuple[int, ...], np.ndarray]

    @classmethod
    def read(cls, image: Any, painting: Painting, tile_shape: tuple[int, ...]) -> ImageTiles:
        """Read from ``image`` every tile a patch anchored on ``painting`` can touch."""
        shape = tuple(int(s) for s in image.shape)
        indices = reachable_tiles([painting.coordinates()], tile_shape, shape)
        tiles = {
            tuple(int(i) for i in index): np.asarray(image[tile_box(index, tile_shape, shape)])
            for index in indices
        }
        return cls(shape, str(np.dtype(image.dtype)), tuple(int(t) for t in tile_shape), tiles)

    @property
    def nbytes(self) -> int:
        """Bytes of the tiles (what travels of the image)."""
        return sum(int(t.nbytes) for t in self.tiles.values())


class TileVolume:
    """An image of which only some tiles are here: reads inside them, a clear error elsewhere.

    Parameters
    ----------
    tiles : ImageTiles
        The shipped tiles.
    """

    def __init__(self, tiles: ImageTiles) -> None:
        self.shape = tiles.shape
        self.dtype = np.dtype(tiles.dtype)
        self.ndim = len(self.shape)
        self._tiles = tiles

    def __getitem__(self, key: Box) -> np.ndarray:
        """``image[key]`` for a box of unit-step slices inside the shipped tiles."""
        box = tuple(slice(*k.indices(s)[:2]) for k, s in zip(key, self.shape, strict=True))
        out = np.empty(tuple(b.stop - b.start for b in box), dtype=self.dtype)
        tile_shape = self._tiles.tile_shape
        for index in tiles_touching(box, tile_shape):
            tile = self._tiles.tiles.get(index)
            if tile is None:
                raise IndexError(
                    f"the region {box} of the image was not sent to this worker (only the "
                    "tiles around the painted voxels were); this is a bug of napari-finetune."
                )
            dst, src = overlap(box, tile_box(index, tile_shape, self.shape))
            out[dst] = tile[src]
        return out
