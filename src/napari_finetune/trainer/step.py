"""One optimizer step: fixed samples, cut into micro-batches, gradients accumulated.

The samples of a step are drawn once (``samples_per_step`` of them) and cut
into micro-batches of at most ``trainer.batch_size``; the loss of every
micro-batch is already divided by the whole step's counts, so the summed
gradients do not depend on how the step was cut (nor, with several ranks,
on how the step's samples were shared between them: the counts are the whole
step's, and the ranks' gradients are summed). Out-of-memory errors are not
handled here: they propagate to the loop, which recovers outside the
``except`` block and calls :func:`run_step` again with the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from napari_finetune.errors import is_oom_error
from napari_finetune.trainer.losses import Normalisers, finetune_loss, step_normalisers
from napari_finetune.trainer.micro_batches import split_sizes
from napari_finetune.trainer.oom import StepOutOfMemory, oom_line
from napari_finetune.trainer.precision import Precision, clip_gradients, total_squared_norm
from napari_finetune.trainer.run_state import RunState, TrainingParts
from napari_finetune.trainer.sync import LocalSync

# The agreement of a step run by one process alone.
ALONE = LocalSync()


@dataclass(frozen=True)
class StepOutcome:
    """What one attempt at an optimizer step ended with.

    Attributes
    ----------
    kind : {"applied", "nonfinite", "skipped"}
        Applied; not applied because the loss or gradients are not finite
        (bf16/fp32); or skipped by the fp16 GradScaler (overflow).
    loss : float
        Step loss (sum of the micro-batch shares).
    scale : tuple of float
        GradScaler scale before and after (1.0, 1.0 without a scaler).
    """

    kind: str
    loss: float
    scale: tuple[float, float] = (1.0, 1.0)


def teacher_terms(state: RunState) -> tuple[float, bool]:
    """Distillation weight and hold as the step uses them (both off without a teacher)."""
    if state.teacher is None:
        return 0.0, False
    return float(state.distillation), bool(state.hold_other_channels)


def taught(state: RunState) -> int | None:
    """The channels the teacher gives (fewer than the model's after an added channel)."""
    return None if state.teacher is None else state.teacher.channels


def local_normalisers(parts: TrainingParts, state: RunState, labels: np.ndarray) -> Normalisers:
    """The counts of this process's samples of the step."""
    distillation, hold = teacher_terms(state)
    all_labels = torch.from_numpy(np.ascontiguousarray(labels))
    return step_normalisers(all_labels, parts.corrected, distillation, hold, taught(state),
                            *state.balance())


def accumulate_gradients(
    parts: TrainingParts,
    state: RunState,
    images: np.ndarray,
    labels: np.ndarray,
    scaled: bool = True,
    micro_batches: list[int] | None = None,
    norms: Normalisers | None = None,
) -> torch.Tensor:
    """Forward and backward every micro-batch of a step; returns the step loss (tensor).

    Parameters
    ----------
    parts : TrainingParts
        The model, its precision and the corrected channels.
    state : RunState
        Reads ``teacher``, ``batch_size``, ``distillation``, ``hold_other_channels``.
    images, labels : numpy.ndarray
        All samples of the step: ``(n, 1, *patch)`` float32 and ``(n, *patch)`` int64.
    scaled : bool
        Scale the loss with the GradScaler (False for the precision probe,
        which looks at the raw gradients).
    micro_batches : list of int, optional
        Sizes to cut into; default :func:`split_sizes` with ``state.batch_size``.
    norms : Normalisers, optional
        The step's counts; default those of ``labels`` (several ranks pass the
        whole step's).
    """
    device, precision = parts.device, parts.precision
    all_labels = torch.from_numpy(np.ascontiguousarray(labels))
    teacher = state.teacher
    distillation, hold = teacher_terms(state)
    if norms is None:
        norms = step_normalisers(all_labels, parts.corrected, distillation, hold, taught(state),
                                 *state.balance())
    use_teacher = teacher is not None and (norms.distillation > 0 or norms.hold > 0)
    total = torch.zeros((), device=device)
    start = 0
    for size in micro_batches or split_sizes(len(images), state.batch_size):
        x = torch.from_numpy(np.ascontiguousarray(images[start : start + size]))
        x = x.to(device, non_blocking=True)
        y = all_labels[start : start + size].to(device, non_blocking=True)
        start += size
        with precision.autocast():
            logits = parts.model(x)
            teacher_probs = None
            if use_teacher and teacher is not None:
                with torch.no_grad():
                    teacher_probs = torch.sigmoid(teacher(x).float())
        loss = finetune_loss(logits, y, parts.corrected, norms, teacher_probs, distillation, hold)
        if scaled:
            precision.backward(loss)
        else:
            loss.backward()
        total += loss.detach()
        # Drop this micro-batch's graph inputs before the next one allocates.
        del x, y, logits, teacher_probs, loss
    return total


def run_step(
    parts: TrainingParts,
    state: RunState,
    images: np.ndarray,
    labels: np.ndarray,
    max_grad_norm: float | None = None,
    sync: LocalSync = ALONE,
) -> StepOutcome:
    """One attempt at an optimizer step with the given samples.

    Gradients are cleared first, so an attempt never sees a failed one's
    leftovers. A non-finite loss (any precision), or non-finite gradients under
    bf16 autocast, leave the weights untouched and return ``"nonfinite"``; the
    fp16 GradScaler handles its own gradients and reports ``"skipped"``. Alone,
    the loss and the bf16 gradients' verdict are read in one device sync
    (:func:`read_loss_and_gradients`).

    With several ranks (``sync``), every decision is taken by all of them: an
    out-of-memory on any rank raises :class:`StepOutOfMemory` on every rank
    before a gradient is exchanged, so the failed attempt's gradients are never
    summed and every rank steps down the ladder together.

    Raises
    ------
    StepOutOfMemory
        The forward/backward passes or the optimizer step ran out of memory
        (here or, with several ranks, on any rank).
    """
    optimizer, precision = parts.optimizer, parts.precision
    optimizer.zero_grad(set_to_none=True)
    norms = sync.normalisers(local_normalisers(parts, state, labels))
    own = None
    local = torch.zeros(())  # bound for the type checker; an OOM raises below
    try:
        local = accumulate_gradients(parts, state, images, labels, norms=norms)
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        own = oom_line(exc)  # recovered by the caller, after this block is left
    if sync.any(own is not None):
        optimizer.zero_grad(set_to_none=True)
        raise StepOutOfMemory(sync.failure_line(own, "another rank ran out of memory"))
    # Under fp16 the scaler itself skips a step with inf/NaN gradients; under
    # bf16 (and only there) the gradients are checked here.
    check_gradients = precision.enabled and not precision.grad_scaler
    finite_gradients: bool | None = None
    if sync.distributed:
        # The ranks agree on the loss (a collective of a host number) before
        # their gradients are summed; those are measured after, in a second read.
        loss = sync.total(float(local))
    else:
        loss, finite_gradients = read_loss_and_gradients(local, parts.model, check_gradients)
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return StepOutcome("nonfinite", loss)
    sync.reduce_gradients([p for p in parts.model.parameters() if p.grad is not None])
    # fp16 gradients are divided by the scale first: measured and clipped as
    # they are (a no-op for the other dtypes, whose scaler is disabled).
    precision.unscale(optimizer)
    if check_gradients:
        # The ranks' gradients are equal once summed, so they all see the same verdict.
        if finite_gradients is None:
            finite_gradients = precision.gradients_finite(parts.model)
        if not finite_gradients:
            optimizer.zero_grad(set_to_none=True)
            return StepOutcome("nonfinite", loss)
    if max_grad_norm is not None:
        clip_gradients(parts.model, max_grad_norm)
    applied, before, after = guarded_optimizer_step(optimizer, precision, sync)
    optimizer.zero_grad(set_to_none=True)
    return StepOutcome("applied" if applied else "skipped", loss, (before, after))


def read_loss_and_gradients(
    loss: torch.Tensor, model: torch.nn.Module, check_gradients: bool
) -> tuple[float, bool | None]:
    """The step loss and whether the gradients are finite, read in one device sync.

    Each host read of a device value waits for the GPU's queue: the loss and
    the gradients' verdict (:meth:`Precision.gradients_finite`, the same sum
    of squares in fp32) are stacked and read together. Without
    ``check_gradients`` only the loss is read, and the verdict is None.
    """
    if not check_gradients:
        return float(loss), None
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return float(loss), True
    squared = total_squared_norm(grads).to(loss.device)
    value, norm = torch.stack([loss.float(), squared]).tolist()
    return value, math.isfinite(norm)


def step_can_allocate(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` may allocate device memory after it begun to update.

    False only for a fused optimizer (every group ``fused``) whose state exists
    for every parameter: its one kernel updates in place and allocates nothing,
    so it cannot run out of memory half-way. The first step (the moments are
    made, before any update) and the foreach and per-tensor paths (temporaries
    allocated between updates) can.
    """
    groups = optimizer.param_groups
    if not groups or not all(group.get("fused") for group in groups):
        return True
    return any(
        p not in optimizer.state or not optimizer.state[p]
        for group in groups
        for p in group["params"]
    )


@dataclass
class Undo:
    """Copies of what an optimizer step changes, to put back if it fails half-way."""

    params: list[torch.Tensor]
    saved_params: list[torch.Tensor]
    saved_state: dict[torch.Tensor, dict[str, object]]

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer) -> Undo:
        """Copy the trainable weights and the optimizer state now."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        saved_state = {
            p: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
            for p in params
            if p in optimizer.state
        }
        return cls(params, [p.detach().clone() for p in params], saved_state)

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        """Put the weights and the optimizer state back as they were copied."""
        with torch.no_grad():
            for param, value in zip(self.params, self.saved_params, strict=True):
                param.copy_(value)
        for param in self.params:
            if param in self.saved_state:
                optimizer.state[param] = self.saved_state[param]
            else:
                optimizer.state.pop(param, None)


def guarded_optimizer_step(
    optimizer: torch.optim.Optimizer, precision: Precision, sync: LocalSync = ALONE
) -> tuple[bool, float, float]:
    """``precision.step(optimizer)``, all or nothing (on every rank).

    AdamW's foreach path updates the step counters, the weights (decay) and the
    first moments before it allocates its square-root temporaries: an OOM
    there would leave half a step applied, and redoing the step would apply
    that half twice. Where the step can allocate (:func:`step_can_allocate`),
    the trainable weights and the optimizer state are copied first (small for
    LoRA; one model's worth for a full fine-tune) and put back if the step
    runs out of memory here, or, with several ranks, on any rank. The copies
    are made after the micro-batches' activations are freed, so they add to the
    optimizer step's peak, not to the forward/backward peak. The fused AdamW
    of a CUDA run allocates nothing once its moments exist: no copy from the
    second step on (a copy of every weight per step cost a GPU run more than
    the update). The scaler's state is always kept (a few numbers).

    Raises
    ------
    StepOutOfMemory
        The step ran out of memory here or on another rank (weights unchanged).
    """
    undo = Undo.of(optimizer) if step_can_allocate(optimizer) else None
    saved_scaler = precision.scaler.state_dict()
    own = None
    result = (False, 1.0, 1.0)
    try:
        result = precision.step(optimizer)
    except BaseException as exc:
        if not is_oom_error(exc):
            if undo is not None:
                undo.restore(optimizer)
            raise
        own = oom_line(exc)
    if sync.any(own is not None):
        if undo is not None:
            undo.restore(optimizer)
        precision.reset_step_state(saved_scaler)
        raise StepOutOfMemory(sync.failure_line(own, "another rank ran out of memory"))
    return result
