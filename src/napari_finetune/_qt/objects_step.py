"""The Objects step: instance labels of each channel with a role, from the last prediction.

The click only checks and copies references (cheap, main thread); the
labelling is the widget's Session's action, run in a worker
(:func:`~napari_finetune.session.derived.objects_job`, the public functions of
:mod:`napari_finetune.objects`), and the layers come back one per event-loop
turn (:func:`~napari_finetune._qt.layers.show_objects_later`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from napari_finetune._qt import corrections as corr
from napari_finetune._qt.layers import (
    objects_layer_name,
    remove_stale_objects_layers,
    show_objects_later,
)
from napari_finetune.session.checkpoint import no_roles_message
from napari_finetune.session.session import Busy

if TYPE_CHECKING:
    from napari_finetune._qt.view import JobHost
    from napari_finetune.objects import ChannelRole
    from napari_finetune.session.checkpoint import CheckpointInfo


def with_role(roles: Mapping[str, ChannelRole]) -> dict[str, ChannelRole]:
    """The channels of ``roles`` that have a role (instances come from these only)."""
    return {channel: role for channel, role in roles.items() if role.role is not None}


def describe_roles(info: CheckpointInfo, roles: Mapping[str, ChannelRole]) -> str:
    """What Objects will show with these roles, or the no-roles line."""
    chosen = with_role(roles)
    if not chosen:
        return no_roles_message(info)
    layers = ", ".join(f"{objects_layer_name(channel, role.role)} ({channel}, {role.role})"
                       for channel, role in chosen.items())
    return f"objects after Predict: {layers}"


def show_checkpoint_roles(c: JobHost) -> None:
    """A checkpoint was read: the editor and the state start from its stored roles."""
    s, w = c.state, c.w
    if s.info is None:
        return
    s.roles, s.roles_error = dict(s.info.roles), ""
    w.roles_editor.show_roles(s.roles, s.info.roles_sources)
    w.objects_label.setText(describe_roles(s.info, s.roles))


def roles_edited(c: JobHost) -> None:
    """An input of the role editor changed: the state takes its values, or the one-line
    reason they cannot be (then the state keeps the last valid roles, which Objects and
    Export refuse to use until it is fixed)."""
    s, w = c.state, c.w
    if s.info is None:
        return
    try:
        s.roles, s.roles_error = w.roles_editor.roles(s.roles), ""
    except ValueError as exc:
        s.roles_error = str(exc)
    w.objects_label.setText(s.roles_error or describe_roles(s.info, s.roles))


def compute_objects(c: JobHost) -> None:
    """The Objects button: the Session labels the last prediction's role channels in its
    runner (its checks, its one-line refusals shown here), then one Labels layer per
    channel and each count."""
    s, w = c.state, c.w
    image = s.predicted_image
    if s.info is None or image is None or image not in w.viewer.layers:
        w.objects_label.setText("objects: press Predict first")  # its layers are gone
        return
    roles = with_role(s.roles)
    prediction_id, store = s.prediction_id, corr.store_path_of(image)

    def computed() -> None:
        if c.session.roles_found is not None:  # the sizes used, and where they came from
            w.roles_editor.show_found(c.session.roles_found)
        objects = c.session.found_objects
        names = {channel: objects_layer_name(channel, roles[channel].role) for channel in objects}
        if not c.session.hold(Busy.SHOW):  # the buttons wait for the layers
            return
        remove_stale_objects_layers(w.viewer, names.values())

        def shown() -> None:
            lines = [f"{names[channel]}: {found.count}" for channel, found in objects.items()]
            for line in lines:
                w.status_panel.append_log(line)
            w.objects_label.setText(", ".join(lines))
            w.status_panel.set_idle("objects: " + ", ".join(lines))
            c.session.release(Busy.SHOW)

        show_objects_later(
            w.viewer, image,
            [(names[channel], channel, found.labels) for channel, found in objects.items()],
            store, prediction_id, alive=lambda: not s.closed, then=shown,
            below=w.corrections_layer())

    c.session.roles, c.session.roles_error = dict(s.roles), s.roles_error
    # The painted objects give the sizes the user did not set (Session.objects).
    painted = w.corrections_layer()
    c.session.corrections = None if painted is None else painted.data
    c.session.roles_set = w.roles_editor.set_by_you()
    if c.start_action(c.session.objects, done=computed,
                      failed=lambda: w.objects_label.setText("objects: failed, see the log")):
        w.objects_label.setText("computing objects…")
        return
    w.objects_label.setText(c.refusal)  # the Session's reason, in the log too
    if not roles:
        remove_stale_objects_layers(w.viewer, ())  # every role is none now
