"""What the engine needs of an image, labels or probability volume.

Volumes reach the engine as numpy arrays (napari's layer data), zarr arrays (an
OME-Zarr store's level) or dask arrays (ome-zarr-py's levels, napari's lazy layers).
They are read by slicing, a block at a time, so one structural type names all three
instead of ``Any``: anything with a shape, a dtype and ``[]`` is a volume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


# NGFF's order of axes; a stored image's are a subsequence of it.
NGFF_AXES = "tczyx"
SPATIAL = "zyx"


class AxisTaken:
    """A lazy view of ``array`` with one entry of one axis taken (``array[..., i, ...]``).

    zarr arrays read at once when indexed, so a time point or a channel of a store is
    taken here, and only the blocks the engine asks for are ever read. The view can be
    written too when ``array`` can (a labels array with a time axis, one time point at a
    time).

    Parameters
    ----------
    array : array-like
        numpy, zarr or dask.
    axis, index : int
        The axis and the entry of it that the view holds.
    """

    def __init__(self, array: VolumeArray, axis: int, index: int) -> None:
        if not 0 <= index < int(array.shape[axis]):
            raise IndexError(f"index {index} is outside axis {axis} of size {array.shape[axis]}")
        self.array, self.axis, self.index = array, axis, int(index)

    @property
    def shape(self) -> tuple[int, ...]:  # noqa: D102
        shape = tuple(int(s) for s in self.array.shape)
        return shape[: self.axis] + shape[self.axis + 1 :]

    @property
    def dtype(self) -> np.dtype[Any]:  # noqa: D102
        return np.dtype(self.array.dtype)

    @property
    def ndim(self) -> int:  # noqa: D102
        return len(self.shape)

    def _full(self, key: Index) -> tuple[slice | int, ...]:
        parts = key if isinstance(key, tuple) else (key,)
        parts = parts + (slice(None),) * (self.ndim - len(parts))
        return parts[: self.axis] + (self.index,) + parts[self.axis :]

    def __getitem__(self, key: Index, /) -> npt.ArrayLike:  # noqa: D105
        return self.array[self._full(key)]

    def __setitem__(self, key: Index, value: np.ndarray, /) -> None:  # noqa: D105
        self.array[self._full(key)] = value  # type: ignore[index]

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self[()], dtype=dtype)


def _check_axes(axes: str, ndim: int) -> None:
    """A one-line ValueError unless ``axes`` names ``ndim`` axes in NGFF order, spatial last."""
    positions = [NGFF_AXES.find(a) for a in axes]
    spatial = [a for a in axes if a in SPATIAL]
    if (
        len(axes) != ndim
        or -1 in positions
        or positions != sorted(set(positions))
        or len(spatial) not in (2, 3)
        or not axes.endswith("".join(spatial))
    ):
        raise ValueError(
            f"axes {axes!r} do not describe an image of {ndim} dimensions; name each axis "
            "in NGFF order from 'tczyx' (e.g. 'zyx', 'czyx', 'tzyx', 'tczyx', 'tyx')."
        )


@dataclass(frozen=True)
class AxesImage:
    """An image with its axes named: how channels and time points travel to the engine.

    A plain array (numpy, zarr or dask) still means what it always meant: ZYX or YX,
    one channel, one time point. An image with channels (``c``) or time points
    (``t``) reaches a run, a prediction and the objects as an ``AxesImage``, so no
    front end guesses what an axis is from its size.

    Parameters
    ----------
    array : array-like
        numpy, zarr or dask; read a block at a time.
    axes : str
        One letter per axis of ``array``, in NGFF order: ``"zyx"``, ``"czyx"``,
        ``"tzyx"``, ``"tczyx"``, ``"tyx"``, ...
    channel_names : tuple of str
        The channels' names in order (a store's ``omero`` labels), when known; a
        run records them, so the model's input channels stay known.
    channel_taken : int, optional
        The index of the channel this image is, when it was taken from an image of
        several (:meth:`channel`): a run records it, so the channel a single-channel
        model read stays known where the store names no channels.

    The painting of such an image (corrections, predictions, objects) has its
    axes without ``c`` (:attr:`labels_shape`): one label per voxel and time point.
    """

    array: VolumeArray
    axes: str
    channel_names: tuple[str, ...] = ()
    channel_taken: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", self.axes.lower())
        _check_axes(self.axes, len(self.array.shape))
        names = tuple(str(n) for n in self.channel_names)
        # Names that do not match the channels (omero metadata out of date) are dropped.
        object.__setattr__(self, "channel_names", names if len(names) == self.channels else ())

    def describe_channel(self, index: int) -> str:
        """``"1: GFP"``: a channel's index and, when known, its name."""
        name = self.channel_names[index] if self.channel_names else ""
        return f"{index}: {name}" if name else str(index)

    @classmethod
    def of(cls, image: VolumeArray | AxesImage) -> AxesImage:
        """``image`` as an AxesImage: a plain array is ZYX or YX, as it always was."""
        if isinstance(image, AxesImage):
            return image
        ndim = len(image.shape)
        if ndim not in (2, 3):
            raise ValueError(
                f"an image of shape {tuple(image.shape)} needs its axes named (e.g. "
                "AxesImage(array, 'czyx')); a plain array is ZYX or YX."
            )
        return cls(image, SPATIAL[-ndim:])

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(int(s) for s in self.array.shape)

    def size(self, axis: str) -> int:
        """Entries on ``axis`` (1 when the image has no such axis)."""
        return self.shape[self.axes.index(axis)] if axis in self.axes else 1

    @property
    def channels(self) -> int:
        """Number of channels (1 without a ``c`` axis)."""
        return self.size("c")

    @property
    def time_points(self) -> int:
        """Number of time points (1 without a ``t`` axis)."""
        return self.size("t")

    @property
    def has_time(self) -> bool:
        """Whether the image has a ``t`` axis (its painting has one too)."""
        return "t" in self.axes

    @property
    def is_plain(self) -> bool:
        """Spatial axes only: the engine's path for ZYX and YX is taken unchanged."""
        return all(a in SPATIAL for a in self.axes)

    @property
    def spatial_axes(self) -> str:
        """``"zyx"`` or ``"yx"``."""
        return "".join(a for a in self.axes if a in SPATIAL)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        """The shape of the spatial axes."""
        return tuple(s for a, s in zip(self.axes, self.shape, strict=True) if a in SPATIAL)

    @property
    def labels_axes(self) -> str:
        """The axes of this image's painting and predictions: the image's without ``c``."""
        return self.axes.replace("c", "")

    @property
    def labels_shape(self) -> tuple[int, ...]:
        """The shape of this image's painting and predictions (no ``c`` axis)."""
        return tuple(s for a, s in zip(self.axes, self.shape, strict=True) if a != "c")

    def take(self, axis: str, index: int) -> AxesImage:
        """This image with one entry of ``axis`` taken (lazily): a channel or a time point."""
        if axis not in self.axes:
            raise ValueError(f"the image (axes {self.axes}) has no {axis!r} axis")
        where = self.axes.index(axis)
        names, taken = self.channel_names, self.channel_taken
        if axis == "c":
            names, taken = names[index : index + 1], int(index)
        return AxesImage(AxisTaken(self.array, where, index), self.axes.replace(axis, ""), names,
                         taken)

    def channel(self, index: int) -> AxesImage:
        """Channel ``index`` alone (a single-channel model on a multi-channel store)."""
        return self.take("c", index) if "c" in self.axes else self

    def at_time(self, index: int) -> AxesImage:
        """Time point ``index`` alone; the image itself when it has no time axis."""
        return self.take("t", index) if self.has_time else self

    def read(self, box: tuple[slice | int, ...]) -> np.ndarray:
        """The channels of ``box`` as ``(C, *spatial)``; ``box`` indexes :attr:`labels_shape`.

        A time axis in ``box`` is given as an int or a slice of one time point and is
        dropped; a missing channel axis becomes one of size 1.
        """
        parts = list(box)
        key: list[slice | int] = []
        for axis in self.axes:
            if axis == "c":
                key.append(slice(None))
                continue
            part = parts.pop(0)
            if axis == "t" and isinstance(part, slice):
                part = int(part.start or 0)  # one time point per block
            key.append(part)
        block = np.asarray(self.array[tuple(key)])
        return block if "c" in self.axes else block[None]

    def for_model(self, in_channels: int, channel: int | None = None,
                  what: str = "the store") -> AxesImage:
        """The image a model of ``in_channels`` input channels runs on: all the channels,
        or channel ``channel`` alone for a single-channel model.

        Raises
        ------
        ChannelChoiceError
            One line naming the choice: a single-channel model on several channels
            without ``channel``, a channel that is not there, or channel counts that
            differ.
        """
        count = self.channels
        listed = ", ".join(self.describe_channel(c) for c in range(count))
        has = f"{what} has {count} channel{'s' * (count != 1)}" + (
            f" ({listed})" if self.channel_names else ""
        )
        if channel is not None:
            if in_channels != 1:
                raise ChannelChoiceError(
                    f"--channel picks one channel for a single-channel model, but the model "
                    f"takes {in_channels}; leave out --channel ({has})."
                )
            if not 0 <= channel < count:
                choices = " or ".join(f"--channel {c}" for c in range(count))
                raise ChannelChoiceError(f"--channel {channel}: {has}; pass {choices}.")
            return self.channel(channel)
        if in_channels == count:
            return self
        if in_channels == 1:
            choices = " or ".join(f"--channel {c}" for c in range(count))
            raise ChannelChoiceError(
                f"{has} and the model takes 1: pass {choices}."
            )
        raise ChannelChoiceError(
            f"{has} but the model takes {in_channels} input channels; use a model trained "
            f"on {count} channel{'s' * (count != 1)} or a store with {in_channels}."
        )


class ChannelChoiceError(ValueError):
    """The image's channels do not fit the model's input without a choice: one line."""
