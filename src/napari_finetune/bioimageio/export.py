"""Write a checkpoint as a bioimage.io model package (format 0.5, ``.zip``).

The package holds ``pytorch_state_dict`` weights (architecture: the
checkpoint's factory as an ``ArchitectureFromLibraryDescr``), ``torchscript``
weights (for consumers without napari-finetune), test tensors cut from the
user's own volume, the channel names, the normalisation as preprocessing, a
sigmoid as postprocessing (napari-finetune's models return logits), a README
with the run record, and cite / licence / author fields.

The expected test output is computed the way napari-finetune predicts (its own
normalisation, model, sigmoid), so ``bioimageio.core.test_model``, which runs
bioimage.io's preprocessing instead, checks that the two agree.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
import torch

from napari_finetune.arrays import SPATIAL, AxesImage, ChannelChoiceError, VolumeArray
from napari_finetune.bioimageio import require
from napari_finetune.data.normalization import intensity_ranges, normalize_channels
from napari_finetune.devices import check_model_fits_image, model_in_channels
from napari_finetune.model.architectures import Trust
from napari_finetune.model.atomic_write import write_atomically
from napari_finetune.model.checkpoint import Checkpoint, load_checkpoint
from napari_finetune.model.geometry import shape_multiple
from napari_finetune.predict.volume import predict_batch
from napari_finetune.voxel_size import for_axes, trained_voxel_size

DEFAULT_LICENSE = "CC-BY-4.0"
# Test tensors: at most this big (a few MB in the package), cut from the volume's centre.
DEFAULT_TILE = {3: (32, 64, 64), 2: (256, 256)}
# The papers behind napari-finetune's UNet, cited when the user names none.
UNET_CITES = {
    2: [("Ronneberger et al. (2015) U-Net", "10.1007/978-3-319-24574-4_28")],
    3: [("Cicek et al. (2016) 3D U-Net", "10.1007/978-3-319-46723-8_49")],
}


class BioimageioExportError(ValueError):
    """The checkpoint, the volume or an option cannot make a valid package."""


class ExportsCheckpoint(Protocol):
    """Anything with ``export(path)`` writing a checkpoint (a running ``Finetuner``)."""

    def export(self, path: str | os.PathLike) -> os.PathLike: ...


def export_bioimageio(
    source: Checkpoint | ExportsCheckpoint | str | os.PathLike,
    out_path: str | os.PathLike,
    volume: VolumeArray | AxesImage | str | os.PathLike,
    *,
    name: str | None = None,
    description: str | None = None,
    authors: Sequence[str] | None = None,
    license: str = DEFAULT_LICENSE,
    cite: Sequence[tuple[str, str]] | None = None,
    tile_shape: Sequence[int] | None = None,
    trust: Trust = None,
    check: bool = True,
    metadata: Mapping[str, Any] | None = None,
    channel: int | None = None,
) -> Path:
    """Write ``source`` as a bioimage.io model package at ``out_path``.

    Parameters
    ----------
    source : Checkpoint, Finetuner or path-like
        A loaded checkpoint, anything with ``export(path)`` (the trainer: its
        current weights are exported first), or a checkpoint / package path.
    out_path : path-like
        The ``.zip`` to write (atomically).
    volume : array-like, AxesImage or path-like
        The image the test tensors are cut from: a ZYX / YX array (numpy, zarr,
        dask), an :class:`~napari_finetune.arrays.AxesImage` or an OME-Zarr store
        (its level 0). A model of several input channels gets a test tensor of all
        of them, each normalised on its own; a time series gives its middle time
        point (the model is spatial: one time point at a time).
    name, description : str, optional
        Defaults: the checkpoint's file name, and a sentence on how it was made.
    authors : sequence of str, optional
        Default: the authors of an imported bioimage.io package, else the user's login.
    license : str
        SPDX identifier (default ``CC-BY-4.0``).
    cite : sequence of (text, DOI or URL), optional
        Default: the imported package's citations, else the U-Net paper.
    tile_shape : sequence of int, optional
        Spatial shape of the test tensors (default at most 32x64x64 / 256x256),
        rounded down to the model's multiple.
    trust : str or collection of str, optional
        Passed to ``load_checkpoint`` when ``source`` is a path.
    check : bool
        Run ``bioimageio.core.test_model`` on the written package (offline).
    metadata : mapping, optional
        Entries that replace the checkpoint's in the package (the instance
        roles edited in the widget, which the trainer's or file's metadata
        does not hold); plain types only.
    channel : int, optional
        For a single-channel model and a volume with several channels: the
        channel the test tensors are cut from. Default: the one the checkpoint
        records its run trained on (by name, else by index), if it records one.

    Returns
    -------
    pathlib.Path
        The written package.

    Raises
    ------
    BioimageioExportError
        One line: what cannot be written, and how to fix it.
    """
    out_path = Path(out_path)
    require("bioimageio.spec", BioimageioExportError, "writing a bioimage.io package")
    if check:
        require("bioimageio.core", BioimageioExportError, "testing a bioimage.io package")
    from napari_finetune.bioimageio.describe import PackageFields, build_description

    if out_path.suffix != ".zip":
        raise BioimageioExportError(f"{out_path}: a bioimage.io package is a .zip; name it *.zip")
    if not out_path.parent.is_dir():
        raise BioimageioExportError(f"cannot write {out_path}: {out_path.parent} does not exist")
    with tempfile.TemporaryDirectory(prefix="napari-finetune-bioimageio-") as tmp:
        folder = Path(tmp)
        ckpt = _as_checkpoint(source, folder, trust)
        if metadata:
            ckpt = replace(ckpt, metadata={**ckpt.metadata, **metadata})
        image, volume_name, scale, units = _image_of(volume, ckpt, channel)
        ndim = len(image.spatial_shape)
        trained = for_axes(trained_voxel_size(ckpt.metadata), ndim)
        if scale is None and trained is not None:  # an array: the voxel size trained at
            scale = list(trained)
        check_model_fits_image(ckpt.model, image.spatial_shape)
        axes = "zyx"[-ndim:]
        raw = _test_input(image, ckpt.model, tile_shape)  # (C, *tile)
        # napari-finetune's own prediction of the tile: test_model compares bioimage.io's to it.
        expected = predict_batch(
            ckpt.model, normalize_channels(raw, intensity_ranges(
                AxesImage(raw, "c" + axes), ckpt.normalization))[None], "cpu", channels=True,
        )[0]
        np.save(folder / "input.npy", raw[None])
        np.save(folder / "output.npy", expected[None].astype(np.float32))
        provenance = ckpt.metadata.get("bioimageio") or {}
        fields = PackageFields(
            name=_name(name, ckpt),
            description=description or _description(ckpt, volume_name),
            authors=list(authors or provenance.get("authors") or [_login()]),
            license=license,
            cite=_cites(cite, provenance, ndim),
            axes=axes,
            scale=scale,
            units=units,
            input_channels=_input_channels(ckpt, image),
        )
        try:
            descr = build_description(ckpt, folder, fields, raw.shape[1:],
                                      shape_multiple(ckpt.model))
        except ValueError as exc:
            raise BioimageioExportError(str(exc)) from None
        from bioimageio.spec import save_bioimageio_package_to_stream

        def write(handle: BinaryIO) -> None:
            save_bioimageio_package_to_stream(descr, output_stream=handle)

        write_atomically(out_path, write)
    if check:
        check_package(out_path)
    return out_path


def check_package(path: Path) -> None:
    """Run ``bioimageio.core.test_model`` on a package; raise with its first failure."""
    from bioimageio.core import test_model

    summary = test_model(path)
    if summary.status != "passed":
        failed = [d for d in summary.details if d.status == "failed"]
        first = failed[0] if failed else None
        why = f"{first.name}: {first.errors[0].msg if first.errors else ''}" if first else ""
        raise BioimageioExportError(
            f"wrote {path}, but bioimageio.core's test_model failed it ({' '.join(why.split())})"
        )


def _as_checkpoint(
    source: Checkpoint | ExportsCheckpoint | str | os.PathLike, folder: Path, trust: Trust
) -> Checkpoint:
    # Paths go through the public load_checkpoint: the loader sits above bioimageio/.
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_checkpoint(source, trust=trust)
    return load_checkpoint(source.export(folder / "finetuned.pt"), trust=trust)


def _image_of(
    volume: VolumeArray | AxesImage | str | os.PathLike, ckpt: Checkpoint,
    channel: int | None = None,
) -> tuple[AxesImage, str, list[float] | None, dict[str, str]]:
    """``(image, name, scale, units)``: the model's input (its channels, or ``channel``,
    else the one the checkpoint trained on, for a single-channel model; one time point) of
    an OME-Zarr store's level 0, of an AxesImage, or of an array as given."""
    in_channels = model_in_channels(ckpt.model)
    scale: list[float] | None = None
    units: dict[str, str] = {}
    if isinstance(volume, (str, os.PathLike)):
        from napari_finetune.io.omezarr import open_volume

        opened = open_volume(volume, keep_axes=True)
        image, name = opened.input, opened.name
        # The spatial axes' scale: the package's axes are the model's, without c and t.
        scale = [float(s) for a, s in zip(opened.axes, opened.scale[0], strict=True)
                 if a in SPATIAL]
        units = {a: u for a, u in opened.axis_units.items() if a in SPATIAL}
    elif isinstance(volume, AxesImage):
        image, name = volume, "the given image"
    elif hasattr(volume, "shape") and len(volume.shape) in (2, 3):
        image, name = AxesImage.of(volume), "the given image"
    else:
        raise BioimageioExportError(
            "the volume for the test tensors must be a ZYX or YX array, an AxesImage or an "
            "OME-Zarr store"
        )
    if channel is None and in_channels == 1 and image.channels > 1:
        channel = trained_channel(ckpt.metadata, image)
    try:
        image = image.for_model(in_channels, channel, what="the volume")
    except ChannelChoiceError as exc:
        if channel is not None or in_channels != 1:
            raise BioimageioExportError(str(exc)) from None
        listed = ", ".join(image.describe_channel(c) for c in range(image.channels))
        choices = " or ".join(f"--channel {c}" for c in range(image.channels))
        raise BioimageioExportError(
            f"the volume has {image.channels} channels ({listed}) and the model takes 1, "
            f"and its checkpoint records no channel it trained on: pass {choices} "
            "(channel= in Python) for the channel the model reads"
        ) from None
    # The middle time point: a spatial model sees one at a time; a package has no time axis.
    return image.at_time(image.time_points // 2), name, scale, units


def trained_channel(metadata: Mapping[str, Any], image: AxesImage) -> int | None:
    """The channel of ``image`` a single-channel model's run trained on, as its checkpoint
    records it: the recorded name among the image's channel names, else the recorded
    index (``"input_channel"``, written by ``train --channel``); None when neither fits.

    The name comes first: the index is the training store's, and a store whose channels
    are named can order them differently.
    """
    names = metadata.get("input_channels")
    if isinstance(names, list) and len(names) == 1 and names[0] in image.channel_names:
        return image.channel_names.index(str(names[0]))
    index = metadata.get("input_channel")
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < image.channels:
        return index
    return None


def _input_channels(ckpt: Checkpoint, image: AxesImage) -> list[str]:
    """Names of the package's input channels: the run's record, the image's, or c0, c1..."""
    count = image.channels
    for names in (ckpt.metadata.get("input_channels"), list(image.channel_names)):
        if isinstance(names, list) and len(names) == count and count > 1:
            return [str(n) for n in names]
    return ["raw"] if count == 1 else [f"c{i}" for i in range(count)]


def _test_input(
    image: AxesImage, model: torch.nn.Module, tile_shape: Sequence[int] | None
) -> np.ndarray:
    """A tile from the centre of ``image``, each side a multiple of the model's, as
    ``(C, *tile)``."""
    multiple = shape_multiple(model)
    shape = image.spatial_shape
    wanted = tuple(tile_shape) if tile_shape else DEFAULT_TILE[len(shape)]
    if len(wanted) != len(shape):
        raise BioimageioExportError(
            f"the test tile {tuple(wanted)} has {len(wanted)} axes, the volume {len(shape)}"
        )
    tile = tuple(min(w, s) // multiple * multiple for w, s in zip(wanted, shape, strict=True))
    if min(tile) < 1:
        raise BioimageioExportError(
            f"the volume {shape} is smaller than the model's multiple {multiple} along an "
            "axis; use a bigger volume for the test tensors"
        )
    start = [(s - t) // 2 for s, t in zip(shape, tile, strict=True)]
    raw = image.read(tuple(slice(a, a + t) for a, t in zip(start, tile, strict=True)))
    if raw.dtype.kind not in "uif" or raw.dtype.itemsize > 8:
        raw = raw.astype(np.float32)
    if raw.dtype.kind == "f" and not np.isfinite(raw).all():
        # napari-finetune reads NaN as "missing"; bioimage.io consumers would get NaN out.
        raise BioimageioExportError(
            f"the test tile (the volume's centre, {tile}) has {int((~np.isfinite(raw)).sum())} "
            "NaN/inf voxels; give a --test-shape / tile_shape that avoids them"
        )
    return np.ascontiguousarray(raw.astype(raw.dtype.newbyteorder("=")))


def _login() -> str:
    """The user's login name, the default author (``"unknown"`` where there is none)."""
    try:
        return getpass.getuser() or "unknown"
    except (KeyError, OSError):  # no USER variable and no passwd entry (some containers)
        return "unknown"


def _name(name: str | None, ckpt: Checkpoint) -> str:
    if name:
        bad = sorted(set(re.sub(r"[A-Za-z0-9_+\- ()]", "", name)))
        if bad or not 5 <= len(name) <= 128:
            raise BioimageioExportError(
                f"--name {name!r}: bioimage.io names are 5-128 letters, digits, spaces and "
                f"_+-() (remove {''.join(bad)!r})"
            )
        return name
    stem = ckpt.path.stem if ckpt.path else "model"
    clean = re.sub(r"[^A-Za-z0-9_+\- ()]", "-", stem)
    return f"{clean} (napari-finetune)"[:128]


def _description(ckpt: Checkpoint, volume_name: str) -> str:
    channels = ", ".join(ckpt.channel_names)
    made = "Fine-tuned" if ckpt.metadata.get("run") else "Exported"
    return (
        f"{made} with napari-finetune: segmentation of {channels}, one probability per "
        f"channel; test tensors from {volume_name}."
    )[:512]


def _cites(
    cite: Sequence[tuple[str, str]] | None, provenance: dict[str, Any], ndim: int
) -> list[dict[str, str]]:
    if cite:
        out = []
        for text, ref in cite:
            key = "url" if ref.startswith(("http://", "https://")) else "doi"
            out.append({"text": text, key: ref})
        return out
    kept = [c for c in provenance.get("cite") or [] if c.get("doi") or c.get("url")]
    return kept or [{"text": t, "doi": d} for t, d in UNET_CITES[ndim]]
