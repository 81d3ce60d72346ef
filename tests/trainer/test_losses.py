"""Label semantics of the losses and whole-step normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from engine_setup import make_trainer

from napari_finetune.trainer.losses import (
    HOLD_WEIGHT,
    corrected_channels,
    finetune_loss,
    needs_teacher,
    step_normalisers,
)
from napari_finetune.trainer.micro_batches import split_sizes
from napari_finetune.trainer.step import accumulate_gradients


def test_corrected_channels():
    assert corrected_channels([1, 2], 3).tolist() == [True, False, False]
    assert corrected_channels([2, 4], 3).tolist() == [True, False, True]
    # Only background painted: every channel counts as corrected.
    assert corrected_channels([1], 3).tolist() == [True, True, True]
    assert needs_teacher(torch.tensor([True, False]), 0.0, True)
    assert not needs_teacher(torch.tensor([True, True]), 0.0, True)
    assert not needs_teacher(torch.tensor([True, False]), 0.0, False)


def _bce(logit, target):
    return F.binary_cross_entropy_with_logits(torch.tensor(logit), torch.tensor(target)).item()


def test_supervised_targets_follow_the_label_semantics():
    # 3 channels, channel 0 and 1 corrected, channel 2 untouched; 4 voxels:
    # unpainted, background, channel 0, channel 1.
    labels = torch.tensor([[0, 1, 2, 3]])
    logits = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [0.9, 1.0, 1.1, 1.2]]])
    corrected = corrected_channels([1, 2, 3], 3)
    norms = step_normalisers(labels, corrected, distillation=0.0, hold=False)
    assert norms.supervised == 3 * 2
    loss = finetune_loss(logits, labels, corrected, norms)
    expected = (
        _bce(0.2, 0.0) + _bce(0.6, 0.0)  # background: negative for corrected 0 and 1
        + _bce(0.3, 1.0) + _bce(0.7, 0.0)  # channel 0: positive 0, negative 1
        + _bce(0.4, 0.0) + _bce(0.8, 1.0)  # channel 1: negative 0, positive 1
    ) / 6  # channel 2 (uncorrected) and the unpainted voxel are not supervised
    assert abs(loss.item() - expected) < 1e-6


def test_distillation_on_unpainted_and_hold_on_other_channels():
    labels = torch.tensor([[0, 2]])
    logits = torch.tensor([[[0.1, 0.2], [0.3, 0.4]]])
    teacher = torch.tensor([[[0.25, 0.5], [0.75, 0.125]]])
    corrected = corrected_channels([2], 2)  # channel 0 corrected, channel 1 held
    norms = step_normalisers(labels, corrected, distillation=0.5, hold=True)
    assert (norms.supervised, norms.distillation, norms.hold) == (1, 1, 2)
    loss = finetune_loss(logits, labels, corrected, norms, teacher, 0.5, True)
    expected = (
        _bce(0.2, 1.0)  # painted channel-0 voxel
        + 0.5 * _bce(0.1, 0.25)  # teacher on the unpainted voxel, corrected channel
        + HOLD_WEIGHT * (_bce(0.3, 0.75) + _bce(0.4, 0.125)) / 2  # channel 1 everywhere
    )
    assert abs(loss.item() - expected) < 1e-6
    without = finetune_loss(logits, labels, corrected, norms, None, 0.5, True)
    assert abs(without.item() - _bce(0.2, 1.0)) < 1e-6


def test_split_sizes():
    assert split_sizes(5, 3) == [3, 2]
    assert split_sizes(8, 4) == [4, 4]
    assert split_sizes(8, 3) == [3, 3, 2]
    assert split_sizes(1, 8) == [1]
    assert sum(split_sizes(13, 2)) == 13 and max(split_sizes(13, 2)) == 2


def _grads(trainer, images, labels, sizes):
    trainer.model.zero_grad(set_to_none=True)
    loss = accumulate_gradients(
        trainer.parts, trainer.state, images, labels, micro_batches=sizes
    )
    return loss.item(), [p.grad.clone() for p in trainer.model.parameters()]


def test_batch_8_and_4x2_give_the_same_gradients():
    """Whole-step normalisation: how a step is cut does not change its gradients."""
    trainer = make_trainer(norm="group", batch_size=8, mode="full")
    trainer.build()
    images, labels = trainer.sampler.sample(8)
    loss8, g8 = _grads(trainer, images, labels, [8])
    for sizes in ([4, 4], [3, 3, 2], [1] * 8):
        loss, grads = _grads(trainer, images, labels, sizes)
        assert abs(loss - loss8) < 1e-6
        for a, b in zip(g8, grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_balanced_classes_weigh_each_painted_class_the_same():
    # One channel; three interior voxels (label 1) against one membrane voxel (label 2):
    # unbalanced, the interior weighs 3 / 4 of the term; balanced, each class 1 / 2.
    labels = torch.tensor([[0, 1, 1, 1, 2]])
    logits = torch.tensor([[[0.3, 0.5, -0.2, 0.8, -0.4]]])
    corrected = corrected_channels([1, 2], 1)
    plain = step_normalisers(labels, corrected, distillation=0.0, hold=False)
    balanced = step_normalisers(labels, corrected, 0.0, False, balance=True)
    assert plain.per_label == () and plain.label_weights() is None
    assert balanced.per_label == (3, 1)
    torch.testing.assert_close(balanced.label_weights(), torch.tensor([0.0, 4 / 6, 2.0]))
    interior = _bce(0.5, 0.0) + _bce(-0.2, 0.0) + _bce(0.8, 0.0)
    membrane = _bce(-0.4, 1.0)
    loss = finetune_loss(logits, labels, corrected, plain)
    assert abs(loss.item() - (interior + membrane) / 4) < 1e-6
    loss = finetune_loss(logits, labels, corrected, balanced)
    assert abs(loss.item() - (interior / 3 + membrane) / 2) < 1e-6


def test_balanced_classes_keep_the_step_cut_free():
    """The class counts are the whole step's: micro-batches give the same gradients."""
    trainer = make_trainer(norm="group", batch_size=8, mode="full")
    trainer.build()
    trainer.state.balance_classes = True
    images, labels = trainer.sampler.sample(8)
    loss8, g8 = _grads(trainer, images, labels, [8])
    trainer.state.balance_classes = False
    plain, _ = _grads(trainer, images, labels, [8])
    assert abs(plain - loss8) > 1e-6, "balancing changed nothing on this painting"
    trainer.state.balance_classes = True
    loss, grads = _grads(trainer, images, labels, [3, 3, 2])
    assert abs(loss - loss8) < 1e-6
    for a, b in zip(g8, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_config_balances_the_run():
    trainer = make_trainer(norm="group", batch_size=2, mode="full", balance_classes=True)
    assert trainer.state.balance_classes


def test_groups_weigh_the_membranes_against_the_rest():
    # Two channels, membrane (a boundary) and mitochondria: label 1 background (3 voxels),
    # 2 membrane (1), 3 mitochondria (1). Membranes are one group, the rest another: the
    # membrane weighs 1 / 2 of the term, background and mitochondria share the other half
    # in their voxels' proportion.
    labels = torch.tensor([[0, 1, 1, 1, 2, 3]])
    corrected = corrected_channels([1, 2, 3], 2)
    grouped = step_normalisers(labels, corrected, 0.0, False, balance=True, groups=(0, 1, 0))
    assert grouped.per_label == (3, 1, 1) and grouped.groups == (0, 1, 0)
    torch.testing.assert_close(grouped.label_weights(),
                               torch.tensor([0.0, 5 / 8, 5 / 2, 5 / 8]))
    every_class = step_normalisers(labels, corrected, 0.0, False, balance=True)
    torch.testing.assert_close(every_class.label_weights(),
                               torch.tensor([0.0, 5 / 9, 5 / 3, 5 / 3]))
    # No membrane painted: one group, every voxel weighs 1 (as unbalanced).
    no_membrane = step_normalisers(torch.tensor([[0, 1, 1, 3]]), corrected, 0.0, False,
                                   balance=True, groups=(0, 1, 0))
    torch.testing.assert_close(no_membrane.label_weights(), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    logits = torch.tensor([[[0.3, 0.5, -0.2, 0.8, -0.4, 0.1],
                            [0.2, -0.1, 0.4, -0.3, 0.6, 0.9]]])
    plain = step_normalisers(labels, corrected, 0.0, False)
    weights = (0.0, 5 / 8, 5 / 8, 5 / 8, 5 / 2, 5 / 8)
    targets = {1: (0.0, 0.0), 2: (1.0, 0.0), 3: (0.0, 1.0)}
    expected = sum(
        w * (_bce(logits[0, 0, i].item(), targets[int(v)][0])
             + _bce(logits[0, 1, i].item(), targets[int(v)][1]))
        for i, (v, w) in enumerate(zip(labels[0], weights, strict=True)) if v > 0
    ) / plain.supervised
    loss = finetune_loss(logits, labels, corrected, grouped)
    assert abs(loss.item() - expected) < 1e-6


def test_a_boundary_channel_balances_its_membranes_by_default():
    """The sample's channel names give channel 0 the boundary role: the run weighs its
    strokes against the rest, says so, and keeps the step cut-free; off in the config,
    or with no boundary role, nothing is weighed."""
    names = {"channel_names": ["membrane", "mitochondria"]}
    trainer = make_trainer(norm="group", batch_size=8, mode="full", metadata=names)
    trainer.build()
    assert trainer.state.balance_groups == (0, 1, 0)
    assert any("membrane strokes (membrane) weigh as much" in line
               for line in trainer.state.recovery_log)
    images, labels = trainer.sampler.sample(8)
    loss8, g8 = _grads(trainer, images, labels, [8])
    loss, grads = _grads(trainer, images, labels, [3, 3, 2])
    assert abs(loss - loss8) < 1e-6
    for a, b in zip(g8, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    trainer.state.balance_groups = ()
    plain, _ = _grads(trainer, images, labels, [8])
    assert abs(plain - loss8) > 1e-6, "the groups changed nothing on this painting"

    off = make_trainer(norm="group", batch_size=8, mode="full", metadata=names,
                       balance_membranes=False)
    off.build()
    assert off.state.balance_groups == ()
    unnamed = make_trainer(norm="group", batch_size=8, mode="full")
    unnamed.build()
    assert unnamed.state.balance_groups == ()
    assert not any("membrane strokes" in line for line in unnamed.state.recovery_log)
