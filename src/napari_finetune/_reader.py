"""npe2 reader: an OME-Zarr directory -> a multiscale image layer plus its labels layers.

No Qt here (import-linter enforces it): napari calls ``get_reader`` for every
path it is asked to open, so it must be cheap and must not raise for paths
that are not ours.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_finetune.arrays import VolumeArray

if TYPE_CHECKING:
    from napari_finetune.io.volume import Volume

logger = logging.getLogger(__name__)

# napari's layer data tuple: (data, layer keyword arguments, layer type); the data is a
# volume or a multiscale list of them, the keyword arguments whatever the layer takes.
LayerData = tuple[VolumeArray | Sequence[VolumeArray], dict[str, Any], str]
# What napari hands a reader: one path or several (npe2's PathOrPaths).
PathOrPaths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

# Labels up to this size are loaded into memory so the Labels layer can be painted
# on (napari cannot paint into dask arrays); bigger ones stay lazy and multiscale.
EDITABLE_LABELS_BYTES = 256 * 2**20
# Voxels read to set the image's contrast limits (napari would otherwise read it all).
CONTRAST_SAMPLE_VOXELS = 2**17
GENERIC_NAMES = {"", "image", "0"}


def _single_path(path: PathOrPaths) -> Path | None:
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return None
        path = path[0]
    try:
        return Path(path)  # type: ignore[arg-type]  # napari may pass anything; see except
    except TypeError:
        return None


def get_reader(path: PathOrPaths) -> Callable[[PathOrPaths], list[LayerData]] | None:
    """The reader for an OME-Zarr image directory (NGFF multiscales), else None.

    A directory named ``*.zarr`` (the manifest's pattern) or an empty one that is
    declined gets its reason as a warning, which napari shows as a notification:
    when the user picked this plugin for it, napari's own words are only that the
    plugin "refused the file".
    """
    p = _single_path(path)
    if p is None:
        return None
    reason = decline_reason(p)
    if reason is None:
        return read_ome_zarr
    if p.is_dir() and (p.name.endswith(".zarr") or not any(p.iterdir())):
        warnings.warn(f"napari-finetune cannot open {p.name}: {reason}", stacklevel=2)
    # napari then offers its other readers; the reason stays in the debug log too.
    logger.debug("napari-finetune does not read %s: %s", p, reason)
    return None


def decline_reason(path: Path) -> str | None:
    """Why ``path`` is not an OME-Zarr image this reader opens (None: it is).

    One line naming what is missing and what would open it: not a folder, an
    empty folder, no zarr metadata, a bare array, a group without NGFF
    ``multiscales``, or metadata that cannot be read.
    """
    from napari_finetune.io.ngff import zarr_kind

    if not path.is_dir():
        return "it is not a folder (an OME-Zarr image is a folder such as image.ome.zarr)"
    if not any(path.iterdir()):
        return "the folder is empty (no OME-Zarr image was written there)"
    kind = zarr_kind(path)
    if kind is None:
        return (
            "the folder has no zarr metadata (no zarr.json, .zgroup or .zattrs): it is not a "
            "zarr store; open its files with napari's own readers"
        )
    if kind == "array":
        return (
            "it is a bare zarr array, not an OME-Zarr image: open its parent folder, or save "
            "it as OME-Zarr (e.g. with ome-zarr-py's write_image)"
        )
    try:
        from napari_finetune.io.volume import open_location

        attrs = open_location(path.resolve()).root_attrs
    except Exception as exc:  # noqa: BLE001 - any unreadable store is a reason, not a crash
        return f"its metadata cannot be read ({type(exc).__name__}: {exc})"
    if "multiscales" not in attrs and "bioformats2raw.layout" not in attrs:
        return (
            "the zarr group has no NGFF 'multiscales' metadata: it is not an OME-Zarr image "
            "(a labels or plate group? open the image folder that holds it)"
        )
    return None


def layer_units(volume: Volume) -> tuple[str, ...] | None:
    """The store's units of the spatial axes, for the layer (None: some axis has none).

    napari compares the units of the layers it shows, and warns when they differ:
    a store in micrometers opened beside another reader's layers must say so.
    """
    units = [volume.axis_units.get(axis) for axis in volume.axes if axis in "zyx"]
    if not units or any(not unit for unit in units):
        return None
    return tuple(str(unit) for unit in units)


def contrast_limits(levels: Sequence[VolumeArray]) -> list[float]:
    """[low, high] from a strided subsample of the smallest level."""
    from napari_finetune.data.normalization import subsample

    values = subsample(levels[-1], max_voxels=CONTRAST_SAMPLE_VOXELS)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    return [low, high if high > low else low + 1.0]


def _layer_name(volume: Volume) -> str:
    if volume.name in GENERIC_NAMES:
        return volume.path.name.removesuffix(".zarr").removesuffix(".ome")
    return volume.name


def _labels_colormap(label_dir: Path) -> dict[int | None, list[float]] | None:
    """NGFF image-label colours as a napari direct colormap, or None without any."""
    from napari_finetune.io.volume import open_location

    meta = open_location(label_dir).root_attrs.get("image-label", {})
    colors: dict[int | None, list[float]] = {}
    for entry in meta.get("colors", []):
        value, rgba = entry.get("label-value"), entry.get("rgba")
        if isinstance(value, int) and rgba and len(rgba) == 4:
            colors[value] = [c / 255 for c in rgba]
    if not colors:
        return None
    colors.setdefault(0, [0.0, 0.0, 0.0, 0.0])
    colors[None] = [0.7, 0.7, 0.7, 1.0]  # values without a colour of their own
    return colors


def _labels_layer(store: Path, name: str, units: tuple[str, ...] | None = None) -> LayerData:
    from napari_finetune.io.volume import open_volume

    labels = open_volume(store / "labels" / name)
    level0 = labels.levels[0]
    if level0.nbytes <= EDITABLE_LABELS_BYTES:
        data: VolumeArray | Sequence[VolumeArray] = np.asarray(level0)
    else:
        data = labels.levels if len(labels.levels) > 1 else level0
    kwargs: dict[str, Any] = {
        "name": name,
        "scale": labels.scale[0],
        "translate": labels.translation[0],
        "metadata": {"ome_zarr_path": str(store), "labels_name": name},
        "axis_labels": tuple(labels.axes),
    }
    if isinstance(data, list):
        kwargs["multiscale"] = True
    if units is not None:  # the image's: labels share its space
        kwargs["units"] = units
    colormap = _labels_colormap(store / "labels" / name)
    if colormap is not None:
        kwargs["colormap"] = colormap
    return data, kwargs, "labels"


def read_ome_zarr(path: PathOrPaths) -> list[LayerData]:
    """Layer data for napari: the image (multiscale when the store has levels) and its labels."""
    from napari_finetune.io.volume import VolumeError, open_volume

    p = _single_path(path)
    if p is None:  # napari asks get_reader first, which takes one path only
        raise VolumeError(f"{path}: open one OME-Zarr directory at a time.")
    volume = open_volume(p)  # VolumeError (a clear message) for what we cannot use
    multiscale = len(volume.levels) > 1
    image_kwargs: dict[str, Any] = {
        "name": _layer_name(volume),
        "scale": volume.scale[0],
        "translate": volume.translation[0],
        "multiscale": multiscale,
        "contrast_limits": contrast_limits(volume.levels),
        "metadata": {"ome_zarr_path": str(volume.path)},
        # The store's axis names: napari's sliders say "z" (and "t"), not "-3".
        "axis_labels": tuple(volume.axes),
    }
    units = layer_units(volume)
    if units is not None:
        image_kwargs["units"] = units
    layers: list[LayerData] = [
        (volume.levels if multiscale else volume.data, image_kwargs, "image")
    ]
    for name in volume.label_names:
        try:
            layers.append(_labels_layer(volume.path, name, units))
        except VolumeError as exc:  # one damaged labels image should not hide the volume
            warnings.warn(f"labels/{name} skipped: {exc}", stacklevel=2)
    if "corrections" not in volume.label_names:
        layers.extend(_sibling_corrections(volume.path, units))
    return layers


def _sibling_corrections(store: Path, units: tuple[str, ...] | None) -> list[LayerData]:
    """The painting a read-only ``store`` had saved beside it (``<name>.corrections.ome.zarr``),
    as its ``corrections`` layer; none when there is none."""
    from napari_finetune.io.labels import find_corrections
    from napari_finetune.io.volume import VolumeError

    home = find_corrections(store)
    if home is None or home == store:
        return []
    try:
        data, kwargs, kind = _labels_layer(home, "corrections", units)
    except VolumeError as exc:
        warnings.warn(f"{home}/labels/corrections skipped: {exc}", stacklevel=2)
        return []
    # The store's, not the sibling's: the widget saves the painting by the store's rule
    # (into the store once it is writable again, else beside it).
    kwargs["metadata"] = {**kwargs["metadata"], "ome_zarr_path": str(store),
                          "corrections_image": str(home)}
    return [(data, kwargs, kind)]
