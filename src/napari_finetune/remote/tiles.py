"""What of a volume travels to a remote run: the painting and the tiles its patches can reach.

A run's patches are anchored on painted voxels, so everything it reads lies in
the tiles :func:`~napari_finetune.data.region_cache.reachable_tiles` names
(the region cache's own rule). The client reads those tiles once and ships
them with the painted voxels (flat indices and values); the worker rebuilds
the painting as a dense array and serves the image from the tiles through a
:class:`TileVolume`, which reads exactly the bytes the whole volume would give.

When the image comes from a store on a filesystem the worker sees as well (a
lab's shared disk), a :class:`StoredImage` names the path instead and the
worker reads the image itself through a :class:`StoreVolume`: no tiles travel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.arrays import Index, VolumeArray
from napari_finetune.data.region_cache import (
    overlap,
    reachable_tiles,
    tile_box,
    tiles_touching,
)
from napari_finetune.errors import one_line

if TYPE_CHECKING:
    import dask.array as da


@dataclass(frozen=True)
class Painting:
    """The painted voxels of a corrections volume: flat indices and their labels."""

    shape: tuple[int, ...]
    flat: np.ndarray  # int64 flat indices of painted voxels
    values: np.ndarray  # uint8 (or the painting's dtype) labels there
    dtype: str

    @classmethod
    def of(cls, corrections: VolumeArray) -> Painting:
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
    def read(
        cls, image: VolumeArray, painting: Painting, tile_shape: tuple[int, ...],
    ) -> ImageTiles:
        """Read from ``image`` every tile a patch anchored on ``painting`` can touch."""
        shape = tuple(int(s) for s in image.shape)
        indices = reachable_tiles([painting.coordinates()], tile_shape, shape)
        tiles = {
            tuple(int(i) for i in index): np.asarray(image[tile_box(index, tile_shape, shape)])
            for index in indices
        }
        return cls(shape, str(np.dtype(image.dtype)), tuple(int(t) for t in tile_shape), tiles)

    @staticmethod
    def planned_nbytes(
        image: VolumeArray, painting: Painting, tile_shape: tuple[int, ...],
    ) -> int:
        """What :meth:`read` would read from ``image`` for ``painting``, in bytes (no read)."""
        shape = tuple(int(s) for s in image.shape)
        itemsize = np.dtype(image.dtype).itemsize
        return sum(
            int(np.prod([b.stop - b.start for b in tile_box(index, tile_shape, shape)]))
            * itemsize
            for index in reachable_tiles([painting.coordinates()], tile_shape, shape))

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

    def __getitem__(self, key: Index) -> np.ndarray:
        """``image[key]`` for a box of unit-step slices inside the shipped tiles."""
        # The trainer reads boxes only; a plane or a voxel is never asked for.
        slices = tuple(k for k in key if isinstance(k, slice)) if isinstance(key, tuple) else ()
        if not isinstance(key, tuple) or len(slices) != len(key):
            raise IndexError(f"the shipped image tiles are read by boxes of slices, not {key!r}")
        box = tuple(slice(*k.indices(s)[:2]) for k, s in zip(slices, self.shape, strict=True))
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


@dataclass(frozen=True)
class StoredImage:
    """The image as a store path the worker opens itself (a filesystem both machines see).

    Nothing of the image travels; the worker checks that the path opens there as
    an image of the client's shape and dtype before the run is sent this way.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes of the image that travel: none."""
        return 0

    def mismatch(self) -> str | None:
        """Why this process cannot read the image at ``path`` (None: it can)."""
        from napari_finetune.io.volume import open_volume

        try:
            data = open_volume(self.path).data
        except Exception as exc:  # missing, not zarr, not readable here: the reason
            return one_line(exc)
        shape = tuple(int(s) for s in data.shape)
        if shape != self.shape or str(np.dtype(data.dtype)) != self.dtype:
            return (f"{self.path} is {shape} {np.dtype(data.dtype)} here, the client's image "
                    f"{self.shape} {self.dtype}")
        return None

    def open(self) -> StoreVolume:
        """The image at ``path``, read in this process (ValueError: it is not the client's)."""
        from napari_finetune.io.volume import open_volume

        why = self.mismatch()
        if why is not None:
            raise ValueError(f"the image's store cannot be read on this worker ({why}); "
                             "run without store_path to send the image's tiles instead.")
        return StoreVolume(open_volume(self.path).data)


class StoreVolume:
    """A lazy (dask) image read in the calling thread.

    Inside a dask worker, computing a dask array would go through the cluster's
    scheduler (the worker's default) and wait on tasks the training task's
    thread may be the only one to run; each read here is computed synchronously.

    Parameters
    ----------
    array : dask.array.Array
        The image, full resolution.
    """

    def __init__(self, array: da.Array) -> None:
        self.shape = tuple(int(s) for s in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)
        self._array = array

    def __getitem__(self, key: Index) -> np.ndarray:
        """``image[key]`` as a numpy array."""
        return np.asarray(self._array[key].compute(scheduler="synchronous"))
