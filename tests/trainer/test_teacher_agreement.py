"""Distillation off when the starting model gets most of the painting wrong
(trainer/teacher_agreement.py, Finetuner.build)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_setup import make_trainer

from napari_finetune.trainer.teacher_agreement import (
    AGREEMENT_FLOOR,
    Agreement,
    _agreed,
    painted_agreement,
)


def test_painted_voxels_agree_by_their_class():
    # Channel 0 and 1 probabilities on 4 voxels: background, channel 0, channel 1, unpainted.
    probs = np.array([[0.1, 0.9, 0.2, 0.9], [0.2, 0.3, 0.4, 0.9]], np.float32)
    label = np.array([1, 2, 3, 0])
    assert _agreed(probs, label) == (2, 3)  # background and channel 0 right, channel 1 not
    assert _agreed(probs, np.array([2, 1, 1, 4])) == (1, 4)  # a label beyond the channels


def test_the_floor_decides_and_the_line_says_why():
    assert Agreement(50, 100).keeps_distillation and AGREEMENT_FLOOR == 0.5
    low = Agreement(34, 100)
    assert not low.keeps_distillation
    assert low.describe() == (
        "the starting model agrees with 34 % of the painted voxels (34 of 100): distillation "
        "off, it would hold the model to the predictions the painting corrects (at least 50 % "
        "keeps it)")
    assert Agreement(0, 0).share == 1.0  # nothing painted in the patches: nothing against it


def test_a_starting_model_that_gets_the_painting_wrong_trains_without_distillation():
    trainer = make_trainer(steps=2, batch_size=2, distillation_check=True)
    events = list(trainer.run())
    assert trainer.distillation == 0.0
    line = trainer.recovery_log[0]
    assert line.startswith("the starting model agrees with ") and "distillation off" in line
    assert [e.distillation for e in events] == ["off"] * len(events)
    assert trainer.steps_done == 2


@pytest.mark.parametrize("overrides", [
    {},  # a Finetuner built directly does what its config says
    {"distillation_check": True, "explicit_settings": ("distillation",)},  # the user chose it
])
def test_distillation_stays_when_not_checked_or_chosen(overrides):
    trainer = make_trainer(steps=1, batch_size=2, **overrides)
    events = list(trainer.run())
    assert trainer.distillation == 0.5 and events[-1].distillation == "on"
    assert not any("agrees with" in line for line in trainer.recovery_log)


def test_measuring_draws_nothing_from_the_run():
    measured = make_trainer(steps=1, batch_size=2)
    measured.build()
    sampler = measured.sampler
    assert sampler is not None
    agreement = painted_agreement(measured.model, sampler, measured.device)
    assert agreement.painted > 0
    after = sampler.sample(2)
    fresh = make_trainer(steps=1, batch_size=2)
    fresh.build()
    assert fresh.sampler is not None
    before = fresh.sampler.sample(2)
    for a, b in zip(after, before, strict=True):
        np.testing.assert_array_equal(a, b)
