"""NGFF ``labels/<name>`` images: corrections and predictions kept in the volume's own store.

Labels are written in the store's own zarr format and NGFF version (metadata
through ome-zarr-py's writers), so ome-zarr-py's Reader, napari-ome-zarr and
ome-zarr-models read what we write. A labels image has the image's levels,
shapes and per-level transforms (:mod:`napari_finetune.io.pyramid`): level 0
is written chunk by chunk from the array given, then each smaller level from
the one above, so a big volume is never held in memory twice.

Replacing an existing ``labels/<name>`` (``write_labels``, ``save_corrections``)
goes through :func:`napari_finetune.io.staging.staged_replace`: the new image,
every level of it, is written completely beside the old one and swapped in by
renames, so a crash or an error mid-write never loses the old labels (its
module doc says exactly what is guaranteed). Nothing is written before every
check has passed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from napari_finetune import palette
from napari_finetune.arrays import VolumeArray
from napari_finetune.io import pyramid
from napari_finetune.io.ngff import zarr_kind
from napari_finetune.io.staging import (
    check_writable,
    labels_group,
    list_name,
    recover,
    refresh_consolidated,
    staged_replace,
)
from napari_finetune.io.volume import (
    Volume,
    VolumeError,
    list_labels,
    open_volume,
)

if TYPE_CHECKING:  # zarr is imported where a store is opened
    import zarr


def _check_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name.startswith(".") or name == "labels":
        raise VolumeError(
            f"{name!r} is not a usable labels name; use a plain name like 'corrections'."
        )


def _check_array(volume: Volume, array: VolumeArray | _Shape, what: str) -> None:
    shape = tuple(int(s) for s in array.shape)
    if shape != volume.shape:
        raise VolumeError(
            f"{what} have shape {shape} but the image's level 0 is {volume.shape} "
            f"({volume.describe_axes()}); labels must cover the full-resolution image."
        )
    dtype = np.dtype(array.dtype)
    if not (np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        raise VolumeError(f"{what} have dtype {dtype}; labels must be integers (e.g. uint8).")


def _image_label(
    colors: list[dict[str, Any]] | None, properties: list[dict[str, Any]] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"source": {"image": "../../"}}
    if colors is not None:
        meta["colors"] = colors
    if properties is not None:
        meta["properties"] = properties
    return meta


def _staging_labels(staging: Path, volume: Volume) -> zarr.Group:
    """The ``labels`` group of a staging folder (a zarr hierarchy of the store's format)."""
    import zarr
    from zarr.storage import LocalStore

    zarr_format: Literal[2, 3] = 2 if volume.zarr_format == 2 else 3
    root = zarr.open_group(store=LocalStore(staging), mode="a", zarr_format=zarr_format)
    return root.require_group("labels")


def write_labels(
    path: str | os.PathLike,
    name: str,
    array: VolumeArray,
    colors: list[dict[str, Any]] | None = None,
    properties: list[dict[str, Any]] | None = None,
    dtype: npt.DTypeLike | None = None,
) -> Path:
    """Write ``array`` as ``labels/<name>`` of the image at ``path``, replacing it safely.

    Every level of the image gets its labels level (see the module doc).

    Parameters
    ----------
    path : str or PathLike
        The OME-Zarr image (store root).
    name : str
        Labels name (``labels/<name>``).
    array : array-like
        Integer labels with the image's level-0 spatial shape (numpy, dask or
        zarr); read one chunk at a time.
    colors, properties : list of dict, optional
        NGFF image-label ``colors`` (``{"label-value": v, "rgba": [r, g, b, a]}``)
        and ``properties`` (``{"label-value": v, ...}``).
    dtype : dtype, optional
        Stored integer type (each chunk is cast on its way); default the
        array's own (uint8 for bool).

    Returns
    -------
    Path
        The ``labels/<name>`` directory.
    """
    _check_name(name)
    volume = open_volume(path, keep_axes=True)  # a time series has labels per time point
    store = volume.path  # the image group (series 0 of a bioformats2raw store)
    _check_array(volume, array, f"labels {name!r}")
    check_writable(store, name)
    recover(store)

    if dtype is None:
        dtype = np.uint8 if np.dtype(array.dtype) == np.bool_ else array.dtype
    dtype = np.dtype(dtype)
    # The image's blocks (viewers fetch matching tiles), split if they are huge.
    chunks = pyramid.bounded_chunks(tuple(int(c) for c in volume.data.chunksize))
    with staged_replace(store, name) as staging:
        group = pyramid.create_pyramid(
            _staging_labels(staging, volume), name, volume, dtype, chunks,
            _image_label(colors, properties),
        )
        pyramid.write_level0(pyramid.level_array(group, "s0"), array)
        pyramid.fill_pyramid(group)
    return store / "labels" / name


def prediction_metadata(
    channel: str, color: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """NGFF colors and properties of one channel's prediction mask: value 1 is ``channel``,
    in ``color`` (``#rrggbb``, the checkpoint's or the palette's, as napari shows it)."""
    return ([{"label-value": 1, "rgba": palette.rgba(color)}],
            [{"label-value": 1, "class": channel}])


def correction_metadata(
    channel_names: list[str] | None, n_classes: int, channel_colors: list[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """NGFF colors and properties for correction values 1 (background) and k >= 2.

    The colours are :mod:`napari_finetune.palette`'s (``channel_colors``, e.g. a
    checkpoint's saved ones, for the first channels), as napari shows them.
    """
    count = max(n_classes, len(channel_names or []))
    given = list(channel_colors or [])
    hexes = given[:count] + palette.default_colors(count)[len(given):]
    colors = [{"label-value": 1, "rgba": palette.rgba(palette.BACKGROUND)}]
    properties: list[dict[str, Any]] = [{"label-value": 1, "class": "background"}]
    for c in range(count):
        colors.append({"label-value": c + 2, "rgba": palette.rgba(hexes[c])})
        label = channel_names[c] if channel_names and c < len(channel_names) else f"channel {c}"
        properties.append({"label-value": c + 2, "class": label})
    return colors, properties


def save_corrections(
    path: str | os.PathLike,
    labels: VolumeArray,
    name: str = "corrections",
    channel_names: list[str] | None = None,
    channel_colors: list[str] | None = None,
) -> Path:
    """Save painted corrections (0 unpainted, 1 background, k >= 2 channel k-2) into the store.

    Stored as the smallest unsigned integer type that holds them, with colours
    and class names in the NGFF image-label metadata, on every level of the
    image's pyramid; see the module doc for what survives a crash mid-write.
    ``channel_colors`` (``#rrggbb``, e.g. a checkpoint's saved ones) colour the
    first channels; the others take :mod:`napari_finetune.palette`'s.
    ``labels`` may be numpy (napari's layer data), dask or zarr: a lazy array
    is never loaded whole (its range is found block by block), and each chunk
    is cast to the stored type on its way to disk, without a full-size copy.
    """
    import dask.array as da

    from napari_finetune.io.pending import wait_written

    wait_written(path)  # the sample's store may still be on its way (io/pending.py)
    array = labels if hasattr(labels, "dtype") and hasattr(labels, "shape") else (
        np.asarray(labels))
    if not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise VolumeError(
            f"corrections have dtype {array.dtype}; paint them on an integer Labels layer."
        )
    if isinstance(array, np.ndarray):
        low, top = (int(array.min()), int(array.max())) if array.size else (0, 0)
    else:
        lazy = array if isinstance(array, da.Array) else da.from_array(array)
        low, top = (int(v) for v in da.compute(lazy.min(), lazy.max())) if lazy.size else (0, 0)
    if low < 0:
        raise VolumeError("corrections contain negative values; use 0 (unpainted), 1, 2, ...")
    dtype = np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.uint32
    colors, properties = correction_metadata(channel_names, max(top - 1, 0), channel_colors)
    return write_labels(path, name, array, colors, properties, dtype=dtype)


def load_corrections(path: str | os.PathLike, name: str = "corrections") -> np.ndarray:
    """Level 0 of ``labels/<name>`` as numpy; :class:`VolumeError` when absent or mismatched.

    The corrections of a read-only store are read from its sibling
    (:func:`find_corrections`) when that is where they were saved.
    """
    volume = open_volume(path, keep_axes=True)  # a time series has labels per time point
    store = volume.path
    try:
        check_writable(store, None)
        recover(store)  # a save killed between its two renames leaves the copy aside
    except VolumeError:
        pass  # read-only store: nothing to recover into, read what is there
    if name == "corrections" and (home := find_corrections(store)) is not None:
        store = home  # a read-only store's painting went to its sibling
    if name not in list_labels(store):
        found = ", ".join(list_labels(store)) or "none"
        raise VolumeError(
            f"{store} has no labels/{name} (labels found: {found}); paint corrections and "
            "save them first, or pick one of the labels found."
        )
    labels = open_volume(store / "labels" / name, keep_axes=True)
    _check_array(volume, labels.data, f"labels/{name}")
    return np.asarray(labels.data)


def create_labels_array(
    path: str | os.PathLike,
    name: str,
    shape: tuple[int, ...],
    dtype: npt.DTypeLike = np.uint8,
    chunks: tuple[int, ...] | None = None,
    colors: list[dict[str, Any]] | None = None,
    properties: list[dict[str, Any]] | None = None,
    staging: Path | None = None,
) -> zarr.Array:
    """Create an empty ``labels/<name>`` (every level, NGFF metadata written) to fill by blocks.

    The caller writes level 0 (the array returned) and then calls
    :func:`~napari_finetune.io.pyramid.fill_pyramid` on its group
    (``zarr.open_group(<labels image>)``) so the smaller levels follow.

    Without ``staging`` this replaces an existing ``labels/<name>`` in place
    and lists it at once. With ``staging`` (a folder yielded by
    :func:`~napari_finetune.io.staging.staged_replace`) the image is created
    as ``<staging>/labels/<name>``: nothing in the store changes, and the old
    labels stay until the caller's ``staged_replace`` swaps the complete new
    one in (predictions use this, so a failed run keeps the previous result).

    Returns
    -------
    zarr.Array
        Level 0, opened for writing, filled with 0.
    """
    _check_name(name)
    volume = open_volume(path, keep_axes=True)  # a time series has labels per time point
    store = volume.path  # the image group (series 0 of a bioformats2raw store)
    _check_array(volume, _Shape(shape, dtype), f"labels {name!r}")
    check_writable(store, name)
    recover(store)
    if staging is not None:
        parent = _staging_labels(staging, volume)
    else:
        parent = labels_group(store)
        if zarr_kind(store / "labels" / name) is not None:
            shutil.rmtree(store / "labels" / name)
    level0_chunks = pyramid.bounded_chunks(
        tuple(chunks) if chunks else tuple(int(c) for c in volume.data.chunksize)
    )
    group = pyramid.create_pyramid(
        parent, name, volume, dtype, level0_chunks, _image_label(colors, properties)
    )
    if staging is None:  # a staged image is listed by staged_replace when swapped in
        list_name(parent, name)
        refresh_consolidated(store)
    return pyramid.level_array(group, "s0")


class _Shape:
    """A shape and dtype that :func:`_check_array` can validate before anything exists."""

    def __init__(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


# -- corrections of a store that cannot take them --------------------------------------------
SIBLING_SUFFIX = ".corrections.ome.zarr"


def corrections_sibling(store: str | os.PathLike) -> Path:
    """Where the corrections of a read-only ``store`` go: ``<name>.corrections.ome.zarr``
    beside it (``cells.ome.zarr`` -> ``cells.corrections.ome.zarr``)."""
    path = Path(store)
    name = path.name
    for suffix in (".ome.zarr", ".zarr"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return path.parent / f"{name}{SIBLING_SUFFIX}"


def takes_corrections(store: str | os.PathLike) -> bool:
    """Whether ``labels/corrections`` can be written into ``store`` (its folders writable)."""
    try:
        check_writable(Path(store), "corrections")
    except VolumeError:
        return False
    return True


def corrections_image(store: str | os.PathLike) -> Path:
    """The OME-Zarr image whose ``labels/corrections`` holds ``store``'s painting: the store
    itself when it can take them, else its sibling (:func:`corrections_sibling`)."""
    return Path(store) if takes_corrections(store) else corrections_sibling(store)


def find_corrections(store: str | os.PathLike) -> Path | None:
    """The image holding ``store``'s saved corrections, wherever they went (None: none yet).

    The place a save goes now (:func:`corrections_image`) comes first; the other
    one is read when only it has them (a store made read-only, or writable, since).
    """
    first = corrections_image(store)
    for image in dict.fromkeys((first, Path(store), corrections_sibling(store))):
        if zarr_kind(image) is not None and "corrections" in list_labels(image):
            return image
    return None


def ensure_sibling_image(store: str | os.PathLike) -> Path:
    """Create ``store``'s sibling (:func:`corrections_sibling`) when it is not there yet:
    an OME-Zarr image of the store's levels, axes, scales and zarr format, so that its
    ``labels/corrections`` overlay the store's image in any viewer.

    Its image arrays are left at their fill value (zarr stores no such chunk): the
    sibling costs the corrections' bytes and a few metadata files. It is built in a
    folder beside and renamed into place, so a half-made sibling is never found.
    """
    import zarr
    from ome_zarr.writer import write_multiscales_metadata
    from zarr.storage import LocalStore

    from napari_finetune.io.ngff import ngff_format

    sibling = corrections_sibling(store)
    if zarr_kind(sibling) is not None:
        return sibling
    volume = open_volume(store, keep_axes=True)  # the labels' axes: time kept, no channel
    fmt = ngff_format(volume.zarr_format)
    partial = sibling.with_name(f".{sibling.name}.partial")
    if partial.exists():
        shutil.rmtree(partial)  # a creation that died half-way
    root = zarr.open_group(store=LocalStore(partial), mode="w", zarr_format=fmt.zarr_format)
    kwargs: dict[str, Any] = {}
    if fmt.zarr_format == 2:
        kwargs["chunk_key_encoding"] = {"name": "v2", "separator": "/"}  # NGFF 0.4 wants "/"
    else:
        kwargs["dimension_names"] = list(volume.axes)
    chunks = pyramid.bounded_chunks(tuple(int(c) for c in volume.data.chunksize))
    datasets = []
    for level, data in enumerate(volume.levels):
        shape = tuple(int(s) for s in data.shape)
        root.create_array(f"s{level}", shape=shape, dtype=np.uint8, fill_value=0,
                          chunks=tuple(min(c, s) for c, s in zip(chunks, shape, strict=True)),
                          **kwargs)
        datasets.append({"path": f"s{level}",
                         "coordinateTransformations": pyramid.level_transforms(volume, level)})
    write_multiscales_metadata(root, datasets=datasets, fmt=fmt, axes=pyramid.axes_meta(volume),
                               name=f"{volume.name} corrections")
    os.replace(partial, sibling)
    return sibling
