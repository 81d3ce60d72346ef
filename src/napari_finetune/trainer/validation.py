"""Score the model on the held-out painted voxels, and keep the best weights.

Now and then (:class:`Validator` schedules the checks by what they cost) the
trainer predicts the held-out regions (``data.holdout``), each in a
patch-shaped window around it, batched like training patches, and compares
the decisions with the painting:
for each corrected channel, a voxel painted for it is positive, and a voxel
painted background or another channel is negative (the classes are mutually
exclusive). The score is the IoU of the positives among the painted voxels
only, per channel; unpainted voxels are not judged. Cheap: one patch per
held-out tile (a tile is half a patch), read from the run's in-memory region.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from napari_finetune.data.holdout import HeldOut, Tile
from napari_finetune.data.normalization import missing_mask, normalize
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.modes import evaluating
from napari_finetune.trainer.precision import Precision


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


def tile_window(
    tile_box: tuple[slice, ...], patch_shape: Sequence[int], shape: Sequence[int]
) -> tuple[slice, ...]:
    """The patch-shaped box a held-out tile is predicted in.

    The tile (half a patch) sits in the middle, so its voxels have a quarter of
    a patch of context on every side, as in a training patch; at the volume's
    edge the box is shifted inside it, and an axis shorter than the patch is
    taken whole (padded later, like a training patch). The box depends on the
    tile alone, so a voxel's answer does not depend on which other tiles are
    held out.
    """
    window = []
    for b, p, s in zip(tile_box, patch_shape, shape, strict=True):
        if s <= p:
            window.append(slice(0, s))
            continue
        start = min(max((b.start + b.stop) // 2 - p // 2, 0), s - p)
        window.append(slice(start, start + p))
    return tuple(window)


def plan_windows(holdout: HeldOut, patch_shape: Sequence[int]) -> dict[tuple, list[Tile]]:
    """The windows to predict, each with the held-out tiles it scores (sorted, deduplicated).

    Tiles whose windows coincide (a short axis, the volume's edge) share one prediction.
    """
    plan: dict[tuple, list[Tile]] = {}
    for tile in sorted(holdout.tiles):
        window = tile_window(holdout.tile_box(tile), patch_shape, holdout.shape)
        key = tuple((w.start, w.stop) for w in window)
        plan.setdefault(key, []).append(tile)
    return plan


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

    # Read-only: the Finetuner computes some of these, and its sampler is None until
    # it is built.
    @property
    def sampler(self) -> PatchSampler | None: ...  # noqa: D102

    @property
    def corrected(self) -> torch.Tensor | None: ...  # noqa: D102

    @property
    def channel_names(self) -> list[str]: ...  # noqa: D102

    @property
    def lock(self) -> AbstractContextManager[object]: ...  # noqa: D102

    model: torch.nn.Module
    device: torch.device
    precision: Precision
    batch_size: int


def _sampler(trainer: Scorer) -> PatchSampler:
    """The trainer's sampler: only a built trainer has held-out voxels to score."""
    if trainer.sampler is None:
        raise RuntimeError("score the held-out voxels of a built trainer: call build() first")
    return trainer.sampler


def forward_probabilities(
    model: torch.nn.Module, blocks: np.ndarray, device: torch.device, precision: Precision
) -> np.ndarray:
    """``(n, *patch)`` normalised blocks -> ``(n, C, *patch)`` sigmoid probabilities.

    In eval mode and under the run's autocast (the precision the model trains
    at, so a check costs what a training forward pass costs); each module's
    train/eval flag is put back, so BatchNorm statistics are untouched.
    """
    with evaluating(model), torch.no_grad(), precision.autocast():
        x = torch.from_numpy(np.ascontiguousarray(blocks)).unsqueeze(1).to(device)
        return torch.sigmoid(model(x).float()).cpu().numpy()


def count_holdout(trainer: Scorer, channels: Sequence[int]) -> list[Counts]:
    """TP/FP/FN per channel of ``channels`` on the held-out painted voxels.

    One patch-shaped window per held-out tile (:func:`tile_window`), windows
    shared by tiles predicted once, as many per forward pass as a training
    micro-batch; image and painting are read through the run's region cache.
    """
    sampler = _sampler(trainer)
    holdout = sampler.holdout
    patch = sampler.patch_shape
    counts = [Counts() for _ in channels]
    plan = list(plan_windows(holdout, patch).items())
    per_pass = max(1, int(trainer.batch_size))
    for first in range(0, len(plan), per_pass):
        chunk = plan[first : first + per_pass]
        windows = [tuple(slice(a, b) for a, b in key) for key, _ in chunk]
        raws = [sampler.read_image(window) for window in windows]
        blocks = np.stack([_patch_block(raw, sampler.low, sampler.high, patch) for raw in raws])
        with trainer.lock:
            probabilities = forward_probabilities(
                trainer.model, blocks, trainer.device, trainer.precision
            )
        for (_, tiles), window, raw, probs in zip(chunk, windows, raws, probabilities,
                                                   strict=True):
            missing = missing_mask(raw)
            for tile in tiles:
                box = holdout.tile_box(tile)
                inner = tuple(
                    slice(b.start - w.start, b.stop - w.start)
                    for b, w in zip(box, window, strict=True)
                )
                labels = sampler.read_corrections(box).astype(np.int64)
                if missing is not None:
                    labels[missing[inner]] = 0  # no image value: nothing to judge
                tally(probs[(slice(None),) + inner], labels, channels, counts)
    return counts


def _patch_block(
    raw: np.ndarray, low: float, high: float, patch_shape: Sequence[int]
) -> np.ndarray:
    """A window normalised and padded to the patch shape as the sampler pads a patch."""
    block = normalize(raw, low, high)
    pad = [(0, p - got) for p, got in zip(patch_shape, block.shape, strict=True)]
    if any(after for _, after in pad):
        block = np.pad(block, pad, mode="reflect" if min(block.shape) > 1 else "edge")
    return block


def score_holdout(trainer: Scorer) -> dict[str, float] | None:
    """Per-channel IoU on the held-out painted voxels (None when nothing is held out).

    Current weights, eval mode, the run's precision; nothing else disturbed
    (see :func:`count_holdout`).
    """
    holdout = _sampler(trainer).holdout
    corrected: list[int] = (
        [] if trainer.corrected is None else trainer.corrected.nonzero().flatten().tolist()
    )
    channels = scored_channels(holdout, corrected)
    if not holdout or not channels:
        return None
    counts = count_holdout(trainer, channels)
    names = trainer.channel_names
    return {names[c]: round(count.iou, 4) for c, count in zip(channels, counts, strict=True)}


def describe_scores(scores: dict[str, float], step: int, best: BestWeights) -> str:
    """The log line of one check."""
    text = ", ".join(f"{name} {iou:.2f}" for name, iou in scores.items())
    line = f"validation at step {step} (IoU on held-out strokes): {text}"
    if best.step == step:
        return line + " — best so far"
    return line + f" (best {best.score:.2f} at step {best.step})"


# Checks may take at most this share of a run's wall time: a check waits for
# (1 - share) / share = 9 times its cost of training since the last one.
CHECK_SHARE = 0.1

# Keep-best puts an earlier step's weights back only when their mean IoU beat
# the last check's by more than this. The held-out strokes are a few thousand
# voxels, so scores a hundredth apart are the same model as far as they can
# tell: in the demo, a step whose strokes scored 0.81 against the last step's
# 0.80 was kept and was worse on the never-painted half (membrane IoU 0.865
# against 0.873, cells' adapted Rand error 0.123 against 0.028).
KEEP_BEST_MARGIN = 0.02


class Validator:
    """When to check, what was scored, the best weights, early stopping.

    A check is scheduled by what it costs, so checks stay within
    :data:`CHECK_SHARE` of the wall time on any machine: after the first one
    (made after ``every`` steps, when nothing says yet what a check costs), a
    check runs when the training time since the last check is at least 9 times
    what the last check took, the training time of the whole run so far is at
    least 9 times every check's cost so far, and the run's remaining steps
    leave room for the final check too. The final step is always checked
    (keep-best compares the last weights with the best).

    Parameters
    ----------
    every : int
        At most one check every so many optimizer steps (and one after the last step).
    early_stop_checks : int
        End the run after this many checks without improvement (0: never).
    keep_best : bool
        At the end of a run that finished, put the best-scoring weights back
        into the model (and so into the export) when they beat the last ones
        by more than :data:`KEEP_BEST_MARGIN`.
    clock : callable
        Seconds, monotonic (``time.perf_counter``); tests put a fake one here
        to make a check look slow without waiting for it.
    """

    def __init__(
        self,
        every: int,
        early_stop_checks: int = 0,
        keep_best: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.every = every
        self.early_stop_checks = early_stop_checks
        self.keep_best = keep_best
        self.clock = clock
        self.history: list[tuple[int, dict[str, float]]] = []
        self.best = BestWeights()
        self.restored_step: int | None = None
        self.trained_s = 0.0  # wall time between checks, since start()
        self.spent_s = 0.0  # wall time in checks
        self.last_cost_s = 0.0
        self._trained_at_last = 0.0
        self._last_checked = 0
        self._mark: float | None = None

    @property
    def latest(self) -> dict[str, float] | None:
        """The scores of the last check (None before the first)."""
        return self.history[-1][1] if self.history else None

    def start(self) -> None:
        """Start counting training time (the run calls this before its first step)."""
        self._mark = self.clock()

    def _count_training(self) -> None:
        now = self.clock()
        if self._mark is not None:
            self.trained_s += now - self._mark
        self._mark = now

    def due(self, step: int, total: int) -> bool:
        """Whether to check after ``step`` (not twice for the same step)."""
        self._count_training()
        if step <= 0 or step == self._last_checked:
            return False
        if step >= total:
            return True
        if step - self._last_checked < self.every:
            return False
        return self._affordable(step, total)

    def _affordable(self, step: int, total: int) -> bool:
        """Whether the training time pays for one more check of the last one's cost."""
        ratio = (1 - CHECK_SHARE) / CHECK_SHARE
        cost = self.last_cost_s
        if self.trained_s - self._trained_at_last < ratio * cost:
            return False
        if self.trained_s < ratio * (self.spent_s + cost):
            return False  # earlier checks (the first one) overspent: wait until paid for
        # The final check will run whatever happens: this one only if the whole
        # run's training (at the rate so far) pays for both.
        projected = self.trained_s * total / step
        return projected >= ratio * (self.spent_s + 2 * cost)

    def check(self, trainer: Scorer, model: torch.nn.Module, step: int) -> str | None:
        """Score, remember, keep the best weights; the log line (None: nothing to score).

        A check that runs out of memory is skipped (training goes on; the
        memory is freed once the traceback is gone). Its cost is measured
        either way, for the schedule.
        """
        from napari_finetune.errors import is_oom_error

        self._count_training()
        self._last_checked = step
        began = self.clock()
        failure = None
        try:
            scores = score_holdout(trainer)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            failure = type(exc).__name__
        finally:
            ended = self.clock()
            self.last_cost_s = ended - began
            self.spent_s += self.last_cost_s
            self._trained_at_last = self.trained_s
            self._mark = ended  # the check's time is not training time
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
        """Load the best weights into ``model`` if they beat the last check's by more than
        :data:`KEEP_BEST_MARGIN`; the log line."""
        if not (self.keep_best and self.history and self.best.step is not None):
            return None
        last_step, last_scores = self.history[-1]
        last = float(np.mean(list(last_scores.values())))
        if self.best.step == step or self.best.score <= last + KEEP_BEST_MARGIN:
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
