"""One optimizer step: fixed samples, cut into micro-batches, gradients accumulated.

The samples of a step are drawn once (``samples_per_step`` of them) and cut
into micro-batches of at most ``trainer.batch_size``; the loss of every
micro-batch is already divided by the whole step's counts, so the summed
gradients do not depend on how the step was cut. Out-of-memory errors are not
handled here: they propagate to the loop, which recovers outside the
``except`` block and calls :func:`run_step` again with the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from napari_finetune.trainer.losses import finetune_loss, step_normalisers
from napari_finetune.trainer.precision import clip_gradients


def split_sizes(n: int, batch_size: int) -> list[int]:
    """Micro-batch sizes for ``n`` samples, none over ``batch_size``, none lost.

    Balanced: 5 at most 3 -> [3, 2]; 8 at most 3 -> [3, 3, 2].
    """
    if n <= 0:
        return []
    parts = math.ceil(n / batch_size)
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


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


def accumulate_gradients(
    trainer: Any,
    images: np.ndarray,
    labels: np.ndarray,
    scaled: bool = True,
    micro_batches: list[int] | None = None,
) -> torch.Tensor:
    """Forward and backward every micro-batch of a step; returns the step loss (tensor).

    Parameters
    ----------
    trainer : Finetuner
        Reads ``model``, ``teacher``, ``precision``, ``batch_size``,
        ``distillation``, ``hold_other_channels``, ``corrected``, ``device``.
    images, labels : numpy.ndarray
        All samples of the step: ``(n, 1, *patch)`` float32 and ``(n, *patch)`` int64.
    scaled : bool
        Scale the loss with the GradScaler (False for the precision probe,
        which looks at the raw gradients).
    micro_batches : list of int, optional
        Sizes to cut into; default :func:`split_sizes` with ``trainer.batch_size``.
    """
    device = torch.device(trainer.device)
    precision = trainer.precision
    all_labels = torch.from_numpy(np.ascontiguousarray(labels))
    teacher = trainer.teacher
    distillation = float(trainer.distillation)
    hold = bool(trainer.hold_other_channels)
    if teacher is None:
        distillation, hold = 0.0, False
    norms = step_normalisers(all_labels, trainer.corrected, distillation, hold)
    use_teacher = teacher is not None and (norms.distillation > 0 or norms.hold > 0)
    total = torch.zeros((), device=device)
    start = 0
    for size in micro_batches or split_sizes(len(images), trainer.batch_size):
        x = torch.from_numpy(np.ascontiguousarray(images[start : start + size]))
        x = x.to(device, non_blocking=True)
        y = all_labels[start : start + size].to(device, non_blocking=True)
        start += size
        with precision.autocast():
            logits = trainer.model(x)
            teacher_probs = None
            if use_teacher:
                with torch.no_grad():
                    teacher_probs = torch.sigmoid(teacher(x).float())
        loss = finetune_loss(logits, y, trainer.corrected, norms, teacher_probs, distillation, hold)
        if scaled:
            precision.backward(loss)
        else:
            loss.backward()
        total += loss.detach()
        # Drop this micro-batch's graph inputs before the next one allocates.
        del x, y, logits, teacher_probs, loss
    return total


def run_step(trainer: Any, images: np.ndarray, labels: np.ndarray) -> StepOutcome:
    """One attempt at an optimizer step with the given samples.

    Gradients are cleared first, so an attempt never sees a failed one's
    leftovers. A non-finite loss (any precision), or non-finite gradients under
    bf16 autocast, leave the weights untouched and return ``"nonfinite"``; the
    fp16 GradScaler handles its own gradients and reports ``"skipped"``.
    """
    optimizer = trainer.optimizer
    precision = trainer.precision
    optimizer.zero_grad(set_to_none=True)
    loss = float(accumulate_gradients(trainer, images, labels))
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return StepOutcome("nonfinite", loss)
    # fp16 gradients are divided by the scale first: measured and clipped as
    # they are (a no-op for the other dtypes, whose scaler is disabled).
    precision.unscale(optimizer)
    if precision.enabled and not precision.grad_scaler:
        # Under fp16 the scaler itself skips a step with inf/NaN gradients.
        if not precision.gradients_finite(trainer.model):
            optimizer.zero_grad(set_to_none=True)
            return StepOutcome("nonfinite", loss)
    if trainer.config.max_grad_norm is not None:
        clip_gradients(trainer.model, trainer.config.max_grad_norm)
    applied, before, after = guarded_optimizer_step(optimizer, precision)
    optimizer.zero_grad(set_to_none=True)
    return StepOutcome("applied" if applied else "skipped", loss, (before, after))


def guarded_optimizer_step(optimizer: torch.optim.Optimizer, precision: Any) -> tuple:
    """``precision.step(optimizer)``, all or nothing.

    AdamW's foreach path updates the step counters, the weights (decay) and the
    first moments before it allocates its square-root temporaries: an OOM
    there would leave half a step applied, and redoing the step would apply
    that half twice. The trainable weights and the optimizer state are copied
    first (small for LoRA; one model's worth for a full fine-tune) and put
    back if the step raises. The copies are made after the micro-batches'
    activations are freed, so they add to the optimizer step's peak, not to
    the forward/backward peak.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_params = [p.detach().clone() for p in params]
    saved_state = {
        p: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
        for p in params
        if p in optimizer.state
    }
    try:
        return precision.step(optimizer)
    except BaseException:
        with torch.no_grad():
            for param, value in zip(params, saved_params, strict=True):
                param.copy_(value)
        for param in params:
            if param in saved_state:
                optimizer.state[param] = saved_state[param]
            else:
                optimizer.state.pop(param, None)
        raise
