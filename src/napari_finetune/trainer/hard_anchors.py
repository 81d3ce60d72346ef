"""Error-weighted anchors: draw patches where the current model is still wrong.

The sampler anchors every patch on a painted voxel, classes taking turns. With
``FinetuneConfig.hard_anchor_every`` = k, every k steps the loop closes the
sample feed (the drawn but unused steps are given back) and :func:`rescore`
predicts, with the current weights, one patch-shaped window per grid tile that
holds painted voxels; each anchor's weight becomes ``HARD_FLOOR`` plus how
wrong the model is there (:func:`anchor_wrongness`). The feed then starts
again from the first unused draw. The weights change at fixed steps and only
while no producer thread draws, so a run's sequence of patches depends on the
seed and the step, never on the prefetch thread's timing.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np
import torch

from napari_finetune.data.normalization import normalize
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.validation import forward_probabilities

# Weight of an anchor the model already gets right, beside 1.0 for one it gets
# completely wrong: right anchors are still drawn (the model must not forget
# them), ten times less often than the wrongest.
HARD_FLOOR = 0.1


class Rescorer(Protocol):
    """What :func:`rescore` reads of a run (a ``Finetuner`` has it)."""

    sampler: PatchSampler | None
    model: torch.nn.Module
    device: torch.device
    precision: Precision
    batch_size: int
    lock: AbstractContextManager

    @property
    def corrected(self) -> torch.Tensor | None: ...  # noqa: D102


def window_starts(
    anchors: np.ndarray, patch: tuple[int, ...], shape: tuple[int, ...]
) -> np.ndarray:
    """``(m, ndim)`` starts of the grid windows (patch-sized, inside the volume) holding them."""
    size, limit = np.asarray(patch), np.maximum(np.asarray(shape) - np.asarray(patch), 0)
    return np.minimum((np.asarray(anchors, dtype=np.int64) // size) * size, limit)


def anchor_wrongness(probs: np.ndarray, value: int, corrected: np.ndarray) -> np.ndarray:
    """How wrong the model is at anchors painted ``value``: in [0, 1], 0 = right.

    Parameters
    ----------
    probs : numpy.ndarray
        ``(m, C)`` sigmoid probabilities at ``m`` anchors.
    value : int
        Their painted label (1 = background, k >= 2 = channel k - 2).
    corrected : numpy.ndarray
        Boolean ``(C,)``: the channels the loss supervises.

    The largest distance, over the corrected channels, between the probability
    and the painted answer (1 for the painted channel, 0 for the others), as
    the supervised loss reads a stroke.
    """
    target = np.zeros(probs.shape[1], dtype=probs.dtype)
    if value >= 2:
        target[value - 2] = 1.0
    distance = np.abs(probs - target)[:, corrected]
    return distance.max(axis=1) if distance.shape[1] else np.zeros(len(probs))


def rescore(trainer: Rescorer) -> dict[int, np.ndarray]:
    """Weights per anchor (``HARD_FLOOR`` + wrongness) from the current model; sets them.

    One forward pass per window of the patch grid that holds anchors, as many
    windows per pass as a training micro-batch, in eval mode (BatchNorm
    statistics untouched) under the run's precision.
    """
    sampler = trainer.sampler
    if sampler is None or trainer.corrected is None:
        raise RuntimeError("rescore needs a built run (its sampler and corrected channels).")
    patch, shape = sampler.patch_shape, sampler.shape
    corrected = trainer.corrected.cpu().numpy().astype(bool)
    # Which window each anchor falls in, so a window is predicted once.
    values = sorted(sampler.anchors)
    starts_of = {v: window_starts(sampler.anchors[v], patch, shape) for v in values}
    starts = np.unique(np.concatenate([starts_of[v] for v in values]), axis=0)
    weights = {v: np.full(len(sampler.anchors[v]), HARD_FLOOR) for v in values}
    per_pass = max(1, int(trainer.batch_size))
    for first in range(0, len(starts), per_pass):
        chunk = starts[first : first + per_pass]
        blocks = []
        for start in chunk:
            box = tuple(
                slice(int(a), min(int(a) + p, s))
                for a, p, s in zip(start, patch, shape, strict=True)
            )
            block = normalize(sampler.read_image(box), sampler.low, sampler.high)
            pad = [(0, p - got) for p, got in zip(patch, block.shape, strict=True)]
            if any(after for _, after in pad):  # a volume smaller than the patch
                block = np.pad(block, pad, mode="reflect" if min(block.shape) > 1 else "edge")
            blocks.append(block)
        with trainer.lock:
            probabilities = forward_probabilities(
                trainer.model, np.stack(blocks), trainer.device, trainer.precision
            )
        for start, probs in zip(chunk, probabilities, strict=True):
            for value in values:
                inside = np.flatnonzero(np.all(starts_of[value] == start, axis=1))
                if not len(inside):
                    continue
                local = sampler.anchors[value][inside] - start
                at = probs[(slice(None), *local.T)].T  # (m, C)
                weights[value][inside] += anchor_wrongness(at, value, corrected)
    sampler.set_anchor_weights(weights)
    return weights
