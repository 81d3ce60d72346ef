"""A ladder that climbs back: transient out-of-memory must not use it up.

An out-of-memory that comes and goes (fragmentation, another process on the
GPU for a while) halves the micro-batch, and the lower rung then stays for the
rest of the run. Here, after ``climb_after`` optimizer steps in a row without
an out-of-memory on a lower rung, the run tries the rung it came from again
(the effective batch is the same, so this only buys speed back); if that
fails the ladder steps down as usual and waits twice as long before trying
that rung again. At the bottom rung,
before the teacher is freed or the run gives up, the same step is retried
``bottom_retries`` times after emptying the cache. Every change is a log line.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch

from napari_finetune.devices import empty_device_cache
from napari_finetune.trainer.batchnorm_floor import split_respects

if TYPE_CHECKING:
    from napari_finetune.trainer.run_state import RunState



def can_halve(state: RunState) -> bool:
    """Whether :func:`~napari_finetune.trainer.oom_recovery.halve_micro_batch` would succeed."""
    smaller = (state.batch_size + 1) // 2
    return state.batch_size > 1 and split_respects(
        state.batchnorm_floor, state.samples_per_step, smaller
    )


def retry_at_bottom(state: RunState, device: torch.device, step: int) -> str:
    """Empty the cache and retry at the bottom rung; the log line, or "" when used up."""
    climb = state.climb
    if can_halve(state) or climb.retries >= climb.bottom_retries:
        return ""
    climb.retries += 1
    gc.collect()
    empty_device_cache(device)
    return (
        f"out of memory at step {step} at the bottom rung (batch {state.batch_size} × "
        f"accumulation {state.accumulation}): emptied the cache, retrying the same step "
        f"({climb.retries} of {climb.bottom_retries})"
    )


def after_applied_step(state: RunState) -> str:
    """Count a clean step; climb one rung when enough were clean. The log line or ""."""
    climb = state.climb
    climb.retries = 0
    climb.clean_steps += 1
    if not climb.rungs or climb.clean_steps < climb.steps_before_climbing():
        return ""
    old = (state.batch_size, state.accumulation)
    climb.climbed_to = climb.rungs.pop()
    state.use_micro_batch(climb.climbed_to)
    clean, climb.clean_steps = climb.clean_steps, 0
    return (
        f"no out-of-memory for {clean} steps: climbing back from batch {old[0]} × "
        f"accumulation {old[1]} to {state.batch_size} × {state.accumulation} "
        f"(effective {state.samples_per_step})"
    )
