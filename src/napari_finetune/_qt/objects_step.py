"""The Objects step: instance labels of each channel with a role, from the last prediction.

The click only checks and copies references (cheap, main thread); the
labelling runs in a worker (:func:`objects_job`, the public functions of
:mod:`napari_finetune.objects`), and the layers come back one per event-loop
turn (:func:`~napari_finetune._qt.layers.show_objects_later`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune._qt import corrections as corr
from napari_finetune._qt.events import Progress
from napari_finetune._qt.layers import objects_layer_name, show_objects_later
from napari_finetune._qt.worker import Job

if TYPE_CHECKING:
    from napari_finetune._qt.actions import Controller
    from napari_finetune._qt.state import CheckpointInfo
    from napari_finetune.objects import ChannelRole


@dataclass(frozen=True)
class ChannelObjects:
    """One channel's objects: uint32 ids 1..count (0 between objects)."""

    labels: np.ndarray
    count: int


def no_roles_message(info: CheckpointInfo) -> str:
    """One line: why this checkpoint gives no objects and how to give it roles."""
    if info.roles_problem:
        return f"No objects: {info.roles_problem}"
    first = info.channel_names[0] if info.channel_names else "CHANNEL"
    return (f"No objects: {Path(info.path).name} gives no channel an instance role "
            f"(channels: {', '.join(info.channel_names)}); the checkpoint needs roles "
            "(metadata 'instance_roles', napari_finetune.objects.roles_to_metadata), or "
            f"count from the command line: napari-finetune predict CKPT STORE --instances "
            f"--role {first}=boundary|object")


def describe_roles(info: CheckpointInfo) -> str:
    """What Objects will show for this checkpoint, or the no-roles line."""
    if not info.roles:
        return no_roles_message(info)
    layers = ", ".join(f"{objects_layer_name(channel, role.role)} ({channel}, {role.role})"
                       for channel, role in info.roles.items())
    return f"objects after Predict: {layers}"


def objects_job(
    probabilities: Mapping[str, np.ndarray], roles: Mapping[str, ChannelRole],
) -> Job[dict[str, ChannelObjects]]:
    """Each channel's objects by its role (``instances_of``), channel by channel."""
    from napari_finetune.objects import instances_of

    out: dict[str, ChannelObjects] = {}
    for i, (channel, prob) in enumerate(probabilities.items()):
        yield Progress(i, len(probabilities), "objects")
        # prob[None]: the (1, *spatial) view instances_of takes, without a copy.
        labels = instances_of(prob[None], {channel: roles[channel]}, [channel])[channel]
        # Ids are 1..N consecutive, so the largest is the count (computed here, off the UI).
        out[channel] = ChannelObjects(labels, int(labels.max(initial=0)))
    yield Progress(len(probabilities), len(probabilities), "objects")
    return out


def compute_objects(c: Controller) -> None:
    """The Objects button: label the last prediction's role channels in a worker, then
    show one Labels layer per channel and each count."""
    s, w = c.state, c.w
    if s.info is None or s.busy is not None:
        return
    if not s.info.roles:
        message = no_roles_message(s.info)
        w.objects_label.setText(message)
        w.status_panel.append_log(message)
        return
    image = s.predicted_image
    if not s.probabilities or image is None or image not in w.viewer.layers:
        w.objects_label.setText("objects: press Predict first")
        return
    roles = dict(s.info.roles)
    # The arrays themselves, not copies: a new prediction replaces them, never writes into them.
    probabilities = dict(s.probabilities)
    prediction_id, store = s.prediction_id, corr.store_path_of(image)

    def computed(objects: dict[str, ChannelObjects]) -> None:
        names = {channel: objects_layer_name(channel, roles[channel].role) for channel in objects}
        s.busy = "show"  # the buttons wait for the layers; the job's end leaves this be

        def shown() -> None:
            lines = [f"{names[channel]}: {found.count}" for channel, found in objects.items()]
            for line in lines:
                w.status_panel.append_log(line)
            w.objects_label.setText(", ".join(lines))
            w.status_panel.set_idle("objects: " + ", ".join(lines))
            s.busy = None

        show_objects_later(
            w.viewer, image,
            [(names[channel], channel, found.labels) for channel, found in objects.items()],
            store, prediction_id, alive=lambda: not s.closed, then=shown,
            below=w.corrections_layer())

    w.objects_label.setText("computing objects…")
    c.run_job("objects", objects_job, probabilities, roles,
              what="Computing the objects failed", on_result=computed,
              on_failed=lambda: w.objects_label.setText("objects: failed, see the log"))
