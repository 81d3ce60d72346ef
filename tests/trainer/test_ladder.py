"""The ladder climbs back after transient out-of-memory, and retries at the bottom rung."""

from __future__ import annotations

import pytest
import torch
from engine_setup import count_calls, make_trainer

from napari_finetune import testing
from napari_finetune.trainer.recovery import RecoveryError


def run_all(trainer):
    return list(trainer.run())


def test_a_transient_oom_does_not_use_up_the_ladder():
    trainer = make_trainer(steps=6, batch_size=4)
    trainer.build()
    trainer.climb.climb_after = 3
    fault = testing.oom_above_batch(trainer.model, 2, times=1)  # once, in the probe
    calls = count_calls(trainer.optimizer)
    events = run_all(trainer)
    assert fault.count == 1 and calls[0] == 6 and trainer.steps_done == 6
    climbed = [e for e in events if "climbing back" in e.message]
    assert len(climbed) == 1 and climbed[0].step == 3
    assert climbed[0].message == (
        "no out-of-memory for 3 steps: climbing back from batch 2 × accumulation 2 to "
        "4 × 1 (effective 4)"
    )
    assert (climbed[0].batch_size, climbed[0].accumulation) == (4, 1)
    assert (trainer.batch_size, trainer.accumulation) == (4, 1)
    assert all(e.effective_batch == 4 for e in events)


def test_a_failed_climb_steps_down_again_and_loses_no_step():
    trainer = make_trainer(steps=7, batch_size=4)
    trainer.build()
    trainer.climb.climb_after = 2
    testing.oom_above_batch(trainer.model, 2)  # batch 4 never fits
    calls = count_calls(trainer.optimizer)
    events = run_all(trainer)
    assert calls[0] == 7 and events[-1].kind == "finished"
    # Each failed climb doubles the wait before that rung is tried again: 2, then 4.
    climbs = [e.step for e in events if "climbing back" in e.message]
    assert climbs == [2, 6]
    assert sum("batch 4 → 2" in e.message for e in events) == 3  # the probe, steps 3 and 7
    assert events[-1].distillation == "on"  # a failed climb never frees the teacher


def test_the_bottom_rung_retries_the_same_step_before_giving_anything_up():
    trainer = make_trainer(steps=2, batch_size=1)
    trainer.build()
    teacher = trainer.teacher
    calls = count_calls(trainer.optimizer)
    state = {"n": 0}

    def flaky(_module, _args):
        state["n"] += 1
        # The probe's forward is call 1; step 1's first two tries fail.
        if state["n"] in (2, 3):
            raise torch.OutOfMemoryError("CUDA out of memory. Transient (injected)")

    trainer.model.register_forward_pre_hook(flaky)
    events = run_all(trainer)
    retries = [e.message for e in events if "retrying the same step" in e.message]
    assert retries == [
        "out of memory at step 1 at the bottom rung (batch 1 × accumulation 1): emptied the "
        f"cache, retrying the same step ({i} of 3)"
        for i in (1, 2)
    ]
    assert trainer.teacher is teacher and events[-1].distillation == "on"
    assert calls[0] == 2 and events[-1].kind == "finished"


def test_always_oom_still_ends_after_the_retries_and_the_teacher():
    trainer = make_trainer(steps=2, batch_size=1)
    trainer.build()
    events = []
    with pytest.raises(RecoveryError) as info:
        for event in trainer.run():
            events.append(event)
            if event.kind == "probe" and "precision probe" in event.message:
                testing.always_oom(trainer.model)  # from step 1 on, for ever
    text = str(info.value)
    assert text.count("retrying the same step") == 6  # 3 with the teacher, 3 without
    assert "dropped distillation" in text
