"""What the engine needs of an image, labels or probability volume.

Volumes reach the engine as numpy arrays (napari's layer data), zarr arrays (an
OME-Zarr store's level) or dask arrays (ome-zarr-py's levels, napari's lazy layers).
They are read by slicing, a block at a time, so one structural type names all three
instead of ``Any``: anything with a shape, a dtype and ``[]`` is a volume.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

# What a volume is indexed with: a block's slices, or an int for a plane or a voxel.
Index = slice | int | tuple[slice | int, ...]


class VolumeArray(Protocol):
    """An array-like volume (numpy, zarr or dask) read by slicing, never whole.

    ``shape`` is ints: dask's unknown (nan) chunk sizes never occur for a stored
    volume. A slice comes back as whatever the array gives (numpy, zarr's
    ndarray-like, dask); callers pass it through ``np.asarray``.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...  # noqa: D102

    @property
    def dtype(self) -> np.dtype[Any]: ...  # noqa: D102

    @property
    def ndim(self) -> int: ...  # noqa: D102

    def __getitem__(self, key: Index, /) -> npt.ArrayLike: ...  # noqa: D105


class ArrayTarget(Protocol):
    """Where a volume's values are written (numpy or zarr): a shape, a dtype and ``[] =``."""

    @property
    def shape(self) -> tuple[int, ...]: ...  # noqa: D102

    @property
    def dtype(self) -> np.dtype[Any]: ...  # noqa: D102

    def __setitem__(self, key: Index, value: np.ndarray, /) -> None: ...  # noqa: D105


class WritableVolume(VolumeArray, ArrayTarget, Protocol):
    """A volume written block by block and read back (numpy or zarr), e.g. labels that a
    second pass renumbers in place."""


# One target array, or one per channel.
Targets = ArrayTarget | Sequence[ArrayTarget]
