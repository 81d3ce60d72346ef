"""Score the model on the held-out painted voxels, and keep the best weights.

Every few steps the trainer predicts the held-out regions (``data.holdout``)
with some context around them and compares the decisions with the painting:
for each corrected channel, a voxel painted for it is positive, and a voxel
painted background or another channel is negative (the classes are mutually
exclusive). The score is the IoU of the positives among the painted voxels
only, per channel; unpainted voxels are not judged. Cheap: only the regions
around the held-out tiles are predicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from napari_finetune.data.holdout import HeldOut
from napari_finetune.data.normalization import missing_mask
from napari_finetune.data.region_cache import ArrayLike
from napari_finetune.data.sampling import PatchSampler


@dataclass
class Counts:
    """True positives, false positives and false negatives of one channel."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def iou(self) -> float:
        """TP / (TP + FP + FN); 0 when nothing was positive or predicted."""
        total = self.tp + self.fp + self.fn
        return self.tp / total if total else 0.0


@dataclass
class BestWeights:
    """The weights of the best validation score so far, on the host.

    Attributes
    ----------
    step : int or None
        The step they are from (None before the first check).
    score : float
        Their mean IoU over the scored channels.
    state : dict
        ``state_dict`` copied to the CPU.
    checks_without_improvement : int
        Checks since the best one (for early stopping).
    """

    step: int | None = None
    score: float = -1.0
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    checks_without_improvement: int = 0

    def offer(self, model: torch.nn.Module, step: int, score: float) -> bool:
        """Keep ``model``'s weights if ``score`` beats the best; True when it did."""
        if score <= self.score:
            self.checks_without_improvement += 1
            return False
        self.step, self.score, self.checks_without_improvement = step, score, 0
        self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return True


def context_box(
    tile_box: tuple[slice, ...], context: Sequence[int], shape: Sequence[int]
) -> tuple[slice, ...]:
    """``tile_box`` grown by ``context`` voxels on every side, clipped to the volume."""
    return tuple(
        slice(max(0, b.start - c), min(s, b.stop + c))
        for b, c, s in zip(tile_box, context, shape, strict=True)
    )


def tally(
    probabilities: np.ndarray, labels: np.ndarray, channels: Sequence[int], counts: list[Counts]
) -> None:
    """Add one region's decisions on painted voxels to ``counts`` (one per channel).

    ``probabilities`` is ``(C, *spatial)``; ``labels`` holds the painting
    (0 unpainted, 1 background, k >= 2 channel k - 2) of the same region.
    """
    painted = labels > 0
    for count, channel in zip(counts, channels, strict=True):
        positive = labels == channel + 2
        predicted = probabilities[channel] > 0.5
        count.tp += int(np.count_nonzero(predicted & positive))
        count.fp += int(np.count_nonzero(predicted & painted & ~positive))
        count.fn += int(np.count_nonzero(~predicted & positive))


def scored_channels(holdout: HeldOut, corrected: Sequence[int]) -> list[int]:
    """Corrected channels with held-out positives (only they can be scored)."""
    return [c for c in corrected if holdout.voxels.get(c + 2, 0) > 0]


class Scorer(Protocol):
    """What :func:`score_holdout` needs of a trainer (the Finetuner has it)."""

    sampler: PatchSampler
    corrections: ArrayLike
    corrected: torch.Tensor | None
    channel_names: list[str]

    def predict(self, region: tuple[slice, ...]) -> np.ndarray: ...  # noqa: D102


def score_holdout(trainer: Scorer) -> dict[str, float] | None:
    """Per-channel IoU on the held-out painted voxels (None when nothing is held out).

    Each held-out tile is predicted with half a patch of context on every side
    (the model sees what it would see in training), through the trainer's
    :meth:`predict` (current weights, eval mode, nothing else disturbed).
    """
    sampler = trainer.sampler
    holdout = sampler.holdout
    corrected = [] if trainer.corrected is None else trainer.corrected.nonzero().flatten()
    channels = scored_channels(holdout, [int(c) for c in corrected])
    if not holdout or not channels:
        return None
    context = [p // 2 for p in sampler.patch_shape]
    counts = [Counts() for _ in channels]
    for tile in sorted(holdout.tiles):
        tile_box = holdout.tile_box(tile)
        region = context_box(tile_box, context, sampler.shape)
        probabilities = trainer.predict(region)
        inner = tuple(
            slice(b.start - r.start, b.stop - r.start)
            for b, r in zip(tile_box, region, strict=True)
        )
        labels = np.asarray(trainer.corrections[tile_box]).astype(np.int64)
        missing = missing_mask(sampler.read_image(tile_box))
        if missing is not None:
            labels[missing] = 0
        tally(probabilities[(slice(None),) + inner], labels, channels, counts)
    names = trainer.channel_names
    return {names[c]: round(count.iou, 4) for c, count in zip(channels, counts, strict=True)}


def describe_scores(scores: dict[str, float], step: int, best: BestWeights) -> str:
    """The log line of one check."""
    text = ", ".join(f"{name} {iou:.2f}" for name, iou in scores.items())
    line = f"validation at step {step} (IoU on held-out strokes): {text}"
    if best.step == step:
        return line + " — best so far"
    return line + f" (best {best.score:.2f} at step {best.step})"


class Validator:
    """When to check, what was scored, the best weights, early stopping.

    Parameters
    ----------
    every : int
        Check after every so many optimizer steps (and after the last one).
    early_stop_checks : int
        End the run after this many checks without improvement (0: never).
    keep_best : bool
        At the end of a run that finished, put the best-scoring weights back
        into the model (and so into the export) when they beat the last ones.
    """

    def __init__(self, every: int, early_stop_checks: int = 0, keep_best: bool = True) -> None:
        self.every = every
        self.early_stop_checks = early_stop_checks
        self.keep_best = keep_best
        self.history: list[tuple[int, dict[str, float]]] = []
        self.best = BestWeights()
        self.restored_step: int | None = None

    @property
    def latest(self) -> dict[str, float] | None:
        """The scores of the last check (None before the first)."""
        return self.history[-1][1] if self.history else None

    def due(self, step: int, total: int) -> bool:
        """Whether to check after ``step`` (not twice for the same step)."""
        checked = self.history and self.history[-1][0] == step
        return not checked and step > 0 and (step % self.every == 0 or step >= total)

    def check(self, trainer: Scorer, model: torch.nn.Module, step: int) -> str | None:
        """Score, remember, keep the best weights; the log line (None: nothing to score).

        A check that runs out of memory is skipped (training goes on; the
        memory is freed once the traceback is gone).
        """
        from napari_finetune.errors import is_oom_error

        failure = None
        try:
            scores = score_holdout(trainer)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            failure = type(exc).__name__
        if failure is not None:
            return f"validation at step {step} skipped: {failure} while predicting"
        if scores is None:
            return None
        self.history.append((step, scores))
        self.best.offer(model, step, float(np.mean(list(scores.values()))))
        return describe_scores(scores, step, self.best)

    def early_stop(self) -> str | None:
        """The reason to end the run now, or None."""
        waited = self.best.checks_without_improvement
        if self.early_stop_checks <= 0 or waited < self.early_stop_checks:
            return None
        return (
            f"early stop: the validation score did not improve in {waited} checks "
            f"(best {self.best.score:.2f} at step {self.best.step})"
        )

    def restore_best(self, model: torch.nn.Module, step: int) -> str | None:
        """Load the best weights into ``model`` if they beat the last check's; the log line."""
        if not (self.keep_best and self.history and self.best.step is not None):
            return None
        last_step, last_scores = self.history[-1]
        last = float(np.mean(list(last_scores.values())))
        if self.best.step == step or self.best.score <= last:
            return None
        model.load_state_dict(self.best.state)
        self.restored_step = self.best.step
        return (
            f"kept the weights of step {self.best.step} (validation {self.best.score:.2f}), "
            f"better than the last step's ({last:.2f} at step {last_step})"
        )

    def record(self) -> dict[str, object]:
        """Plain-types summary for the run record."""
        return {
            "validation": self.latest,
            "validation_history": [[step, scores] for step, scores in self.history],
            "best_validation_step": self.best.step,
            "weights_from_step": self.restored_step,
        }
