"""What of a volume travels to a remote run: the painting and the tiles its patches can reach.

A run's patches are anchored on painted voxels, so everything it reads lies in
the tiles :func:`~napari_finetune.data.region_cache.reachable_tiles` names
(the region cache's own rule). The client reads those tiles once and ships
them with the painted voxels (flat indices and values); the worker rebuilds
the painting as a dense array and serves the image from the tiles through a
:class:`TileVolume`, which reads exactly the bytes the whole volume would give.

An image with channels or time points (an :class:`~napari_finetune.arrays.AxesImage`)
travels the same way: the tiles are cut over its painting (a time point is one
tile deep, so only the painted time points travel) and each carries every
channel the model takes.

When the image comes from a store on a filesystem the worker sees as well (a
lab's shared disk), a :class:`StoredImage` names the path instead and the
worker reads the image itself through a :class:`StoreVolume`: no tiles travel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.arrays import SPATIAL, AxesImage, AxisTaken, Index, VolumeArray
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


def reachable(
    image: AxesImage, painting: Painting, patch_shape: tuple[int, ...],
) -> tuple[tuple[int, ...], np.ndarray]:
    """The tile grid over ``image``'s painting and the tiles a patch anchored on
    ``painting`` can touch: ``(tile_shape, indices)``.

    A patch spans one time point, so a time axis is tiled one deep and only the
    painted time points have tiles (the region cache's rule would add the time
    points on either side, which no patch reads).
    """
    patch = tuple(int(p) for p in patch_shape)
    coordinates = painting.coordinates()
    if not image.has_time:
        return patch, reachable_tiles([coordinates], patch, image.labels_shape)
    spatial = image.spatial_shape
    found = [np.zeros((0, len(patch) + 1), dtype=np.int64)]
    for t in np.unique(coordinates[:, 0]):
        at_t = reachable_tiles([coordinates[coordinates[:, 0] == t, 1:]], patch, spatial)
        found.append(np.concatenate([np.full((len(at_t), 1), t, dtype=np.int64), at_t], axis=1))
    return (1, *patch), np.concatenate(found)


def _with_channels(box: tuple[slice, ...], axes: str) -> tuple[slice, ...]:
    """``box`` over a painting as a box of its image: every channel (``axes`` has ``c``)."""
    if "c" not in axes:
        return box
    where = axes.index("c")
    return box[:where] + (slice(None),) + box[where:]


@dataclass(frozen=True)
class ImageTiles:
    """The image tiles a run can reach, read on the client, with the image's shape and dtype.

    Attributes
    ----------
    shape, dtype
        The whole image's (its channels included).
    tile_shape : tuple of int
        The grid over the image's painting (no channel axis; 1 on a time axis).
    tiles : dict
        Grid index -> the tile's pixels, every channel included.
    axes : str
        The image's axes (``"czyx"``, ``"tzyx"``, ...); empty for ZYX or YX.
    """

    shape: tuple[int, ...]
    dtype: str
    tile_shape: tuple[int, ...]
    tiles: dict[tuple[int, ...], np.ndarray]
    axes: str = ""

    @classmethod
    def read(
        cls, image: VolumeArray | AxesImage, painting: Painting, patch_shape: tuple[int, ...],
    ) -> ImageTiles:
        """Read from ``image`` every tile a patch anchored on ``painting`` can touch."""
        axes_image = AxesImage.of(image)
        tile_shape, indices = reachable(axes_image, painting, patch_shape)
        shape = axes_image.labels_shape
        tiles = {
            tuple(int(i) for i in index): np.asarray(axes_image.array[_with_channels(
                tile_box(index, tile_shape, shape), axes_image.axes)])
            for index in indices
        }
        return cls(axes_image.shape, str(np.dtype(axes_image.array.dtype)), tile_shape, tiles,
                   "" if axes_image.is_plain else axes_image.axes)

    @staticmethod
    def planned_nbytes(
        image: VolumeArray | AxesImage, painting: Painting, patch_shape: tuple[int, ...],
    ) -> int:
        """What :meth:`read` would read from ``image`` for ``painting``, in bytes (no read)."""
        axes_image = AxesImage.of(image)
        tile_shape, indices = reachable(axes_image, painting, patch_shape)
        shape = axes_image.labels_shape
        per_voxel = np.dtype(axes_image.array.dtype).itemsize * axes_image.channels
        return sum(
            int(np.prod([b.stop - b.start for b in tile_box(index, tile_shape, shape)]))
            * per_voxel for index in indices)

    @property
    def nbytes(self) -> int:
        """Bytes of the tiles (what travels of the image)."""
        return sum(int(t.nbytes) for t in self.tiles.values())

    def volume(self) -> AxesImage:
        """The image on the worker: its tiles behind the client's axes."""
        volume = TileVolume(self)
        return AxesImage(volume, volume.axes)


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
        self.axes = tiles.axes or SPATIAL[-self.ndim:]
        self._tiles = tiles
        # The painting's shape: the grid's (no channel axis).
        self._grid_shape = tuple(s for a, s in zip(self.axes, self.shape, strict=True)
                                 if a != "c")

    def __getitem__(self, key: Index) -> np.ndarray:
        """``image[key]`` for a box inside the shipped tiles: unit-step slices, an int for a
        time point (:meth:`AxesImage.read <napari_finetune.arrays.AxesImage.read>`), any
        slice of the channels."""
        parts = key if isinstance(key, tuple) else (key,)
        if len(parts) != self.ndim or not all(
                isinstance(p, (slice, int, np.integer)) for p in parts):
            raise IndexError(f"the shipped image tiles are read by boxes of slices, not {key!r}")
        box: list[slice] = []  # over the painting
        # Applied to the box read with every channel: the channels asked for, 0 on an axis
        # given by an int (it is not in the result), every entry elsewhere.
        after: list[slice | int] = []
        for axis, part, size in zip(self.axes, parts, self.shape, strict=True):
            if axis == "c":
                after.append(part if isinstance(part, slice) else int(part))
                continue
            if isinstance(part, slice):
                box.append(slice(*part.indices(size)[:2]))
                after.append(slice(None))
            else:
                at = int(part) + size if int(part) < 0 else int(part)
                box.append(slice(at, at + 1))
                after.append(0)
        sizes = iter(b.stop - b.start for b in box)
        out = np.empty(tuple(s if a == "c" else next(sizes)
                             for a, s in zip(self.axes, self.shape, strict=True)),
                       dtype=self.dtype)
        tile_shape = self._tiles.tile_shape
        for index in tiles_touching(tuple(box), tile_shape):
            tile = self._tiles.tiles.get(index)
            if tile is None:
                raise IndexError(
                    f"the region {tuple(box)} of the image was not sent to this worker (only "
                    "the tiles around the painted voxels were); this is a bug of "
                    "napari-finetune."
                )
            dst, src = overlap(tuple(box), tile_box(index, tile_shape, self._grid_shape))
            out[_with_channels(dst, self.axes)] = tile[_with_channels(src, self.axes)]
        return out[tuple(after)]


@dataclass(frozen=True)
class StoredImage:
    """The image as a store path the worker opens itself (a filesystem both machines see).

    Nothing of the image travels; the worker checks that the path opens there as
    an image of the client's shape, dtype and axes before the run is sent this way.

    Attributes
    ----------
    path : str
        The store (what ``open_volume`` was given on the client).
    shape, dtype
        The client's image (after ``takes``).
    axes : str
        The client's image's axes; empty for ZYX or YX.
    takes : tuple of (int, int)
        The entries the client took of the store's image, innermost first (axis
        position, index): ``--channel 1`` of a CZYX store is ``((0, 1),)``.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    axes: str = ""
    takes: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, path: str, image: VolumeArray | AxesImage) -> StoredImage:
        """The store at ``path`` as the client's ``image`` reads it (a channel taken of it
        is taken on the worker too)."""
        axes_image = AxesImage.of(image)
        takes: list[tuple[int, int]] = []
        array: VolumeArray = axes_image.array
        while isinstance(array, AxisTaken):  # AxesImage.take's views, outermost first
            takes.insert(0, (array.axis, array.index))
            array = array.array
        return cls(path, axes_image.shape, str(np.dtype(axes_image.array.dtype)),
                   "" if axes_image.is_plain else axes_image.axes, tuple(takes))

    @property
    def nbytes(self) -> int:
        """Bytes of the image that travel: none."""
        return 0

    def _read(self) -> AxesImage:
        """The store's image in this process, read synchronously, ``takes`` taken."""
        import dask.array as da

        from napari_finetune.io.volume import open_volume

        found = open_volume(self.path, keep_axes=True).input
        array = found.array if isinstance(found.array, da.Array) else da.asarray(found.array)
        image = AxesImage(StoreVolume(array), found.axes, found.channel_names)
        for axis, index in self.takes:
            if axis >= len(image.axes):
                raise ValueError(f"{self.path} has no axis {axis} (axes {image.axes})")
            image = image.take(image.axes[axis], index)
        return image

    def mismatch(self) -> str | None:
        """Why this process cannot read the image at ``path`` (None: it can)."""
        try:
            image = self._read()
        except Exception as exc:  # missing, not zarr, not readable here: the reason
            return one_line(exc)
        axes = "" if image.is_plain else image.axes
        dtype = str(np.dtype(image.array.dtype))
        if image.shape != self.shape or dtype != self.dtype or axes != self.axes:
            return (f"{self.path} is {image.shape} {dtype} "
                    f"{image.axes.upper()} here, the client's image {self.shape} {self.dtype} "
                    f"{(self.axes or image.spatial_axes).upper()}")
        return None

    def open(self) -> AxesImage:
        """The image at ``path``, read in this process (ValueError: it is not the client's)."""
        why = self.mismatch()
        if why is not None:
            raise ValueError(f"the image's store cannot be read on this worker ({why}); "
                             "run without store_path to send the image's tiles instead.")
        return self._read()


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
