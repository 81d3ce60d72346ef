"""Open an OME-Zarr image (NGFF 0.4 on zarr v2, NGFF 0.5 on zarr v3) as a lazy volume.

Parsing goes through ome-zarr-py (``parse_url`` + ``Reader``), which validates
the axes and hands back one dask array per resolution level; this module only
turns that into the small :class:`Volume` the rest of the package uses and
turns every way a path can be wrong into a one-line :class:`VolumeError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask.array as da

from napari_finetune.arrays import AxesImage
from napari_finetune.io.ngff import ngff_format, zarr_format_of, zarr_kind
from napari_finetune.io.ome_zarr_log import quiet_ome_zarr

if TYPE_CHECKING:  # ome-zarr-py is imported where a store is opened (it ships no types)
    from ome_zarr.io import ZarrLocation

SPATIAL_AXES = ("z", "y", "x")
# Axes that may be present with size 1 and are squeezed away.
SQUEEZABLE_AXES = ("t", "c")


# NGFF space units in nanometers, for a voxel size whose axes use different units.
_NANOMETERS = {"angstrom": 0.1, "nanometer": 1.0, "micrometer": 1e3, "millimeter": 1e6,
               "centimeter": 1e7, "meter": 1e9}


class VolumeError(ValueError):
    """A path is not a usable volume, or its labels cannot be written: says why and the fix."""


@dataclass
class Volume:
    """A multiscale OME-Zarr image with singleton t/c axes squeezed away.

    Attributes
    ----------
    levels : list of dask.array.Array
        Lazy arrays, level 0 (full resolution) first, spatial axes only.
    axes : list of str
        Axis names of ``levels`` (``["z", "y", "x"]`` or ``["y", "x"]``).
    scale, translation : list of list of float
        Per level, per axis, from the NGFF ``coordinateTransformations``.
    path : Path
        The store's root directory.
    name : str
        The multiscales name, or the directory name without ``.zarr``.
    label_names : list of str
        Names listed in the store's ``labels`` group that exist.
    ngff_version : str
        "0.4" or "0.5"; labels are written in the same version.
    zarr_format : int
        2 or 3.
    full_axes : list of str
        The axes as stored, before squeezing (labels are written with ``axes``).
    axis_units : dict
        Units of the spatial axes, when the store records them.
    image : AxesImage, optional
        Level 0 with its time points and channels, opened with ``keep_axes``
        (:attr:`input`); ``levels`` then keep a time axis (the labels have it)
        but no channel axis (labels have one value per voxel, not per channel).
        Its ``channel_names`` are the store's ``omero`` channel labels.
    """

    levels: list[da.Array]
    axes: list[str]
    scale: list[list[float]]
    path: Path
    name: str
    label_names: list[str] = field(default_factory=list)
    translation: list[list[float]] = field(default_factory=list)
    ngff_version: str = "0.5"
    zarr_format: int = 3
    full_axes: list[str] = field(default_factory=list)
    axis_units: dict[str, str] = field(default_factory=dict)
    image: AxesImage | None = None

    @property
    def data(self) -> da.Array:
        """Level 0 (full resolution)."""
        return self.levels[0]

    @property
    def input(self) -> AxesImage:
        """Level 0 with its axes named: channels and time points included when kept."""
        return self.image if self.image is not None else AxesImage(self.data, "".join(self.axes))

    @property
    def spatial_axes(self) -> list[str]:
        """``axes`` without a time axis."""
        return [a for a in self.axes if a in SPATIAL_AXES]

    @property
    def ndim(self) -> int:
        """Number of spatial axes."""
        return len(self.spatial_axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.levels[0].shape)

    def describe_axes(self) -> str:
        """``"ZYX"`` or ``"YX"``."""
        return "".join(self.axes).upper()

    @property
    def voxel_size(self) -> tuple[float, ...] | None:
        """Level 0's voxel size per spatial axis, from the NGFF scale; None when unknown.

        Unknown: a scale of 1 on every axis without units, which is what a writer
        given no scale stores (NGFF requires one). Axes in different units (z in
        micrometer, y and x in nanometer) are converted to nanometers.
        """
        spatial = [i for i, a in enumerate(self.axes) if a in SPATIAL_AXES]
        scale = [float(s) for i, s in enumerate(self.scale[0] if self.scale else [])
                 if i in spatial]
        if len(scale) != self.ndim or (all(s == 1.0 for s in scale) and not self.axis_units):
            return None
        units = [self.axis_units.get(axis) for axis in self.spatial_axes]
        if len(set(units)) > 1 and all(u in _NANOMETERS for u in units):
            scale = [s * _NANOMETERS[str(u)] for s, u in zip(scale, units, strict=True)]
        return tuple(scale) if all(s > 0 for s in scale) else None


def require_ndim(volume: Volume, ndim: int) -> Volume:
    """Return ``volume`` if it has ``ndim`` spatial axes, else raise :class:`VolumeError`."""
    if volume.ndim != ndim:
        wanted = "3D (ZYX)" if ndim == 3 else "2D (YX)" if ndim == 2 else f"{ndim}D"
        hint = (
            "open a volume with a z axis (a stack of slices)"
            if ndim == 3
            else "open a single 2D image"
        )
        raise VolumeError(
            f"{volume.path} is {volume.ndim}D ({volume.describe_axes()}) but a {wanted} "
            f"volume is required; {hint}."
        )
    return volume


def check_store(path: str | os.PathLike) -> Path:
    """The store's directory as a resolved Path, or :class:`VolumeError` if it is not zarr."""
    p = Path(path).expanduser()
    if not p.exists():
        raise VolumeError(
            f"{p} does not exist; check the path (an OME-Zarr volume is a directory, "
            "usually ending in .zarr or .ome.zarr)."
        )
    if not p.is_dir() or zarr_kind(p) is None:
        raise VolumeError(
            f"{p} is not a zarr store (no zarr.json, .zgroup or .zarray in it); open an "
            "OME-Zarr directory, or convert the file first (e.g. with bioformats2raw or "
            "ome_zarr.writer.write_image)."
        )
    return p.resolve()


def open_location(p: Path) -> ZarrLocation:
    """ome-zarr-py's ZarrLocation for ``p``, read-only, in the store's own NGFF format."""
    from ome_zarr.io import parse_url

    # Asking for the right format up front avoids ome-zarr-py's "version mismatch"
    # warning (and a second metadata read) for every NGFF 0.4 store.
    loc = parse_url(str(p), mode="r", fmt=ngff_format(zarr_format_of(p)))
    if loc is None:  # pragma: no cover - check_store has seen zarr metadata
        raise VolumeError(f"{p} could not be opened as zarr; check that it is not damaged.")
    return loc


def compose_transforms(
    transforms: list[dict[str, Any]] | None, ndim: int
) -> tuple[list[float], list[float]]:
    """Compose a list of NGFF scale/translation transforms into (scale, translation)."""
    scale, translation = [1.0] * ndim, [0.0] * ndim
    for t in transforms or []:
        if t.get("type") == "scale" and "scale" in t:
            s = [float(v) for v in t["scale"]]
            scale = [a * b for a, b in zip(scale, s, strict=False)]
            translation = [a * b for a, b in zip(translation, s, strict=False)]
        elif t.get("type") == "translation" and "translation" in t:
            translation = [
                a + float(b) for a, b in zip(translation, t["translation"], strict=False)
            ]
    return scale, translation


def list_labels(path: str | os.PathLike) -> list[str]:
    """Names in the store's ``labels`` group that exist on disk (in the listed order)."""
    p = check_store(path)
    labels_dir = p / "labels"
    if zarr_kind(labels_dir) != "group":
        return []
    attrs = open_location(labels_dir).root_attrs
    names = attrs.get("labels", [])
    return [n for n in dict.fromkeys(names) if zarr_kind(labels_dir / str(n)) == "group"]


def open_volume(
    path: str | os.PathLike, ndim: int | None = None, *, keep_axes: bool = False
) -> Volume:
    """Open an OME-Zarr image lazily.

    Parameters
    ----------
    path : str or PathLike
        The image group (the store root, or e.g. ``store.zarr/labels/name``).
    ndim : int, optional
        Require this many spatial axes (3 for ZYX) after squeezing t/c.
    keep_axes : bool
        Keep time points and channels (more than one of either): the image goes
        to :attr:`Volume.image`, the levels keep the time axis and take the first
        channel (the labels' geometry). Without it such a store is refused.

    Raises
    ------
    VolumeError
        Missing path, not zarr, zarr without NGFF multiscales, more than one
        channel or time point (without ``keep_axes``), or the wrong dimensionality.
    """
    from ome_zarr.reader import Multiscales, Reader

    from napari_finetune.io.pending import wait_written

    wait_written(path)  # the sample's store may still be on its way (io/pending.py)
    p = check_store(path)
    is_array = zarr_kind(p) == "array"
    attrs = {} if is_array else (loc := open_location(p)).root_attrs
    if "bioformats2raw.layout" in attrs and zarr_kind(p / "0") == "group":
        # bioformats2raw output: the image is series 0
        return open_volume(p / "0", ndim, keep_axes=keep_axes)
    if "plate" in attrs or "well" in attrs:
        raise VolumeError(
            f"{p} is an HCS {'plate' if 'plate' in attrs else 'well'}, not one image; open "
            "one field of it (e.g. <plate>/A/1/0)."
        )
    if "multiscales" not in attrs:
        what = "a zarr array" if is_array else "a zarr group"
        raise VolumeError(
            f"{p} is {what} without OME-NGFF 'multiscales' metadata (a plain zarr); write "
            "it as OME-Zarr (e.g. ome_zarr.writer.write_image) so its axes and scale are known."
        )
    # Reader logs (not raises) what it can live with (e.g. labels without a "source"):
    # to our debug log, on this thread only; nobody's logger levels change.
    try:
        with quiet_ome_zarr():
            # A labels image lists its parent image first ("source"): take our own node.
            node = next((n for n in Reader(loc)() if n.zarr == loc), None)
    except (ValueError, KeyError, TypeError) as exc:
        raise VolumeError(f"{p} has invalid OME-NGFF metadata ({exc}); fix or rewrite it.") from exc
    if node is None or node.first(Multiscales) is None or not node.data:
        raise VolumeError(f"{p} has OME-NGFF metadata but no image datasets; rewrite it.")

    multiscale = attrs["multiscales"][0]
    raw_axes = node.metadata.get("axes") or multiscale.get("axes") or []
    full_axes = [a["name"] if isinstance(a, dict) else str(a) for a in raw_axes]
    units = {
        a["name"]: a["unit"] for a in raw_axes if isinstance(a, dict) and a.get("unit")
    }
    shape0 = tuple(int(s) for s in node.data[0].shape)
    if len(full_axes) != len(shape0):  # NGFF 0.1/0.2 had no axes: assume trailing zyx
        full_axes = ["t", "c", "z", "y", "x"][-len(shape0):]

    keep: list[int] = []
    kept_image: list[int] = []  # the axes of Volume.image: the labels' and a channel axis
    for i, (axis, size) in enumerate(zip(full_axes, shape0, strict=True)):
        if axis in SPATIAL_AXES or (keep_axes and axis == "t" and size != 1):
            keep.append(i)
            kept_image.append(i)
        elif keep_axes and axis == "c" and size != 1:
            kept_image.append(i)
        elif size != 1:
            kind = {"c": "channels", "t": "time points"}.get(axis, f"entries on axis {axis!r}")
            raise VolumeError(
                f"{p} has {size} {kind} (axes {''.join(full_axes).upper()}, shape {shape0}) "
                "but napari-finetune's reader opens one channel of one time point; open it "
                "with napari-ome-zarr (the dock widget works on its channels and time "
                "points), use napari-finetune train/predict on the command line, or save "
                "the channel (and time point) to correct as its own OME-Zarr image."
            )
    index = tuple(slice(None) if i in keep else 0 for i in range(len(shape0)))

    # A multiscales-level transform applies after each dataset's own.
    outer = multiscale.get("coordinateTransformations")
    per_level = node.metadata.get("coordinateTransformations") or [None] * len(node.data)
    levels, scales, translations = [], [], []
    for data, transforms in zip(node.data, per_level, strict=False):
        scale, trans = compose_transforms((transforms or []) + (outer or []), len(shape0))
        levels.append(data[index] if len(keep) < len(shape0) else data)
        scales.append([scale[i] for i in keep])
        translations.append([trans[i] for i in keep])

    name = multiscale.get("name") or p.name.removesuffix(".zarr").removesuffix(".ome")
    image = None
    if len(kept_image) > len(keep) or any(full_axes[i] == "t" for i in keep):
        level0 = node.data[0] if isinstance(node.data[0], da.Array) else da.asarray(node.data[0])
        image = AxesImage(level0[tuple(slice(None) if i in kept_image else 0
                                       for i in range(len(shape0)))],
                          "".join(full_axes[i] for i in kept_image),
                          tuple(_channel_names(attrs)))
    volume = Volume(
        levels=[lv if isinstance(lv, da.Array) else da.asarray(lv) for lv in levels],
        axes=[full_axes[i] for i in keep],
        scale=scales,
        translation=translations,
        path=p,
        name=str(name),
        label_names=list_labels(p),
        ngff_version=loc.fmt.version,
        zarr_format=int(loc.fmt.zarr_format),
        full_axes=full_axes,
        axis_units={k: v for k, v in units.items() if k in SPATIAL_AXES},
        image=image,
    )
    if volume.ndim not in (2, 3):
        raise VolumeError(
            f"{p} has spatial axes {volume.describe_axes()}; napari-finetune needs YX or ZYX."
        )
    if ndim is not None:
        require_ndim(volume, ndim)
    return volume


def _channel_names(attrs: dict[str, Any]) -> list[str]:
    """The channels' labels in the store's ``omero`` metadata (NGFF 0.5: inside ``ome``)."""
    omero = attrs.get("omero") or (attrs.get("ome") or {}).get("omero") or {}
    channels = omero.get("channels") if isinstance(omero, dict) else None
    return [str(c.get("label", "")) for c in channels or [] if isinstance(c, dict)]
