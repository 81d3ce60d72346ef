"""NGFF ``labels/<name>`` images: corrections and predictions kept in the volume's own store.

Writing goes through ome-zarr-py (``write_labels``, ``write_multiscales_metadata``,
``write_label_metadata``) in the store's own zarr format and NGFF version, so
ome-zarr-py's Reader and napari-ome-zarr read what we write. Labels are single
resolution (level 0 only) with the image's spatial axes and level-0 scale;
viewers draw them over the image pyramid.

Replacing an existing ``labels/<name>`` (``write_labels``, ``save_corrections``)
goes through :func:`napari_finetune.io.staging.staged_replace`: the new image is
written completely beside the old one and swapped in by renames, so a crash or
an error mid-write never loses the old labels (its module doc says exactly what
is guaranteed). Nothing is written before every check has passed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

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
    _zarr_kind,
    list_labels,
    open_volume,
)

BACKGROUND_RGBA = [128, 128, 128, 255]
# Colours of the correction classes k >= 2 (channel k - 2), cycled.
CHANNEL_RGBA = [[255, 0, 255, 255], [0, 255, 255, 255], [255, 200, 0, 255], [0, 200, 0, 255]]


def _format(volume: Volume) -> Any:
    from ome_zarr.format import FormatV04, FormatV05

    return FormatV04() if volume.zarr_format == 2 else FormatV05()


def _check_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name.startswith(".") or name == "labels":
        raise VolumeError(
            f"{name!r} is not a usable labels name; use a plain name like 'corrections'."
        )


def _check_array(volume: Volume, array: Any, what: str) -> None:
    shape = tuple(int(s) for s in array.shape)
    if shape != volume.shape:
        raise VolumeError(
            f"{what} have shape {shape} but the image's level 0 is {volume.shape} "
            f"({volume.describe_axes()}); labels must cover the full-resolution image."
        )
    dtype = np.dtype(array.dtype)
    if not (np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        raise VolumeError(f"{what} have dtype {dtype}; labels must be integers (e.g. uint8).")


def _axes_meta(volume: Volume) -> list[dict[str, str]]:
    axes = []
    for a in volume.axes:
        entry = {"name": a, "type": "space"}
        if a in volume.axis_units:
            entry["unit"] = volume.axis_units[a]
        axes.append(entry)
    return axes


def _image_label(
    colors: list[dict[str, Any]] | None, properties: list[dict[str, Any]] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"source": {"image": "../../"}}
    if colors is not None:
        meta["colors"] = colors
    if properties is not None:
        meta["properties"] = properties
    return meta


def write_labels(
    path: str | os.PathLike,
    name: str,
    array: Any,
    colors: list[dict[str, Any]] | None = None,
    properties: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``array`` as ``labels/<name>`` of the image at ``path``, replacing it safely.

    Parameters
    ----------
    path : str or PathLike
        The OME-Zarr image (store root).
    name : str
        Labels name (``labels/<name>``).
    array : array-like
        Integer labels with the image's level-0 spatial shape (numpy, dask or zarr).
    colors, properties : list of dict, optional
        NGFF image-label ``colors`` (``{"label-value": v, "rgba": [r, g, b, a]}``)
        and ``properties`` (``{"label-value": v, ...}``).

    Returns
    -------
    Path
        The ``labels/<name>`` directory.
    """
    import dask.array as da
    import zarr
    from ome_zarr.writer import write_labels as ome_write_labels
    from zarr.storage import LocalStore

    _check_name(name)
    volume = open_volume(path)
    store = volume.path  # the image group (series 0 of a bioformats2raw store)
    _check_array(volume, array, f"labels {name!r}")
    check_writable(store, name)
    recover(store)

    data = array if isinstance(array, da.Array) else da.from_array(array)
    if data.dtype == np.bool_:
        data = data.astype(np.uint8)
    data = data.rechunk(volume.data.chunksize)  # same blocks as the image: cheap blockwise IO
    fmt = _format(volume)
    with staged_replace(store, name) as staging:
        group = zarr.open_group(store=LocalStore(staging), mode="w", zarr_format=fmt.zarr_format)
        ome_write_labels(
            data,
            group,
            name=name,
            scaler=None,  # its default (a deprecated Scaler) would build a pyramid
            scale_factors=[],
            fmt=fmt,
            axes=_axes_meta(volume),
            scale=dict(zip(volume.axes, volume.scale[0], strict=True)),
            label_metadata=_image_label(colors, properties),
        )
        _align(group[f"labels/{name}"], volume)
    return store / "labels" / name


def _transforms(volume: Volume) -> list[dict[str, Any]]:
    """Level-0 transforms of the image, so the labels overlay it in every viewer."""
    transforms: list[dict[str, Any]] = [{"type": "scale", "scale": list(volume.scale[0])}]
    if any(volume.translation[0]):
        transforms.append({"type": "translation", "translation": list(volume.translation[0])})
    return transforms


def _align(group: Any, volume: Volume) -> None:
    """Give a freshly written single-level labels image the image's level-0 transforms.

    ome-zarr-py's write_labels takes a scale only; an image with an origin
    offset (translation) would otherwise be overlaid shifted.
    """
    attrs = group.attrs.asdict()
    meta = attrs.get("ome", attrs)
    meta["multiscales"][0]["datasets"][0]["coordinateTransformations"] = _transforms(volume)
    group.attrs.update(attrs)


def correction_metadata(
    channel_names: list[str] | None, n_classes: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """NGFF colors and properties for correction values 1 (background) and k >= 2."""
    count = max(n_classes, len(channel_names or []))
    colors = [{"label-value": 1, "rgba": BACKGROUND_RGBA}]
    properties: list[dict[str, Any]] = [{"label-value": 1, "class": "background"}]
    for c in range(count):
        colors.append({"label-value": c + 2, "rgba": CHANNEL_RGBA[c % len(CHANNEL_RGBA)]})
        label = channel_names[c] if channel_names and c < len(channel_names) else f"channel {c}"
        properties.append({"label-value": c + 2, "class": label})
    return colors, properties


def save_corrections(
    path: str | os.PathLike,
    labels: Any,
    name: str = "corrections",
    channel_names: list[str] | None = None,
) -> Path:
    """Save painted corrections (0 unpainted, 1 background, k >= 2 channel k-2) into the store.

    Stored as the smallest unsigned integer type that holds them, with colours
    and class names in the NGFF image-label metadata; see the module doc for
    what survives a crash mid-write.
    """
    labels_arr = np.asarray(labels)
    if not (np.issubdtype(labels_arr.dtype, np.integer) or labels_arr.dtype == np.bool_):
        raise VolumeError(
            f"corrections have dtype {labels_arr.dtype}; paint them on an integer Labels layer."
        )
    top = int(labels_arr.max()) if labels_arr.size else 0
    if labels_arr.size and int(labels_arr.min()) < 0:
        raise VolumeError("corrections contain negative values; use 0 (unpainted), 1, 2, ...")
    dtype = np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.uint32
    colors, properties = correction_metadata(channel_names, max(top - 1, 0))
    return write_labels(path, name, labels_arr.astype(dtype, copy=False), colors, properties)


def load_corrections(path: str | os.PathLike, name: str = "corrections") -> np.ndarray:
    """Level 0 of ``labels/<name>`` as numpy; :class:`VolumeError` when absent or mismatched."""
    volume = open_volume(path)
    store = volume.path
    try:
        check_writable(store, None)
        recover(store)  # a save killed between its two renames leaves the copy aside
    except VolumeError:
        pass  # read-only store: nothing to recover into, read what is there
    if name not in list_labels(store):
        found = ", ".join(list_labels(store)) or "none"
        raise VolumeError(
            f"{store} has no labels/{name} (labels found: {found}); paint corrections and "
            "save them first, or pick one of the labels found."
        )
    labels = open_volume(store / "labels" / name)
    _check_array(volume, labels.data, f"labels/{name}")
    return np.asarray(labels.data)


def create_labels_array(
    path: str | os.PathLike,
    name: str,
    shape: tuple[int, ...],
    dtype: Any = np.uint8,
    chunks: tuple[int, ...] | None = None,
    colors: list[dict[str, Any]] | None = None,
    properties: list[dict[str, Any]] | None = None,
    staging: Path | None = None,
) -> Any:
    """Create an empty ``labels/<name>`` (NGFF metadata written) to fill block by block.

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
    from ome_zarr.writer import write_label_metadata, write_multiscales_metadata

    _check_name(name)
    volume = open_volume(path)
    store = volume.path  # the image group (series 0 of a bioformats2raw store)
    _check_array(volume, _Shape(shape, dtype), f"labels {name!r}")
    check_writable(store, name)
    recover(store)
    fmt = _format(volume)
    if staging is not None:
        import zarr
        from zarr.storage import LocalStore

        root = zarr.open_group(store=LocalStore(staging), mode="a", zarr_format=fmt.zarr_format)
        group = root.require_group("labels")
    else:
        group = labels_group(store)
        if _zarr_kind(store / "labels" / name) is not None:
            shutil.rmtree(store / "labels" / name)
    sub = group.create_group(name)
    kwargs: dict[str, Any] = {}
    if fmt.zarr_format == 2:
        kwargs["chunk_key_encoding"] = {"name": "v2", "separator": "/"}  # NGFF 0.4 wants "/"
    else:
        kwargs["dimension_names"] = list(volume.axes)
    array = sub.create_array(
        "s0",
        shape=tuple(int(s) for s in shape),
        dtype=dtype,
        chunks=tuple(chunks) if chunks else volume.data.chunksize,
        fill_value=0,
        **kwargs,
    )
    write_multiscales_metadata(
        sub,
        datasets=[{"path": "s0", "coordinateTransformations": _transforms(volume)}],
        fmt=fmt,
        axes=_axes_meta(volume),
        name=name,
    )
    write_label_metadata(group, name, fmt=fmt, **_image_label(colors, properties))
    if staging is None:  # a staged image is listed by staged_replace when swapped in
        list_name(group, name)
        refresh_consolidated(store)
    return array


class _Shape:
    """A shape and dtype that :func:`_check_array` can validate before anything exists."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
