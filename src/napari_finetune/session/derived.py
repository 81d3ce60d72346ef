"""Jobs on a prediction's probabilities: objects, uncertainty, where to paint next.

Qt-free generators like :mod:`napari_finetune.session.jobs`; the widget and the
:class:`~napari_finetune.session.session.Session` run them through a runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.arrays import AxesImage
from napari_finetune.session.events import Progress
from napari_finetune.session.jobs import model_to_predict
from napari_finetune.session.work import Job, core_left_for_the_ui, with_progress
from napari_finetune.uncertainty import Suggestion, entropy, suggest_region

if TYPE_CHECKING:
    from torch import nn

    from napari_finetune.arrays import VolumeArray
    from napari_finetune.objects import ChannelRole, RolesFromPainting


@dataclass(frozen=True)
class ChannelObjects:
    """One channel's objects: uint32 ids 1..n (0 between objects), and ``count`` of them.

    A time series' ids start at 1 at every time point (the objects of one time point
    are found without the others'), and ``count`` is their total over time points.
    """

    labels: np.ndarray
    count: int


def roles_job(
    roles: Mapping[str, ChannelRole], corrections: np.ndarray | None,
    channel_names: Sequence[str], user_set: Mapping[str, set[str]],
    voxel_size: Sequence[float] | None = None,
    probabilities: Mapping[str, np.ndarray] | None = None,
) -> Job[RolesFromPainting]:
    """The roles with each object channel's seed distance and min size from its painted
    objects, else its predicted ones (``probabilities``), where the user set none
    (:func:`~napari_finetune.objects.roles_from_painting`)."""
    from napari_finetune.objects import roles_from_painting

    yield Progress(0, 1, "object sizes from the painting")
    found = roles_from_painting(roles, corrections, channel_names, voxel_size, user_set,
                                probabilities)
    yield Progress(1, 1, "object sizes from the painting")
    return found


def objects_job(
    probabilities: Mapping[str, np.ndarray], roles: Mapping[str, ChannelRole],
    voxel_size: Sequence[float] | None = None, has_time: bool = False,
) -> Job[dict[str, ChannelObjects]]:
    """Each channel's objects by its role (``instances_of``), channel by channel, distances
    measured in ``voxel_size`` (None: in voxels).

    With ``has_time`` the probabilities' first axis is time: each time point's objects
    are found alone (objects stacked over time would join across time points), their
    ids starting at 1 at every time point.
    """
    from napari_finetune.objects import instances_of

    out: dict[str, ChannelObjects] = {}
    for i, (channel, prob) in enumerate(probabilities.items()):
        yield Progress(i, len(probabilities), "objects")
        frames = prob if has_time else prob[None]
        labels = np.zeros(frames.shape, np.uint32)
        count = 0
        for t, frame in enumerate(frames):
            # frame[None]: the (1, *spatial) view instances_of takes, without a copy.
            labels[t] = instances_of(frame[None], {channel: roles[channel]}, [channel],
                                     voxel_size)[channel]
            # Ids are 1..N consecutive, so the largest is the count (computed here, off
            # the UI).
            count += int(labels[t].max(initial=0))
        out[channel] = ChannelObjects(labels if has_time else labels[0], count)
    yield Progress(len(probabilities), len(probabilities), "objects")
    return out


def uncertainty_job(
    checkpoint_path: str,
    image: VolumeArray | AxesImage,
    channel_count: int | None,
    device: str,
    model: nn.Module | None = None,
    normalization: dict | None = None,
    trust: Sequence[str] = (),
) -> Job[np.ndarray]:
    """Whole-volume probabilities, blockwise, turned into the entropy of each voxel (of
    each voxel and time point of an image with time points; the channels a model reads
    give one uncertainty)."""
    from napari_finetune.config import PredictConfig
    from napari_finetune.predict import predict_volume

    model, low_high, channel_count = model_to_predict(
        checkpoint_path, image, channel_count, model, normalization, trust
    )
    # The painting's shape: channels are read together, time points one after the other.
    shape = AxesImage.of(image).labels_shape
    probabilities = [np.zeros(shape, np.float32) for _ in range(channel_count)]
    with core_left_for_the_ui():
        yield from with_progress(
            lambda progress: predict_volume(
                model, image, low_high, PredictConfig(device=device), out=probabilities,
                progress=progress,
            ),
            "uncertainty",
        )
    unsure = np.zeros(shape, np.float32)
    for channel in probabilities:  # channel by channel: one temporary volume, not C
        np.maximum(unsure, entropy(channel[None]), out=unsure)
    return unsure


def suggest_job(
    unsure: np.ndarray,
    corrections: VolumeArray | None,
    region_shape: Sequence[int],
    exclude: Sequence[tuple[slice, ...]],
) -> Job[Suggestion | None]:
    """The next region to paint (None: everything is painted or was suggested)."""
    yield from ()
    return suggest_region(unsure, corrections, region_shape, exclude)
