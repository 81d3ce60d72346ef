"""Live validation on held-out strokes, best-step weights and early stopping."""

from __future__ import annotations

import itertools

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.trainer import validation


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
        list(trainer.run())
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
    trainer = make_trainer(steps=4, batch_size=2, validation_fraction=0.2, validation_every=1)
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


def test_keep_best_off_exports_the_last_step(monkeypatch):
    _scripted_scores(monkeypatch, [0.3, 0.9, 0.5, 0.4])
    trainer = make_trainer(steps=4, batch_size=2, validation_fraction=0.2, validation_every=1,
                           keep_best=False)
    list(trainer.run())
    assert trainer.validator.restored_step is None


def test_early_stop_after_checks_without_improvement(monkeypatch, tmp_path):
    _scripted_scores(monkeypatch, itertools.chain([0.5, 0.6], itertools.repeat(0.55)))
    trainer = make_trainer(steps=20, batch_size=2, validation_fraction=0.2, validation_every=1,
                           early_stop_checks=3)
    events = list(trainer.run())
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
