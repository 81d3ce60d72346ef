"""Losses of a fine-tuning step: painted voxels, the teacher, the other channels.

Label semantics: 0 = not painted, 1 = background, k >= 2 = the
foreground of output channel k - 2. The model gives one logit per channel.

* **Corrected channels** are the channels with at least one painted voxel in
  the whole corrections volume. When only background is painted (label 1),
  every channel is treated as corrected: painted background then says "none
  of the channels is here", which is the only reading that makes the strokes
  count.
* **Supervised** (BCE with logits) on painted voxels, corrected channels only:
  painted background is negative for every corrected channel; a voxel painted
  for channel c is positive for c and negative for the other corrected
  channels (the classes are mutually exclusive).
* **Distillation**: on unpainted voxels the frozen teacher's sigmoid is the
  soft target of the corrected channels, weighted by ``distillation``.
* **Hold on the other channels**: channels that no correction touches follow
  the teacher everywhere (soft-target BCE, weight ``HOLD_WEIGHT``).

Every term is a sum over (voxel, channel) pairs divided by the number of such
pairs in the WHOLE optimizer step (:func:`step_normalisers`), so splitting a
step into micro-batches (8 = 4 + 4 = 3 + 3 + 2) gives the same gradients.
The three terms are fused into one weighted BCE call: one target tensor, one
weight tensor, one reduction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HOLD_WEIGHT = 1.0


def corrected_channels(classes_present: Iterable[int], n_channels: int) -> torch.Tensor:
    """Boolean ``(C,)``: which channels the corrections touch.

    Parameters
    ----------
    classes_present : iterable of int
        Painted label values (1 = background, k >= 2 = channel k - 2).
    n_channels : int
        Output channels of the model.
    """
    mask = torch.zeros(n_channels, dtype=torch.bool)
    for value in classes_present:
        if 2 <= int(value) < n_channels + 2:
            mask[int(value) - 2] = True
    if not mask.any():
        mask[:] = True  # only background painted: it is negative for every channel
    return mask


@dataclass(frozen=True)
class Normalisers:
    """Numbers of (voxel, channel) pairs of each term in one optimizer step."""

    supervised: int
    distillation: int
    hold: int


def step_normalisers(
    labels: torch.Tensor, corrected: torch.Tensor, distillation: float, hold: bool
) -> Normalisers:
    """Count the pairs each term averages over, for all samples of the step.

    Parameters
    ----------
    labels : torch.Tensor
        int64 ``(n, *spatial)``, every sample of the optimizer step.
    corrected : torch.Tensor
        Boolean ``(C,)`` from :func:`corrected_channels`.
    """
    painted = int(torch.count_nonzero(labels))
    voxels = labels.numel()
    n_corrected = int(corrected.sum())
    n_other = corrected.numel() - n_corrected
    return Normalisers(
        supervised=painted * n_corrected,
        distillation=(voxels - painted) * n_corrected if distillation > 0 else 0,
        hold=voxels * n_other if hold else 0,
    )


def needs_teacher(corrected: torch.Tensor, distillation: float, hold: bool) -> bool:
    """Whether a term uses the teacher's predictions."""
    return distillation > 0 or (hold and not bool(corrected.all()))


def finetune_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    corrected: torch.Tensor,
    norms: Normalisers,
    teacher_probs: torch.Tensor | None = None,
    distillation: float = 0.0,
    hold: bool = False,
) -> torch.Tensor:
    """This micro-batch's share of the step loss (the shares add up to the step loss).

    Parameters
    ----------
    logits : torch.Tensor
        ``(n, C, *spatial)`` student logits.
    labels : torch.Tensor
        int64 ``(n, *spatial)`` raw correction values.
    corrected : torch.Tensor
        Boolean ``(C,)``.
    norms : Normalisers
        Counts over the whole optimizer step.
    teacher_probs : torch.Tensor, optional
        ``(n, C, *spatial)`` teacher sigmoid; needed for distillation and the hold.
    distillation : float
        Weight of the teacher on unpainted voxels of corrected channels.
    hold : bool
        Keep the uncorrected channels close to the teacher everywhere.
    """
    logits = logits.float()
    n_channels = logits.shape[1]
    shape = (1, n_channels) + (1,) * (logits.ndim - 2)
    corrected = corrected.to(logits.device).view(shape)
    channel_labels = torch.arange(2, n_channels + 2, device=logits.device).view(shape)
    painted = (labels > 0).unsqueeze(1)
    positive = (labels.unsqueeze(1) == channel_labels).to(logits.dtype)

    supervised = painted & corrected
    weight = supervised.to(logits.dtype) / max(norms.supervised, 1)
    target = positive
    if teacher_probs is not None and (norms.distillation or norms.hold):
        teacher_probs = teacher_probs.float()
        target = torch.where(supervised, positive, teacher_probs)
        if norms.distillation and distillation > 0:
            weight = weight + (~painted & corrected).to(logits.dtype) * (
                distillation / norms.distillation
            )
        if norms.hold and hold:
            weight = weight + (~corrected).to(logits.dtype).expand_as(weight) * (
                HOLD_WEIGHT / norms.hold
            )
    elementwise = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return (elementwise * weight).sum()
