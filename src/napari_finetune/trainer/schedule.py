"""The learning rate of each optimizer step: a warm-up, then a cosine decay.

A pure function of the step number, not a torch ``LRScheduler`` with state of
its own: a step redone after an out-of-memory (same samples, smaller
micro-batches) gets the same rate because ``steps_done`` did not move, a
resumed or degraded run needs nothing restored, and several ranks agree
without talking.
"""

from __future__ import annotations

import math

import torch

from napari_finetune.config import Schedule

# Share of the run's steps spent ramping the rate up from a tenth of it. AdamW's
# first updates are a full learning rate in every direction whatever the gradient's
# size (its second moments are still empty): at 1e-3 they knock a pretrained model
# off what it already does well before the painting has steered it.
WARMUP_FRACTION = 0.05
WARMUP_START = 0.1
# Where the cosine ends, as a share of the base rate: the last steps still move.
FINAL_FRACTION = 0.05


def learning_rate_factor(step: int, total: int, schedule: Schedule) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (1-based) of ``total``.

    Parameters
    ----------
    step : int
        The step about to be applied, 1 for the first.
    total : int
        Steps the run was asked for (``FinetuneConfig.steps``); a run that goes
        on past it (a resumed run) stays at the final rate.
    schedule : {"constant", "cosine"}
        "constant": 1 at every step. "cosine": a linear warm-up from
        :data:`WARMUP_START` over the first :data:`WARMUP_FRACTION` of the steps
        (at least one step; none for runs of one or two steps), then half a
        cosine from 1 at the next step down to :data:`FINAL_FRACTION` at step ``total``.

    Returns
    -------
    float
        In (0, 1].
    """
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(
            f"unknown learning-rate schedule {schedule!r}; use 'constant' or 'cosine'."
        )
    total = max(int(total), 1)
    warmup = max(1, round(WARMUP_FRACTION * total)) if total > 2 else 0
    if step <= warmup:
        return WARMUP_START + (1.0 - WARMUP_START) * (step - 1) / warmup
    # The first step after the warm-up runs at the full rate, the run's last at the final one.
    decay = total - warmup - 1
    progress = min(1.0, (step - warmup - 1) / decay) if decay > 0 else 0.0
    return FINAL_FRACTION + (1.0 - FINAL_FRACTION) * 0.5 * (1.0 + math.cos(math.pi * progress))


def apply_learning_rate(
    optimizer: torch.optim.Optimizer, step: int, total: int, schedule: Schedule
) -> float:
    """Set every parameter group's rate for ``step``; returns the first group's.

    Each group's rate as built is kept under ``"base_lr"`` the first time, so
    groups built with different rates keep their ratio.
    """
    factor = learning_rate_factor(step, total, schedule)
    for group in optimizer.param_groups:
        base = group.setdefault("base_lr", float(group["lr"]))
        group["lr"] = base * factor
    return float(optimizer.param_groups[0]["lr"]) if optimizer.param_groups else 0.0
