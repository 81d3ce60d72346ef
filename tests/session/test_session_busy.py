"""What the session is busy with, in one place: its actions, and a front end's holds
(the results going into the viewer, the layers a run waits for); the Objects checks."""

from __future__ import annotations

from napari_finetune.objects import ChannelRole
from napari_finetune.session.session import Busy, Outcome


def test_a_hold_is_busy_like_an_action_until_released(session, record):
    assert session.hold(Busy.SHOW) is True and session.busy is Busy.SHOW
    assert session.predict() is False  # refused with the reason, nothing started
    assert record["refused"] == [
        "Cannot predict: busy with show the results; wait for it to end."]
    session.release(Busy.TRAIN)  # not the one held: nothing changes
    assert session.busy is Busy.SHOW
    session.release(Busy.SHOW)
    assert session.busy is None and record["busy"] == [Busy.SHOW, None]
    assert record["ended"] == []  # a hold is no action: it ends nothing


def test_a_held_run_is_taken_over_by_finetune(session, record):
    assert session.hold(Busy.TRAIN) is True
    assert session.finetune() is True  # the hold was its own: not refused
    assert record["refused"] == [] and record["ended"][-1].outcome is Outcome.DONE
    assert session.busy is None
    session.release(Busy.TRAIN)  # late: the run took the hold over, nothing to end
    assert record["busy"] == [Busy.TRAIN, None]


def test_objects_checks_its_roles_itself(session, record):
    session.roles = {"membrane": ChannelRole(None)}
    assert session.predict() is True
    session.roles_error = "mitochondria: min_size must be a whole number >= 0; type one."
    assert session.objects() is False
    session.roles_error = ""
    assert session.objects() is False  # no channel has a role
    session.roles = {"mitochondria": ChannelRole("object", threshold=0.5)}
    assert session.objects() is False  # the prediction kept no probability of it
    assert record["refused"] == [
        "Cannot count objects: mitochondria: min_size must be a whole number >= 0; type one.",
        "No objects: no channel has a role; give a channel a role (boundary or object), "
        "then predict.",
        "No objects: press Predict again: the last Predict kept no probability of "
        "mitochondria (no role then)",
    ]
    assert session.predict() is True and session.objects() is True
