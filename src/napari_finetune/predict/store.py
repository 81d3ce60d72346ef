"""Predict an OME-Zarr volume into its ``labels/`` group, never losing the previous result.

Every channel's labels image is written aside, in a staging folder of
:func:`~napari_finetune.io.staging.staged_replace`, and swapped in (old image
moved away, new one renamed into place, name listed) only once every region
is written. A run that fails (out of memory at the smallest block, an error,
Ctrl-C) or is killed leaves the store's previous ``labels/prediction-*``
untouched and lists nothing half written; the staging folder is removed by the
failed run itself or by the next write (``recover``).

Regions are aligned to the output chunks (:func:`region_grid`), so each one
writes whole chunks of its own. Each labels image has the image's levels: the
smaller ones are filled from level 0, chunk by chunk, once every region is
written and before the swap. Out of memory, a region is tiled with smaller
blocks (:class:`~napari_finetune.predict.regions.RegionPredictor`).

With ``instances`` (channel -> :class:`~napari_finetune.objects.ChannelRole`),
every channel with a role also gets ``labels/objects-<channel>``: uint32
instance ids over the whole volume, one per object across region borders
(:func:`~napari_finetune.objects.blockwise_instances`). Its probability is kept
aside in the objects image's staging folder while the volume is predicted (so
the role's own threshold applies, not the mask's 0.5) and read back block by
block; the objects image is staged and swapped in with the masks, so it is
never half written either.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from napari_finetune.arrays import ArrayTarget, AxesImage, AxisTaken, WritableVolume
from napari_finetune.config import PredictConfig
from napari_finetune.devices import check_model_fits_image, on_device, resolve_device
from napari_finetune.objects import ChannelRole, blockwise_instances
from napari_finetune.predict.regions import Log, RegionPredictor, region_grid
from napari_finetune.predict.volume import MaskAndProbability, Progress, spatial_config, write_probs

if TYPE_CHECKING:
    import torch

    from napari_finetune.model.checkpoint import Checkpoint


def predict_to_omezarr(
    checkpoint: Checkpoint | str | os.PathLike,
    store_path: str | os.PathLike,
    name_prefix: str = "prediction",
    config: PredictConfig | None = None,
    progress: Progress | None = None,
    log: Log | None = None,
    instances: Mapping[str, ChannelRole] | None = None,
    voxel_size: Sequence[float] | None = None,
    channel: int | None = None,
) -> list[str]:
    """Predict an OME-Zarr volume and write one NGFF label image per channel.

    Each channel ``c`` goes to ``labels/<name_prefix>-<channel name>`` as uint8
    (1 where the probability is above 0.5), written region by region (one
    output chunk of ``config.block_shape`` each), so the volume and its
    prediction never need to fit in memory. See the module doc for what a
    failed run keeps.

    Parameters
    ----------
    checkpoint : path-like or Checkpoint
        The model (a file, or what ``load_checkpoint`` returned).
    store_path : path-like
        The OME-Zarr store; its level 0 is predicted.
    name_prefix : str
        Label names are ``<name_prefix>-<channel>``.
    config : PredictConfig, optional
        Block (= output chunk), halo and device.
    progress : callable, optional
        ``progress(done, total)`` after each region.
    log : callable, optional
        Receives one line per out-of-memory step down.
    instances : mapping of channel name to ChannelRole, optional
        Channels with a role also get their instance labels,
        ``labels/<objects prefix>-<channel>`` (:func:`objects_names`), computed
        block by block with the region grid's blocks.
    voxel_size : sequence of float, optional
        The volume's voxel size for the objects' distances; default the store's
        NGFF scale (:attr:`~napari_finetune.io.volume.Volume.voxel_size`).
    channel : int, optional
        The store's channel a single-channel model predicts, for a store with
        several (:meth:`~napari_finetune.arrays.AxesImage.for_model`); a model
        with as many input channels as the store takes them all.

    A store with time points is predicted one time point at a time (one block per
    time point and region); its labels have the store's axes without ``c``, and the
    objects are numbered per time point.

    Returns the label names written (the masks', then the objects').

    Raises
    ------
    PredictOutOfMemoryError
        Out of memory even at the smallest block (a ``MemoryError``).
    """
    import zarr

    from napari_finetune.data.normalization import intensity_ranges
    from napari_finetune.devices import model_in_channels
    from napari_finetune.io.labels import prediction_metadata
    from napari_finetune.io.omezarr import create_labels_array, open_volume
    from napari_finetune.io.pyramid import fill_pyramid
    from napari_finetune.io.staging import staged_replace
    from napari_finetune.model.checkpoint import Checkpoint, load_checkpoint

    # The public path, not napari_finetune.loading, which sits above the predictor.
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    volume = open_volume(Path(store_path), keep_axes=True)
    image = volume.input.for_model(model_in_channels(ckpt.model), channel)
    spatial = image.spatial_shape
    config = config or PredictConfig()
    check_model_fits_image(ckpt.model, spatial)
    block_shape, halo = spatial_config(config, len(spatial))
    chunks = tuple(min(b, s) for b, s in zip(block_shape, spatial, strict=True))
    # Labels have the image's axes without channels: one chunk per time point.
    shape = image.labels_shape
    label_chunks = (1,) * image.has_time + chunks
    names = [f"{name_prefix}-{channel}" for channel in ckpt.channel_names]
    roles = instance_roles(instances, ckpt.channel_names)
    object_names = objects_names(name_prefix, list(roles))
    ranges = intensity_ranges(image, ckpt.normalization)
    device = resolve_device(config.device)
    regions = region_grid(spatial, chunks)

    with ExitStack() as stack:
        # Entered in order, left in reverse: all are swapped in only after the body.
        targets: list[ArrayTarget] = []
        pyramids: list[Path] = []
        classes = zip(names, ckpt.channel_names, ckpt.channel_colors, strict=True)
        for name, channel_name, color in classes:
            staging = stack.enter_context(staged_replace(volume.path, name))
            targets.append(create_labels_array(
                store_path, name, shape, np.uint8, label_chunks,
                *prediction_metadata(channel_name, color), staging=staging,
            ))
            pyramids.append(staging / "labels" / name)
        objects = []
        for name, channel_name in zip(object_names, roles, strict=True):
            staging = stack.enter_context(staged_replace(volume.path, name))
            objects.append(create_labels_array(
                store_path, name, shape, np.uint32, label_chunks, staging=staging,
            ))
            pyramids.append(staging / "labels" / name)
            # Beside the staged image, so it goes when the staging folder does.
            prob = zarr.open_array(str(staging / "probability"), mode="w", zarr_format=3,
                                   shape=shape, chunks=label_chunks, dtype=np.float32)
            index = ckpt.channel_names.index(channel_name)
            targets[index] = MaskAndProbability(targets[index], prob)
        total = len(regions) * image.time_points
        for t in range(image.time_points):
            def step(done: int, _of: int, before: int = t * len(regions)) -> None:
                if progress is not None:
                    progress(before + done, total)

            _predict_regions(ckpt.model, image.at_time(t), ranges, halo, device, regions,
                             [_at_time(target, t, image.has_time) for target in targets],
                             step, log)
        probabilities = [t for t in targets if isinstance(t, MaskAndProbability)]
        for role, target, out in zip(roles.values(), probabilities, objects, strict=True):
            for t in range(image.time_points):  # ids are numbered per time point
                blockwise_instances(
                    AxisTaken(target.probability, 0, t) if image.has_time
                    else target.probability,
                    role, chunks,
                    AxisTaken(out, 0, t) if image.has_time else out,
                    voxel_size=voxel_size or volume.voxel_size,
                )
        for labels_image in pyramids:  # the image's smaller levels, before the swap
            fill_pyramid(zarr.open_group(str(labels_image), mode="r+"))
    return names + object_names


def objects_names(name_prefix: str, channels: list[str]) -> list[str]:
    """``objects-<channel>`` (``<name_prefix>-objects-<channel>`` for another prefix than
    ``prediction``, so two runs of different names keep their own objects)."""
    prefix = "objects" if name_prefix == "prediction" else f"{name_prefix}-objects"
    return [f"{prefix}-{channel}" for channel in channels]


def instance_roles(
    instances: Mapping[str, ChannelRole] | None, channel_names: list[str]
) -> dict[str, ChannelRole]:
    """The channels with a role, in channel order; a one-line ValueError for a bad one."""
    if instances is None:
        return {}
    unknown = sorted(set(instances) - set(channel_names))
    if unknown:
        raise ValueError(
            f"instance roles name channels {unknown} the model does not have; "
            f"its channels are {channel_names}."
        )
    roles = {c: instances[c] for c in channel_names if c in instances and instances[c].role}
    for channel, role in roles.items():
        role.validate(channel)
    if not roles:
        raise ValueError(
            f"no channel has an instance role (channels: {', '.join(channel_names)}); give one, "
            "e.g. --role CHANNEL=boundary or --role CHANNEL=object."
        )
    return roles


def _at_time(target: ArrayTarget, t: int, has_time: bool) -> ArrayTarget:
    """``target`` at time point ``t`` (a view that writes there); itself without time."""
    if not has_time:
        return target
    # The labels and probability arrays made above are zarr arrays: read and written alike.
    if isinstance(target, MaskAndProbability):
        return MaskAndProbability(AxisTaken(cast(WritableVolume, target.mask), 0, t),
                                  AxisTaken(cast(WritableVolume, target.probability), 0, t))
    return AxisTaken(cast(WritableVolume, target), 0, t)


def _predict_regions(
    model: torch.nn.Module,
    image: AxesImage,
    ranges: list[tuple[float, float]],
    halo: tuple[int, ...],
    device: str,
    regions: list[tuple[slice, ...]],
    targets: list[ArrayTarget],
    progress: Callable[[int, int], None] | None,
    log: Log | None,
) -> None:
    with on_device(model, device):  # once for the whole volume, not per region
        predictor = RegionPredictor(model, image, *ranges[0], halo, device, log, ranges=ranges)
        for done, core in enumerate(regions, start=1):
            write_probs(targets, core, predictor(core))
            if progress is not None:
                progress(done, len(regions))
