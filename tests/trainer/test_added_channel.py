"""A channel the teacher does not have: supervised where painted, never distilled nor held."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_setup import make_trainer, volume

from napari_finetune.model.add_channel import (
    STARTING_CHANNELS_KEY,
    add_output_channel,
)
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.losses import (
    corrected_channels,
    finetune_loss,
    needs_teacher,
    step_normalisers,
)
from napari_finetune.trainer.teacher import FrozenCopyTeacher


def _logit_grads(labels, corrected, teacher_probs, distillation, hold, taught):
    logits = torch.zeros((1, 3, labels.shape[1]), requires_grad=True)
    norms = step_normalisers(labels, corrected, distillation, hold, taught)
    finetune_loss(logits, labels, corrected, norms, teacher_probs, distillation, hold).backward()
    assert logits.grad is not None
    return norms, logits.grad[0]


def test_the_new_channel_learns_only_where_painted():
    # Channels 0, 1 the teacher's; channel 2 new (label 4). Voxels: unpainted,
    # background, channel 0, the new channel.
    labels = torch.tensor([[0, 1, 2, 4]])
    corrected = corrected_channels([1, 2, 4], 3)
    assert corrected.tolist() == [True, False, True]
    teacher = torch.full((1, 2, 4), 0.7)  # the old channel count
    norms, grad = _logit_grads(labels, corrected, teacher, 0.5, True, taught=2)
    # Distillation: unpainted voxels of corrected channels the teacher has (channel 0 only).
    assert norms.distillation == 1 * 1
    # Hold: channel 1 everywhere; the new channel is uncorrected by no teacher.
    assert norms.hold == 4 * 1
    assert norms.supervised == 3 * 2
    assert grad[2, 0] == 0  # the new channel, unpainted: nothing pulls it
    assert (grad[2, 1:] != 0).all()  # painted: background, another channel, its own
    assert grad[2, 3] < 0  # its own label: pushed up
    assert grad[0, 0] != 0 and (grad[1] != 0).all()  # the old ones follow the teacher


def test_an_unpainted_new_channel_is_neither_held_nor_distilled():
    labels = torch.tensor([[0, 1, 2, 0]])
    corrected = corrected_channels([1, 2], 3)
    teacher = torch.full((1, 2, 4), 0.3)
    norms, grad = _logit_grads(labels, corrected, teacher, 0.5, True, taught=2)
    assert norms.hold == 4 * 1  # channel 1 only
    assert (grad[2] == 0).all()
    # Without the count, the same call holds all three: the test can tell.
    full = step_normalisers(labels, corrected, 0.5, True)
    assert full.hold == 4 * 2


def test_no_teacher_is_made_for_a_new_channel_alone():
    corrected = torch.tensor([True, True, False])
    assert not needs_teacher(corrected, 0.0, True, taught=2)
    assert needs_teacher(corrected, 0.0, True)
    assert needs_teacher(corrected, 0.5, False, taught=2)


def test_the_teacher_gives_the_starting_channels_only():
    model = UNet(dims=3, out_channels=2, depth=1, features=4)
    wide = add_output_channel(model, "nuclei", "object")
    x = torch.randn(1, 1, 8, 8, 8)
    teacher = FrozenCopyTeacher(wide, channels=2)
    out = teacher(x)
    assert out.shape[1] == 2
    with torch.no_grad():
        torch.testing.assert_close(out, model.eval()(x), rtol=0, atol=0)


def _widened_checkpoint(tmp_path, own_weights=True):
    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4)
    path = save_checkpoint(tmp_path / "m.pt", model, {"channel_names": ["a", "b"]})
    return add_output_channel(load_checkpoint(path), "nuclei", "object",
                              own_weights=own_weights)


def _outputs(model, x):
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_training_an_added_channel_leaves_the_old_outputs_bit_identical(tmp_path, mode):
    ckpt = _widened_checkpoint(tmp_path)
    x = torch.randn(2, 1, 8, 16, 16, generator=torch.Generator().manual_seed(3))
    before = _outputs(ckpt.model, x).clone()
    own_before = ckpt.model.added[0].encoders[0][0].weight.detach().clone()
    image, corrections = volume()
    corrections[2:6, 20:28, 4:12] = 4
    trainer = make_trainer(model=ckpt.model, metadata=ckpt.metadata, steps=3, mode=mode,
                           learning_rate=1e-2)
    trainer.corrections = corrections
    for _ in trainer.run():
        pass
    assert trainer.steps_done == 3
    tuned = load_checkpoint(trainer.export(tmp_path / "tuned.pt"))
    after = _outputs(tuned.model, x)
    torch.testing.assert_close(after[:, :2], before[:, :2], rtol=0, atol=0)
    # The channel's own weights did train (else the identity above says nothing).
    assert not torch.equal(tuned.model.added[0].encoders[0][0].weight, own_before)
    assert not torch.equal(after[:, 2], before[:, 2])
    assert tuned.model.init_kwargs["added_channels"] == 1


def test_an_output_row_alone_still_trains_every_weight(tmp_path):
    # An output row only, the layout of other models: the old channels move with the run.
    ckpt = _widened_checkpoint(tmp_path, own_weights=False)
    assert not len(ckpt.model.added) and ckpt.model.head.out_channels == 3
    x = torch.randn(1, 1, 8, 16, 16, generator=torch.Generator().manual_seed(3))
    before = _outputs(ckpt.model, x).clone()
    image, corrections = volume()
    corrections[2:6, 20:28, 4:12] = 4
    trainer = make_trainer(model=ckpt.model, metadata=ckpt.metadata, steps=2,
                           learning_rate=1e-2)
    trainer.corrections = corrections
    for _ in trainer.run():
        pass
    after = _outputs(load_checkpoint(trainer.export(tmp_path / "t.pt")).model, x)
    assert not torch.equal(after[:, :2], before[:, :2])


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_run_distils_the_old_channels_and_trains_the_new_one(tmp_path, mode):
    ckpt = _widened_checkpoint(tmp_path)
    image, corrections = volume()
    corrections[2:6, 20:28, 4:12] = 4  # the new channel's label: 2 + 2 old channels
    trainer = make_trainer(model=ckpt.model, metadata=ckpt.metadata, steps=3, mode=mode)
    trainer.corrections = corrections
    trainer.build()
    assert trainer.starting_channels == 2
    assert trainer.teacher is not None and trainer.teacher.channels == 2
    x = torch.zeros((1, 1, 4, 8, 8))
    assert trainer.teacher(x).shape[1] == 2
    before = trainer.predict(np.s_[2:6, 16:32, 0:16])[2, :, 4:12, 4:12].mean()
    for _ in trainer.run():
        pass
    assert trainer.steps_done == 3
    after = trainer.predict(np.s_[2:6, 16:32, 0:16])[2, :, 4:12, 4:12].mean()
    assert after > before  # painted as the new structure: it rises
    out = trainer.export(tmp_path / "tuned.pt")
    tuned = load_checkpoint(out)
    assert tuned.channel_names == ["a", "b", "nuclei"]
    # The export is the next run's teacher for all three channels.
    assert STARTING_CHANNELS_KEY not in tuned.metadata


def test_the_new_row_is_fitted_on_the_painting_before_the_first_step(tmp_path):
    ckpt = _widened_checkpoint(tmp_path)
    image, corrections = volume()
    # The bright cube (channel 0's strokes) painted as the new structure instead.
    corrections[corrections == 2] = 4
    trainer = make_trainer(model=ckpt.model, metadata=ckpt.metadata, steps=1)
    trainer.corrections = corrections
    old_rows = ckpt.model.head.weight.detach().clone()
    trainer.build()
    assert any("channel 2 fitted on" in line for line in trainer.recovery_log)
    assert trainer.model.added[0].head.weight.abs().sum() > 0  # no longer the zero row
    torch.testing.assert_close(trainer.model.head.weight.detach(), old_rows, rtol=0, atol=0)
    probs = trainer.predict(np.s_[:, :, :])
    # A random 4-feature UNet separates them a little (0.50 vs 0.45); the zero row not at all.
    assert probs[2][corrections == 4].mean() > probs[2][corrections == 1].mean() + 0.03


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_run_keeps_the_old_channels_batchnorm_statistics(tmp_path, mode):
    # With BatchNorm, training mode updates every BatchNorm's running statistics on
    # each forward; the old channels' layers must keep theirs (their outputs in eval
    # mode read them), while the added channel's copy learns its own.
    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4, norm="batch")
    path = save_checkpoint(tmp_path / "bn.pt", model, {"channel_names": ["a", "b"]})
    ckpt = add_output_channel(load_checkpoint(path), "nuclei", "object")
    old = {n: b.detach().clone() for n, b in ckpt.model.named_buffers()
           if not n.startswith("added.")}
    own = {n: b.detach().clone() for n, b in ckpt.model.named_buffers()
           if n.startswith("added.") and n.endswith("running_mean")}
    assert any("running_mean" in n for n in old) and own
    x = torch.randn(2, 1, 8, 16, 16, generator=torch.Generator().manual_seed(3))
    before = _outputs(ckpt.model, x).clone()
    image, corrections = volume()
    corrections[2:6, 20:28, 4:12] = 4
    trainer = make_trainer(model=ckpt.model, metadata=ckpt.metadata, steps=3, mode=mode,
                           learning_rate=1e-2)
    trainer.corrections = corrections
    for _ in trainer.run():
        pass
    tuned = load_checkpoint(trainer.export(tmp_path / "tuned.pt"))
    buffers = dict(tuned.model.named_buffers())
    for name, value in old.items():
        torch.testing.assert_close(buffers[name], value, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(_outputs(tuned.model, x)[:, :2], before[:, :2], rtol=0, atol=0)
    # The copy's statistics did move (else the checks above could pass on a run that
    # froze every BatchNorm, the new channel's too).
    assert any(not torch.equal(buffers[n], v) for n, v in own.items())
