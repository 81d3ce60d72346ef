"""NGFF ``labels/<name>`` images: corrections and predictions kept in the volume's own store.

Writing goes through ome-zarr-py (``write_labels``, ``write_multiscales_metadata``,
``write_label_metadata``) in the store's own zarr format and NGFF version, so
ome-zarr-py's Reader and napari-ome-zarr read what we write. Labels are single
resolution (level 0 only) with the image's spatial axes and level-0 scale;
viewers draw them over the image pyramid.

What ``write_labels``/``save_corrections`` guarantee when they replace
``labels/<name>`` (the process may be killed at any instant):

1. Everything is validated (shape, dtype, write permission) before anything
   is written; the raw image is never opened for writing.
2. The new labels image is written completely into a staging folder inside the
   store (``.napari-finetune-staging-<pid>-<id>``), then a ``COMPLETE`` marker.
3. Only then is the old ``labels/<name>`` moved into the staging folder and the
   new one moved into its place: two directory renames on the same file system.
4. The old copy is deleted last.

So at every instant either ``labels/<name>`` is a complete image (old or new),
or, between the two renames of step 3, both complete copies are in the staging
folder; the next write or load (``_recover``) puts the new one, or failing that
the old one, back in place. Not covered: power loss before the OS flushed its
caches (nothing is fsynced), and two processes saving the same name at once.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from napari_finetune.io.volume import (
    Volume,
    VolumeError,
    _zarr_kind,
    check_store,
    list_labels,
    open_volume,
)

STAGING_PREFIX = ".napari-finetune-staging-"
BACKGROUND_RGBA = [128, 128, 128, 255]
# Colours of the correction classes k >= 2 (channel k - 2), cycled.
CHANNEL_RGBA = [[255, 0, 255, 255], [0, 255, 255, 255], [255, 200, 0, 255], [0, 200, 0, 255]]


def _format(volume: Volume) -> Any:
    from ome_zarr.format import FormatV04, FormatV05

    return FormatV04() if volume.zarr_format == 2 else FormatV05()


def _dir_writable(d: Path) -> bool:
    # A directory with no write bit for anyone was made read-only on purpose:
    # honour that even as root, for whom os.access always says "writable".
    if not d.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return False
    return os.access(d, os.W_OK | os.X_OK)


def check_writable(store: Path, name: str | None = None) -> None:
    """Raise :class:`VolumeError` unless the directories a labels write touches are writable."""
    dirs = [store, store / "labels"] + ([store / "labels" / name] if name else [])
    for d in dirs:
        if d.is_dir() and not _dir_writable(d):
            raise VolumeError(
                f"{store} is read-only ({d} is not writable), so labels cannot be saved "
                "into it; copy the store somewhere writable (or make it writable) and save again."
            )


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _recover(store: Path) -> None:
    """Finish or undo a labels swap that a killed process left half done (see module doc)."""
    for staging in store.glob(STAGING_PREFIX + "*"):
        try:
            pid = int(staging.name[len(STAGING_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and _pid_alive(pid):
            continue  # another live process is writing
        marker = staging / "COMPLETE"
        if marker.is_file():
            name = marker.read_text().strip()
            target = store / "labels" / name
            new, old = staging / "labels" / name, staging / "old"
            if not target.exists() and (new.is_dir() or old.is_dir()):
                os.rename(new if new.is_dir() else old, target)
                _list_name(_labels_group(store), name)
        shutil.rmtree(staging, ignore_errors=True)


def _labels_group(store: Path) -> Any:
    import zarr
    from zarr.storage import LocalStore

    root = zarr.open_group(store=LocalStore(store), mode="r+")
    return root.require_group("labels")


def _list_name(labels_group: Any, name: str) -> None:
    """Make ``name`` appear exactly once in the labels group's ``labels`` list."""
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.writer import add_metadata, get_metadata

    fmt = FormatV04() if labels_group.metadata.zarr_format == 2 else FormatV05()
    names = [n for n in get_metadata(labels_group).get("labels", []) if n != name] + [name]
    meta: dict[str, Any] = {"labels": names}
    if fmt.version != "0.4":
        meta = {"version": fmt.version, **meta}
    add_metadata(labels_group, meta, fmt=fmt)


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

    store = check_store(path)
    _check_name(name)
    volume = open_volume(store)
    _check_array(volume, array, f"labels {name!r}")
    check_writable(store, name)
    _recover(store)

    data = array if isinstance(array, da.Array) else da.from_array(array)
    if data.dtype == np.bool_:
        data = data.astype(np.uint8)
    data = data.rechunk(volume.data.chunksize)  # same blocks as the image: cheap blockwise IO
    fmt = _format(volume)
    staging = store / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    target = store / "labels" / name
    try:
        group = zarr.open_group(store=LocalStore(staging), mode="w", zarr_format=fmt.zarr_format)
        ome_write_labels(
            data,
            group,
            name=name,
            scaler=None,
            scale_factors=[],
            fmt=fmt,
            axes=_axes_meta(volume),
            scale=dict(zip(volume.axes, volume.scale[0], strict=True)),
            label_metadata=_image_label(colors, properties),
        )
        (staging / "COMPLETE").write_text(name)
        labels_group = _labels_group(store)
        if target.exists():
            os.rename(target, staging / "old")
        os.rename(staging / "labels" / name, target)
        _list_name(labels_group, name)
    except BaseException:
        if not target.exists() and (staging / "old").is_dir():
            os.rename(staging / "old", target)  # put the old labels back
        raise
    finally:
        # Never delete the only copy: the old one, if it could not be put back.
        if target.is_dir() or not (staging / "old").is_dir():
            shutil.rmtree(staging, ignore_errors=True)
    return target


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
    store = check_store(path)
    volume = open_volume(store)
    try:
        check_writable(store, None)
        _recover(store)  # a save killed between its two renames leaves the copy aside
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
) -> Any:
    """Create an empty ``labels/<name>`` (NGFF metadata written) to fill block by block.

    Unlike :func:`write_labels` this replaces an existing ``labels/<name>`` in
    place (the data arrive later, so there is nothing complete to swap in);
    use it for outputs that can be recomputed, such as predictions.

    Returns
    -------
    zarr.Array
        Level 0, opened for writing, filled with 0.
    """
    from ome_zarr.writer import write_label_metadata, write_multiscales_metadata

    store = check_store(path)
    _check_name(name)
    volume = open_volume(store)
    _check_array(volume, _Shape(shape, dtype), f"labels {name!r}")
    check_writable(store, name)
    _recover(store)
    fmt = _format(volume)
    labels_group = _labels_group(store)
    if _zarr_kind(store / "labels" / name) is not None:
        shutil.rmtree(store / "labels" / name)
    sub = labels_group.create_group(name)
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
        datasets=[{"path": "s0", "coordinateTransformations": [
            {"type": "scale", "scale": list(volume.scale[0])}]}],
        fmt=fmt,
        axes=_axes_meta(volume),
        name=name,
    )
    write_label_metadata(labels_group, name, fmt=fmt, **_image_label(colors, properties))
    _list_name(labels_group, name)
    return array


class _Shape:
    """A shape and dtype that :func:`_check_array` can validate before anything exists."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
