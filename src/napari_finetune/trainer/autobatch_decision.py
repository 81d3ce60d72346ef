"""What autobatch measured and chose (a value the run's state holds and the record writes).

Below :mod:`~napari_finetune.trainer.run_state`, so the state can hold a
decision without importing the autobatch that makes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class AutobatchDecision:
    """What autobatch measured and chose.

    Attributes
    ----------
    applied : bool
        Whether the micro-batch now in use came from the fit (False: configured kept).
    batch_size, accumulation, samples_per_step : int
        The micro-batch in use after the decision, and how the step is cut.
    points : tuple of (int, int)
        (micro-batch, peak bytes above the resting state) measured.
    intercept_bytes, per_sample_bytes : float or None
        The fit ``a + b * batch`` (None without a fit).
    free_bytes : int or None
        Free device memory read after the profile.
    reserved_bytes : int
        Optimizer state still to be allocated, taken off the free memory.
    memory_fraction : float
        Share of the free memory planned for.
    message : str
        The log line.
    """

    applied: bool
    batch_size: int
    accumulation: int
    samples_per_step: int
    points: tuple[tuple[int, int], ...]
    intercept_bytes: float | None
    per_sample_bytes: float | None
    free_bytes: int | None
    reserved_bytes: int
    memory_fraction: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        """Plain types for the run record."""
        d = asdict(self)
        d["points"] = [list(p) for p in self.points]
        return d


__all__ = ["AutobatchDecision"]
