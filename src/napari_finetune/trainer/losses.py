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
* **Balanced classes** (``balance``, optional): each painted label value of the
  step weighs the same in total, whatever its voxel count; the supervised term
  keeps its total weight. Without it a class painted in long strokes (cell
  interiors) outweighs one painted in short ones (the membranes between them):
  on the CREMI crop, 770 interior voxels against 64 membrane ones, the model
  learned "less membrane" everywhere. Balanced, it kept more membrane but not more
  cells, and the demo's mitochondria lost (docs/benchmarks.md): off by default.
  **Membranes against the rest** (``groups``, on by default through the config's
  ``balance_membranes``): the painted voxels of a boundary channel weigh as much in
  total as all other painted voxels together, each class of the rest keeping its
  share. A membrane is thin, so strokes on it are short whatever the user does; the
  demo paints its membranes as 45 % of its strokes already, and its three classes keep
  their weights to within 11 %.
* **Distillation**: on unpainted voxels the frozen teacher's sigmoid is the
  soft target of the corrected channels, weighted by ``distillation``.
* **Hold on the other channels**: channels that no correction touches follow
  the teacher everywhere (soft-target BCE, weight ``HOLD_WEIGHT``).
* **A channel the teacher does not have** (added to the model for a new
  structure, :mod:`napari_finetune.model.add_channel`): the teacher gives the
  first ``taught`` channels only, and the channels after them are neither
  distilled nor held; they learn from the painted voxels alone.

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
    # Painted voxels of each label value 1, 2, ... of the step, when the classes are
    # balanced (:func:`step_normalisers`' ``balance``); empty: not balanced.
    per_label: tuple[int, ...] = ()
    # The group of each label value 1, 2, ... that weighs as one class (the same on
    # every rank); empty: every label value is a group of its own.
    groups: tuple[int, ...] = ()

    def label_weights(self) -> torch.Tensor | None:
        """Weight of a painted voxel of each label value (index 0: unpainted, unused):
        ``painted / (groups * group's count)``, so every painted group weighs the same in
        total, its voxels alike, and the weights of all painted voxels add up to their
        number. None: not balanced."""
        if not self.per_label:
            return None
        counts = torch.tensor((0,) + self.per_label, dtype=torch.float64)
        if self.groups:
            if len(self.groups) != len(self.per_label):
                raise ValueError(f"{len(self.groups)} groups for {len(self.per_label)} "
                                 "label values.")
            group = torch.tensor((0,) + self.groups, dtype=torch.int64)
        else:
            group = torch.arange(counts.numel())
        in_group = torch.zeros(int(group.max()) + 1, dtype=torch.float64)
        in_group.index_add_(0, group[1:], counts[1:])
        present = counts > 0
        weights = torch.zeros_like(counts)
        weights[present] = counts.sum() / (int((in_group > 0).sum()) * in_group[group[present]])
        return weights.float()


def taught_channels(n_channels: int, taught: int | None) -> torch.Tensor:
    """Boolean ``(C,)``: the channels the teacher gives (the first ``taught``; all if None)."""
    limit = n_channels if taught is None else min(int(taught), n_channels)
    return torch.arange(n_channels) < limit


def step_normalisers(
    labels: torch.Tensor, corrected: torch.Tensor, distillation: float, hold: bool,
    taught: int | None = None, balance: bool = False, groups: tuple[int, ...] = (),
) -> Normalisers:
    """Count the pairs each term averages over, for all samples of the step.

    Parameters
    ----------
    labels : torch.Tensor
        int64 ``(n, *spatial)``, every sample of the optimizer step.
    corrected : torch.Tensor
        Boolean ``(C,)`` from :func:`corrected_channels`.
    taught : int, optional
        The teacher's channels (the model's first ones); None: all of them.
    balance : bool
        Count the painted voxels of each label value (1 to ``C + 1``) too, for
        :meth:`Normalisers.label_weights`.
    groups : tuple of int
        With ``balance``, the group of each label value 1 to ``C + 1`` (see
        :meth:`Normalisers.label_weights`); empty: each value a group of its own.
    """
    painted = int(torch.count_nonzero(labels))
    voxels = labels.numel()
    known = taught_channels(corrected.numel(), taught)
    n_corrected = int((corrected & known).sum())
    n_other = int((~corrected & known).sum())
    return Normalisers(
        supervised=painted * int(corrected.sum()),
        distillation=(voxels - painted) * n_corrected if distillation > 0 else 0,
        hold=voxels * n_other if hold else 0,
        per_label=(tuple(int(c) for c in torch.bincount(
            labels.reshape(-1).clamp(0, corrected.numel() + 1),
            minlength=corrected.numel() + 2)[1:]) if balance else ()),
        groups=tuple(groups) if balance else (),
    )


def needs_teacher(
    corrected: torch.Tensor, distillation: float, hold: bool, taught: int | None = None
) -> bool:
    """Whether a term uses the teacher's predictions (``taught``: the teacher's channels)."""
    known = taught_channels(corrected.numel(), taught)
    if not known.any():
        return False
    return distillation > 0 or (hold and bool((~corrected & known).any()))


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
        ``(n, T, *spatial)`` teacher sigmoid, ``T <= C``: the first ``T`` channels
        (a model that got channels since has more); needed for distillation and
        the hold, which cover those ``T`` only.
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
    label_weights = norms.label_weights()
    if label_weights is not None:
        # Labels beyond the model's channels were counted with the last value; clamp alike.
        index = labels.clamp(0, label_weights.numel() - 1)
        weight = weight * label_weights.to(logits.device)[index].unsqueeze(1)
    target = positive
    if teacher_probs is not None and (norms.distillation or norms.hold):
        teacher_probs = teacher_probs.float()
        n_taught = teacher_probs.shape[1]
        if n_taught < n_channels:
            # Channels the teacher lacks get weight 0 below; their target there is moot.
            pad = teacher_probs.new_zeros((teacher_probs.shape[0], n_channels - n_taught,
                                           *teacher_probs.shape[2:]))
            teacher_probs = torch.cat([teacher_probs, pad], dim=1)
        known = taught_channels(n_channels, n_taught).to(logits.device).view(shape)
        target = torch.where(supervised, positive, teacher_probs)
        if norms.distillation and distillation > 0:
            weight = weight + (~painted & corrected & known).to(logits.dtype) * (
                distillation / norms.distillation
            )
        if norms.hold and hold:
            weight = weight + (~corrected & known).to(logits.dtype).expand_as(weight) * (
                HOLD_WEIGHT / norms.hold
            )
    elementwise = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return (elementwise * weight).sum()
