"""Objects from the Session take each object channel's sizes from the painted objects,
keep the ones the user set, and Export records the values used and where they came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.objects.painted_nuclei import TODAY, nuclei, painting, whole

from napari_finetune.objects import ChannelRole, roles_from_metadata, sources_from_metadata
from napari_finetune.session.jobs import Prediction
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Session

NAMES = ["membrane", "nuclei"]


def _session(corrections: np.ndarray | None) -> tuple[Session, np.ndarray]:
    prob, truth = nuclei()
    session = Session(InlineRunner(), channel_names=list(NAMES), roles={"nuclei": TODAY},
                      corrections=corrections)
    session.prediction = Prediction([(prob > 0.5).astype(np.uint8)] * 2, {1: prob})
    return session, truth


def test_objects_take_the_painted_nuclei_sizes_and_keep_them_whole():
    session, truth = _session(painting(channel=1))
    assert session.objects() is True
    labels = session.found_objects["nuclei"].labels
    assert session.found_objects["nuclei"].count == 2 and whole(labels, truth) == [1, 1]
    found = session.roles_found
    assert found is not None and found.base == {"nuclei": TODAY}
    assert found.roles["nuclei"].seed_distance == pytest.approx(14.5)
    assert found.sources["nuclei"]["min_size"].startswith("from your painting (6 objects")
    assert session.roles == {"nuclei": TODAY}  # the user's roles are left as they were


def test_without_painting_the_predicted_nuclei_give_the_sizes():
    session, truth = _session(None)
    assert session.objects() is True
    # Today's sizes cut each nucleus in two (4 objects); the predicted nuclei, 29 voxels
    # wide where the values are for 8, give theirs, and each nucleus stays whole.
    labels = session.found_objects["nuclei"].labels
    assert session.found_objects["nuclei"].count == 2 and whole(labels, truth) == [1, 1]
    found = session.roles_found
    assert found is not None and found.roles["nuclei"].seed_distance == pytest.approx(14.5)
    assert found.sources["nuclei"]["seed_distance"].startswith("from the prediction (2 objects")
    # Painted on another image (another shape): it says nothing of these objects.
    session.corrections = np.zeros((2, 8, 8), np.uint8)
    assert session.objects() is True and session.found_objects["nuclei"].count == 2


def test_without_painting_or_prediction_sizes_the_values_stay_and_say_default():
    session, _ = _session(None)
    assert session.prediction is not None
    session.prediction.probabilities[1] = np.zeros_like(session.prediction.probabilities[1])
    assert session.objects() is True
    assert session.roles_found is not None
    assert session.roles_found.roles == {"nuclei": TODAY}
    assert session.roles_found.sources == {"nuclei": {"seed_distance": "default",
                                                      "min_size": "default"}}


def test_a_size_the_user_set_is_kept():
    session, _ = _session(painting(channel=1))
    session.roles_set = {"nuclei": {"seed_distance"}}
    assert session.objects() is True
    found = session.roles_found
    assert found is not None
    assert found.roles["nuclei"].seed_distance == TODAY.seed_distance
    assert found.sources["nuclei"]["seed_distance"] == "set by you"
    assert found.roles["nuclei"].min_size != TODAY.min_size


class _Trainer:
    """What Export uses of a run: its steps and its export."""

    steps_done = 1

    def __init__(self) -> None:
        self.metadata: dict[str, Any] = {}

    def export(self, path: str, metadata: dict[str, Any] | None = None) -> Path:
        self.metadata = dict(metadata or {})
        return Path(path)


def test_export_records_the_sizes_used_and_their_sources(tmp_path):
    session, _ = _session(painting(channel=1))
    trainer = _Trainer()
    session.trainer = trainer  # type: ignore[assignment]
    assert session.objects() is True and session.export(str(tmp_path / "x.pt")) is True
    assert session.roles_found is not None
    assert roles_from_metadata(trainer.metadata, NAMES)["nuclei"] == session.roles_found.roles[
        "nuclei"]
    assert sources_from_metadata(trainer.metadata) == session.roles_found.sources
    # Roles changed since: the user's as they are now, no sources that are not theirs.
    session.roles = {"nuclei": ChannelRole("object", threshold=0.6)}
    assert session.export(str(tmp_path / "y.pt")) is True
    assert sources_from_metadata(trainer.metadata) == {}
    assert roles_from_metadata(trainer.metadata, NAMES)["nuclei"].threshold == 0.6
