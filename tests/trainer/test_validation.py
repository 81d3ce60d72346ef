"""Live validation on held-out strokes, best-step weights and early stopping."""

from __future__ import annotations

import itertools
import math
import time

import dask.array as da
import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.data.holdout import HeldOut
from napari_finetune.data.normalization import missing_mask
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.trainer import validation
from napari_finetune.trainer.validation import Counts, Validator


def free_checks(trainer):
    """A clock that never moves: checks cost nothing, so one is due every ``every`` steps."""
    trainer.validator.clock = lambda: 0.0
    return trainer


def test_steps_carry_scores_on_held_out_strokes(tmp_path):
    trainer = make_trainer(steps=4, batch_size=2, validation_fraction=0.2, validation_every=2)
    events = list(trainer.run())
    steps = [e for e in events if e.kind == "step"]
    assert [s.validation is None for s in steps] == [True, False, False, False]
    checked = [s for s in steps if "validation at step" in s.message]
    assert [s.step for s in checked] == [2, 4]
    scores = checked[-1].validation
    assert set(scores) == {"channel_0"}  # the only channel painted
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert trainer.sampler.holdout.voxels  # something really was held out
    run = load_checkpoint(trainer.export(tmp_path / "v.pt")).metadata["run"]
    assert [step for step, _ in run["validation_history"]] == [2, 4]
    assert run["validation"] == scores


def test_checks_do_not_disturb_training():
    """Weights after 3 steps: the same whether the held-out voxels were scored after every
    step or only at the end (BatchNorm statistics, RNG and gradients untouched)."""

    def weights(every: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4, norm="batch")
        trainer = make_trainer(model=model, steps=3, batch_size=2, validation_fraction=0.2,
                               validation_every=every, patch_shape=(8, 16, 16))
        list(free_checks(trainer).run())
        assert len(trainer.validator.history) == (3 if every == 1 else 1)
        return {k: v.clone() for k, v in trainer.model.state_dict().items()}

    often, once = weights(1), weights(100)
    for name, value in often.items():
        torch.testing.assert_close(value, once[name], rtol=0, atol=0)


def _scripted_scores(monkeypatch, values):
    """Make each check report the next mean IoU of ``values`` (the scoring itself is
    tested above); what is under test is what the trainer does with the scores."""
    source = iter(values)
    monkeypatch.setattr(
        validation, "score_holdout", lambda trainer: {"channel-0": next(source)}
    )


def test_the_best_step_is_kept_and_exported(monkeypatch, tmp_path):
    _scripted_scores(monkeypatch, [0.3, 0.9, 0.5, 0.4])
    trainer = free_checks(
        make_trainer(steps=4, batch_size=2, validation_fraction=0.2, validation_every=1)
    )
    snapshots = {}
    for status in trainer.run():
        if status.kind == "step":
            snapshots[status.step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    final = status
    assert final.kind == "finished" and "kept the weights of step 2" in final.message
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(value, snapshots[2][name], rtol=0, atol=0)
    run = load_checkpoint(trainer.export(tmp_path / "best.pt")).metadata["run"]
    assert run["weights_from_step"] == 2 and run["best_validation_step"] == 2
    assert run["steps_done"] == 4 and run["ended"] == "finished"


def test_a_best_check_within_the_scores_noise_keeps_the_last_step(monkeypatch, tmp_path):
    """Step 2 led the last check by 0.01: not a better model, the held-out strokes'
    noise; the last step's weights stay (the demo kept such a step and got worse
    objects on the unpainted half)."""
    _scripted_scores(monkeypatch, [0.3, 0.81, 0.5, 0.80])
    trainer = free_checks(
        make_trainer(steps=4, batch_size=2, validation_fraction=0.2, validation_every=1)
    )
    for status in trainer.run():
        if status.kind == "step":
            last = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert status.kind == "finished" and "kept the weights" not in status.message
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(value, last[name], rtol=0, atol=0)
    run = load_checkpoint(trainer.export(tmp_path / "last.pt")).metadata["run"]
    assert run["weights_from_step"] is None and run["best_validation_step"] == 2


@pytest.mark.parametrize(
    ("best", "restored"),
    [(0.5199, False), (0.52, False), (0.5201, True)],
    ids=["just-below-the-margin", "exactly-the-margin", "just-above-the-margin"],
)
def test_keep_best_restores_only_a_lead_of_more_than_the_margin(monkeypatch, best, restored):
    """The last check scored 0.50; the best (step 1) led it by 0.0199, 0.02 or 0.0201."""
    assert validation.KEEP_BEST_MARGIN == 0.02
    assert 0.5 + validation.KEEP_BEST_MARGIN == 0.52  # exact in binary: a true boundary
    _scripted_scores(monkeypatch, [best, 0.5])
    model = torch.nn.Linear(2, 1)
    validator = Validator(every=1, clock=lambda: 0.0)
    validator.start()
    validator.check(None, model, 1)
    at_best = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    validator.check(None, model, 2)
    at_last = {k: v.clone() for k, v in model.state_dict().items()}
    assert validator.best.step == 1 and validator.best.score == best
    line = validator.restore_best(model, 2)
    expected = at_best if restored else at_last
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0)
    if restored:
        assert line == (f"kept the weights of step 1 (validation {best:.2f}), "
                        "better than the last step's (0.50 at step 2)")
        assert validator.restored_step == 1 and validator.record()["weights_from_step"] == 1
    else:
        assert line is None and validator.restored_step is None


def test_keep_best_off_exports_the_last_step(monkeypatch, tmp_path):
    _scripted_scores(monkeypatch, [0.3, 0.9, 0.5, 0.4])
    trainer = make_trainer(steps=4, batch_size=2, validation_fraction=0.2, validation_every=1,
                           keep_best=False)
    last = None
    for status in free_checks(trainer).run():
        if status.kind == "step":
            last = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert status.kind == "finished" and "kept the weights" not in status.message
    assert trainer.validator.restored_step is None
    # The last step's weights, not the best check's (step 2), are what is exported.
    exported = load_checkpoint(trainer.export(tmp_path / "last.pt"))
    for name, value in exported.model.state_dict().items():
        torch.testing.assert_close(value, last[name], rtol=0, atol=0)
    run = exported.metadata["run"]
    assert run["weights_from_step"] is None and run["best_validation_step"] == 2


def test_early_stop_after_checks_without_improvement(monkeypatch, tmp_path):
    _scripted_scores(monkeypatch, itertools.chain([0.5, 0.6], itertools.repeat(0.55)))
    trainer = make_trainer(steps=20, batch_size=2, validation_fraction=0.2, validation_every=1,
                           early_stop_checks=3)
    events = list(free_checks(trainer).run())
    assert trainer.steps_done == 5  # best at 2, then 3 checks without improvement
    assert events[-1].kind == "finished" and "early stop" in events[-1].message
    run = load_checkpoint(trainer.export(tmp_path / "early.pt")).metadata["run"]
    assert run["ended"].startswith("early stop") and run["weights_from_step"] == 2


@pytest.mark.parametrize("bad", [{"validation_fraction": 1.0}, {"validation_fraction": -0.1},
                                 {"validation_every": 0}, {"early_stop_checks": -1}])
def test_bad_validation_settings_are_one_line(bad):
    from napari_finetune.config import FinetuneConfig

    with pytest.raises(ValueError) as info:
        FinetuneConfig(**bad)
    assert "\n" not in str(info.value)


# --- scoring: one patch per held-out tile, batched, the same counts as tile by tile ---


def test_tally_by_hand():
    """A 2 x 4 painting and two channels' probabilities, the IoU worked out by hand.

    painting (0 unpainted, 1 background, 2 channel 0, 3 channel 1):
        2 2 2 1
        3 3 0 1
    channel 0 probabilities (> 0.5 is predicted; 0.5 itself is not):
        .9 .8 .5 .1     predicted: (0,0) (0,1) (1,0) (1,2)
        .7 .2 .6 .3     positives: (0,0) (0,1) (0,2)
      TP (0,0) (0,1) = 2; FP (1,0), painted channel 1 = 1 ((1,2) is unpainted, not
      judged); FN (0,2), at exactly 0.5 = 1. IoU = 2 / (2 + 1 + 1) = 0.5.
    channel 1 probabilities:
        .1 .2 .9 .6     predicted: (0,2) (0,3) (1,0) (1,2)
        .8 .4 .99 .0    positives: (1,0) (1,1)
      TP (1,0) = 1; FP (0,2) painted channel 0, (0,3) painted background = 2
      ((1,2) unpainted); FN (1,1) = 1. IoU = 1 / (1 + 2 + 1) = 0.25.
    """
    labels = np.array([[2, 2, 2, 1], [3, 3, 0, 1]])
    probabilities = np.array(
        [
            [[0.9, 0.8, 0.5, 0.1], [0.7, 0.2, 0.6, 0.3]],
            [[0.1, 0.2, 0.9, 0.6], [0.8, 0.4, 0.99, 0.0]],
        ],
        np.float32,
    )
    counts = [Counts(), Counts()]
    validation.tally(probabilities, labels, [0, 1], counts)
    assert counts == [Counts(tp=2, fp=1, fn=1), Counts(tp=1, fp=2, fn=1)]
    assert [c.iou for c in counts] == [0.5, 0.25]
    # A second region adds to the same counts: the IoU is of the sums, not a mean of IoUs.
    # Channel 1 alone here, everything predicted, all four voxels painted channel 1:
    # TP 4, so channel 1 sums to TP 5, FP 2, FN 1, IoU 5 / 8.
    alone = [counts[1]]
    validation.tally(np.ones((2, 1, 4), np.float32), np.full((1, 4), 3), [1], alone)
    assert alone[0] == Counts(tp=5, fp=2, fn=1) and alone[0].iou == 0.625
    assert Counts().iou == 0.0  # nothing positive, nothing predicted


def tile_by_tile_counts(trainer, channels):
    """The oracle: each held-out tile alone, in the patch centred on it (shifted inside
    the volume), predicted by itself through ``Finetuner.predict`` (fp32, batch of one),
    its painting read straight from the corrections."""
    sampler = trainer.sampler
    holdout = sampler.holdout
    counts = [Counts() for _ in channels]
    for tile in sorted(holdout.tiles):
        box = holdout.tile_box(tile)
        window = []
        for b, p, s in zip(box, sampler.patch_shape, sampler.shape, strict=True):
            start = min(max((b.start + b.stop) // 2 - p // 2, 0), s - p)
            window.append(slice(start, start + p))
        window = tuple(window)
        probabilities = trainer.predict(window)
        inner = tuple(slice(b.start - w.start, b.stop - w.start)
                      for b, w in zip(box, window, strict=True))
        labels = np.asarray(trainer.corrections[box]).astype(np.int64)
        missing = missing_mask(np.asarray(trainer.image[box]))
        if missing is not None:
            labels[missing] = 0
        validation.tally(probabilities[(slice(None),) + inner], labels, channels, counts)
    return counts


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask+region-cache"])
def test_batched_scoring_counts_equal_tile_by_tile(lazy):
    trainer = make_trainer(steps=4, batch_size=3, validation_fraction=0.4, validation_every=100,
                           patch_shape=(4, 8, 8))
    if lazy:  # a store-like image: the check reads it through the run's region cache
        trainer.image = da.from_array(trainer.image, chunks=(4, 8, 8))
        trainer.corrections = da.from_array(trainer.corrections, chunks=(4, 8, 8))
    list(free_checks(trainer).run())  # a few steps: the model is no longer its random start
    if lazy:
        assert trainer.sampler.caches is not None
    holdout = trainer.sampler.holdout
    windows = validation.plan_windows(holdout, trainer.sampler.patch_shape)
    assert len(holdout.tiles) >= 4  # several tiles, so batching and sharing are exercised
    passes = []
    handle = trainer.model.register_forward_hook(lambda m, i, o: passes.append(len(i[0])))
    try:
        batched = validation.count_holdout(trainer, [0])
    finally:
        handle.remove()
    assert passes == [min(3, len(windows) - k) for k in range(0, len(windows), 3)]
    assert sum(c.tp + c.fp + c.fn for c in batched) > 0  # something was judged
    expected = tile_by_tile_counts(trainer, [0])
    assert [(c.tp, c.fp, c.fn) for c in batched] == [(c.tp, c.fp, c.fn) for c in expected]


def test_tiles_whose_windows_coincide_are_predicted_once():
    # z (4) is shorter than the patch (8): every tile of a YX column shares one window.
    holdout = HeldOut((4, 8, 8), (4, 32, 32), frozenset({(0, 0, 0), (0, 1, 1), (0, 3, 3)}))
    plan = validation.plan_windows(holdout, (8, 16, 16))
    assert len(plan) == 3
    holdout = HeldOut((4, 8, 8), (8, 32, 32), frozenset({(0, 1, 1), (1, 1, 1)}))
    plan = validation.plan_windows(holdout, (8, 16, 16))
    assert list(plan.values()) == [[(0, 1, 1), (1, 1, 1)]]  # z: both in the whole axis
    for key, tiles in plan.items():
        for tile in tiles:
            box = holdout.tile_box(tile)
            assert all(a <= b.start and b.stop <= z for (a, z), b in zip(key, box, strict=True))


# --- the schedule: checks paid for by training time, measured on an injected clock ---


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowScorer:
    """Stands in for the trainer: each check takes ``cost`` seconds on the fake clock."""

    def __init__(self, clock: FakeClock, cost: float) -> None:
        self.clock, self.cost = clock, cost


def simulate(monkeypatch, steps, every, step_s, check_s):
    """Run ``steps`` steps of ``step_s`` seconds with checks of ``check_s`` seconds;
    (checked steps, share of the wall time spent in checks)."""
    clock = FakeClock()

    def score(scorer):
        clock.now += check_s
        return {"channel-0": 0.5}

    monkeypatch.setattr(validation, "score_holdout", score)
    validator = Validator(every, clock=clock)
    model = torch.nn.Linear(1, 1)
    validator.start()
    checked = []
    for step in range(1, steps + 1):
        clock.now += step_s
        if validator.due(step, steps):
            validator.check(None, model, step)
            checked.append(step)
    spent = len(checked) * check_s
    return checked, spent / clock.now


@pytest.mark.parametrize("check_s", [5.0, 20.0])
def test_slow_checks_stay_within_a_tenth_of_the_wall_time(monkeypatch, check_s):
    checked, share = simulate(monkeypatch, steps=1000, every=1, step_s=1.0, check_s=check_s)
    assert share <= validation.CHECK_SHARE
    assert checked[0] == 1 and checked[-1] == 1000  # the first as soon as allowed, and the last
    assert len(checked) >= 3  # still checks along the way
    gaps = np.diff(checked[:-1]) if len(checked) > 2 else []
    assert all(gap >= 9 * check_s for gap in gaps)  # 9x the cost of training in between


def test_cheap_checks_run_every_validation_every_steps(monkeypatch):
    checked, share = simulate(monkeypatch, steps=50, every=7, step_s=1.0, check_s=0.01)
    assert checked == [7, 14, 21, 28, 35, 42, 49, 50]
    assert share < 0.01


def test_validation_every_bounds_checks_that_are_free(monkeypatch):
    checked, _ = simulate(monkeypatch, steps=30, every=4, step_s=1.0, check_s=0.0)
    assert checked == [4, 8, 12, 16, 20, 24, 28, 30]


def test_a_slow_check_in_a_run_is_not_repeated(monkeypatch):
    """On a real run, a check that looks slow on the injected clock (an hour) is made
    once as soon as allowed and once after the last step, and not in between."""
    trainer = make_trainer(steps=6, batch_size=2, validation_fraction=0.2, validation_every=1)
    offset = [0.0]
    trainer.validator.clock = lambda: time.perf_counter() + offset[0]
    score = validation.score_holdout

    def slow(scorer):
        offset[0] += 3600.0
        return score(scorer)

    monkeypatch.setattr(validation, "score_holdout", slow)
    list(trainer.run())
    assert [step for step, _ in trainer.validator.history] == [1, 6]
    assert trainer.validator.spent_s >= 7200.0
    assert math.isclose(trainer.validator.last_cost_s, 3600.0, rel_tol=1e-3)
