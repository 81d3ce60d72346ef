"""``predict --instances``: each object channel's seed distance and min size.

From the objects painted in the store's ``labels/corrections``; where a channel has
too few of them (nothing painted, or strokes only), from the objects the model
predicts, when those are more than twice as wide or narrow as the roles' sizes are
for. Both are :func:`~napari_finetune.objects.roles_from_painting`, the function the
Session and the benchmarks use, so the command line, the panel and the benchmarks
take the same sizes from the same evidence. A size the checkpoint records as set by
the user stays. One line per channel says which sizes were used and why.

The predicted objects are measured on a centre crop of the volume (at most
:data:`CROP` voxels), predicted in memory before the volume is: the objects step
labels the volume block by block with the sizes fixed beforehand, and a crop of a
few dozen objects says their typical width as well as the whole volume does, in
seconds, however large the volume.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from napari_finetune.arrays import AxesImage
    from napari_finetune.config import PredictConfig
    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.objects import ChannelRole, RolesFromPainting

# The largest region predicted to measure the objects (ZYX; the last two for YX): about
# 16 MB of probabilities per channel, a few seconds on a CPU.
CROP = (64, 256, 256)


def roles_for_store(
    ckpt: Checkpoint, roles: dict[str, ChannelRole], store: Path, image: AxesImage,
    voxel_size: Sequence[float] | None, config: PredictConfig,
    given: Mapping[str, Collection[str]] | None = None,
) -> dict[str, ChannelRole]:
    """``roles`` with each object channel's seed distance and min size from the objects
    painted in ``store``'s ``labels/corrections``, else from those the model predicts
    on ``image`` (the store's image as the model takes it) when the roles' sizes are
    more than twice off; prints one line per channel whose sizes changed. ``given``:
    the parameters set on the command line per channel, kept as they are in ``roles``
    (as those the checkpoint records as set by the user).

    A time series is measured at its most painted time point (the middle one when
    nothing is painted): objects of one structure keep their size over time, and time
    points stacked as one volume would join objects across them.
    """
    from napari_finetune.io.omezarr import VolumeError, load_corrections
    from napari_finetune.objects import roles_from_painting, sources_from_metadata
    from napari_finetune.objects.from_painting import sizing_time_point, user_set_from_sources

    try:
        corrections: np.ndarray | None = np.asarray(load_corrections(store, "corrections"))
    except VolumeError:  # none painted (or of another shape): the prediction may say
        corrections = None
    t = sizing_time_point(corrections if image.has_time else None, image.time_points)
    if corrections is not None and image.has_time:
        corrections = corrections[t]
    user_set = user_set_from_sources(sources_from_metadata(ckpt.metadata))
    for channel, names_given in (given or {}).items():
        user_set.setdefault(channel, set()).update(names_given)
    names = ckpt.channel_names
    found = roles_from_painting(roles, corrections, names, voxel_size, user_set)
    unsized = _unsized(found)
    if unsized:  # a prediction only where the painting did not size a channel
        probabilities = _crop_probabilities(ckpt, image.at_time(t), config, unsized)
        found = roles_from_painting(roles, corrections, names, voxel_size, user_set,
                                    probabilities)
    for line in _lines(found):
        print(line)
    return found.roles


def _unsized(found: RolesFromPainting) -> list[str]:
    """Object channels with a size left to estimate that the painting did not give."""
    from napari_finetune.objects.from_painting import DEFAULT

    return [channel for channel, sources in found.sources.items()
            if found.roles[channel].role == "object" and DEFAULT in sources.values()]


def _crop_probabilities(
    ckpt: Checkpoint, image: AxesImage, config: PredictConfig, channels: Sequence[str],
) -> dict[str, np.ndarray]:
    """The probabilities of ``channels`` on the centre crop (:data:`CROP`) of ``image``
    (one time point), normalised with the whole image's ranges as the volume's
    prediction is, so the crop's objects are the volume's."""
    from napari_finetune.arrays import AxesImage
    from napari_finetune.data.normalization import intensity_ranges
    from napari_finetune.model.geometry import shape_multiple
    from napari_finetune.predict import predict_volume

    shape = image.spatial_shape
    multiple = shape_multiple(ckpt.model, len(shape))
    # A crop smaller than the volume is cut to the model's multiple: no padded border.
    crop = tuple(s if s <= c else c // multiple * multiple
                 for s, c in zip(shape, CROP[-len(shape):], strict=True))
    box = tuple(slice((s - c) // 2, (s - c) // 2 + c) for s, c in zip(shape, crop, strict=True))
    raw = image.read(box)  # (C, *crop)
    axes = image.spatial_axes
    cropped = AxesImage(raw, "c" + axes) if "c" in image.axes else AxesImage(raw[0], axes)
    ranges = intensity_ranges(image, ckpt.normalization)
    probs = np.asarray(predict_volume(ckpt.model, cropped, ranges if len(ranges) > 1
                                      else ranges[0], config))
    names = [str(n) for n in ckpt.channel_names]
    return {c: probs[names.index(c)] for c in channels if c in names}


def _lines(found: RolesFromPainting) -> list[str]:
    """One line per channel whose sizes did not stay the checkpoint's: the sizes used,
    where they came from, and (from the prediction) why the checkpoint's were not."""
    from napari_finetune.objects.from_painting import DEFAULT, SEED_FRACTION

    lines = []
    for channel, sources in found.sources.items():
        if set(sources.values()) == {DEFAULT}:
            continue
        role, before = found.roles[channel], found.base[channel]
        line = (f"objects of {channel}: seed distance {role.seed_distance:g} "
                f"({sources['seed_distance']}), min size {role.min_size} "
                f"({sources['min_size']})")
        if any(s.startswith("from the prediction") for s in sources.values()):
            made_for = 2 * before.seed_distance / SEED_FRACTION
            line += (f"; nothing painted sizes them, and the checkpoint's seed distance "
                     f"{before.seed_distance:g} is for objects about {made_for:g} voxels "
                     "wide, more than twice off")
        lines.append(line)
    return lines

