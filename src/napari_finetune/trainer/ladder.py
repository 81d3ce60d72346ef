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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from napari_finetune.devices import empty_device_cache
from napari_finetune.trainer.batchnorm_floor import split_respects

if TYPE_CHECKING:
    from napari_finetune.trainer.run_state import RunState

# Steps in a row without out-of-memory before one rung up is tried again.
CLIMB_AFTER = 25
# Retries of one step at the bottom rung (cache emptied before each).
BOTTOM_RETRIES = 3


@dataclass
class Climb:
    """Where the ladder can climb back to.

    Attributes
    ----------
    rungs : list of int
        Micro-batches the ladder stepped down from, the last one nearest.
    clean_steps : int
        Optimizer steps in a row applied without an out-of-memory.
    retries : int
        Retries of the current step at the bottom rung so far.
    climb_after, bottom_retries : int
        The two thresholds (module defaults; a benchmark or test may change them).
    """

    rungs: list[int] = field(default_factory=list)
    clean_steps: int = 0
    retries: int = 0
    climb_after: int = CLIMB_AFTER
    bottom_retries: int = BOTTOM_RETRIES
    climbed_to: int | None = None
    failed_climbs: dict[int, int] = field(default_factory=dict)

    def stepped_down(self, from_batch: int, to_batch: int) -> None:
        """Remember the rung left (a halving, or a smaller start than configured)."""
        if from_batch == self.climbed_to:
            # A climb that failed: wait twice as long before trying that rung again.
            self.failed_climbs[from_batch] = self.failed_climbs.get(from_batch, 0) + 1
        self.climbed_to = None
        if to_batch < from_batch:
            self.rungs.append(from_batch)
        self.clean_steps = 0

    def steps_before_climbing(self) -> int:
        """Clean steps needed before the next rung up is tried (doubled per failure there)."""
        if not self.rungs:
            return 0
        return self.climb_after * 2 ** self.failed_climbs.get(self.rungs[-1], 0)

    def out_of_memory(self) -> None:
        """An out-of-memory happened: the count of clean steps starts again."""
        self.clean_steps = 0


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
