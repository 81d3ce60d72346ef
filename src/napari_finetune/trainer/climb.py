"""Where the out-of-memory ladder can climb back to (a value the run's state holds).

The ladder's rules (:mod:`~napari_finetune.trainer.ladder`) read and change
it; it sits below the run state so that neither imports the other's module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


__all__ = ["BOTTOM_RETRIES", "CLIMB_AFTER", "Climb"]
