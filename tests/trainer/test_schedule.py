"""The learning rate of step k: warm-up, cosine decay, and no advance for a redone step."""

import math

import pytest
from engine_setup import make_trainer

from napari_finetune.testing import faults
from napari_finetune.trainer.schedule import (
    FINAL_FRACTION,
    WARMUP_START,
    apply_learning_rate,
    learning_rate_factor,
)


def test_constant_is_one_at_every_step():
    assert {learning_rate_factor(k, 50, "constant") for k in range(1, 60)} == {1.0}


def test_cosine_rate_at_step_k_worked_by_hand():
    # 100 steps: 5 warm-up steps from 0.1 (0.1, 0.28, 0.46, 0.64, 0.82), then the
    # cosine over steps 6..100 (94 intervals): 1 at step 6, halfway (0.525) at
    # step 53, 0.05 at step 100.
    expected = {1: 0.1, 2: 0.28, 3: 0.46, 4: 0.64, 5: 0.82, 6: 1.0, 53: 0.525, 100: 0.05}
    for step, factor in expected.items():
        assert learning_rate_factor(step, 100, "cosine") == pytest.approx(factor)
    assert learning_rate_factor(7, 100, "cosine") == pytest.approx(
        FINAL_FRACTION + (1 - FINAL_FRACTION) * 0.5 * (1 + math.cos(math.pi / 94))
    )
    assert learning_rate_factor(130, 100, "cosine") == pytest.approx(FINAL_FRACTION)
    factors = [learning_rate_factor(k, 100, "cosine") for k in range(6, 101)]
    assert all(a > b for a, b in zip(factors, factors[1:], strict=False))


def test_short_runs_warm_up_for_one_step_or_not_at_all():
    assert learning_rate_factor(1, 1, "cosine") == pytest.approx(1.0)
    assert learning_rate_factor(1, 2, "cosine") == pytest.approx(1.0)
    assert learning_rate_factor(2, 2, "cosine") == pytest.approx(FINAL_FRACTION)
    assert learning_rate_factor(1, 3, "cosine") == pytest.approx(WARMUP_START)


def test_unknown_schedule_is_one_clear_error():
    with pytest.raises(ValueError, match="use 'constant' or 'cosine'"):
        learning_rate_factor(1, 10, "linear")


def test_groups_keep_their_ratio():
    import torch

    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [a], "lr": 1e-3}, {"params": [b], "lr": 1e-4}])
    for step in (1, 7, 10):
        apply_learning_rate(opt, step, 10, "cosine")
        factor = learning_rate_factor(step, 10, "cosine")
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * factor)
        assert opt.param_groups[1]["lr"] == pytest.approx(1e-4 * factor)


def _rates_of_applied_steps(trainer):
    """The rate of every optimizer step that ran (wrapping the built optimizer)."""
    trainer.build()
    optimizer = trainer.optimizer
    rates = []
    step = optimizer.step

    def recording_step(*args, **kwargs):
        rates.append(optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    optimizer.step = recording_step
    return rates


def test_a_run_applies_the_rate_of_each_step():
    trainer = make_trainer(steps=6, batch_size=2, lr_schedule="cosine", learning_rate=2e-3)
    rates = _rates_of_applied_steps(trainer)
    list(trainer.run())
    expected = [2e-3 * learning_rate_factor(k, 6, "cosine") for k in range(1, 7)]
    assert rates == pytest.approx(expected)
    assert rates[0] < rates[1] and rates[-1] < rates[1]


def test_a_step_redone_after_out_of_memory_keeps_its_rate():
    trainer = make_trainer(steps=3, batch_size=8, lr_schedule="cosine")
    rates = _rates_of_applied_steps(trainer)
    run = trainer.run()
    assert next(run).kind == "probe"
    faults.oom_in_backward_above_batch(trainer.model, 4)  # step 1 fails, redone at 4 x 2
    events = list(run)
    assert [e.kind for e in events] == ["recovery", "step", "step", "step", "finished"]
    # One rate per applied step, and the schedule did not advance for the failed attempt.
    expected = [1e-3 * learning_rate_factor(k, 3, "cosine") for k in (1, 2, 3)]
    assert rates == pytest.approx(expected)
