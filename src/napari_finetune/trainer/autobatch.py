"""The micro-batch chosen from a measured memory profile before the first step.

The real training micro-step (student forward and backward, the teacher's
forward when it is on, at the run's patch and precision) is run at
micro-batches 1, 2, 4, ... up to the samples per step, and its peak memory
above the resting state is measured at each. A line ``memory = a + b * batch``
is fitted (``numpy.polyfit``), and the largest micro-batch whose prediction
stays under ``memory_fraction`` of the free memory (less the optimizer state
the first step will allocate) is taken; the accumulation makes up the same
samples per step, so the effective batch never changes. The profile stops
before a size the fit already predicts to be too large, and at the first size
that runs out of memory; a fit that makes no sense (slope not positive, a
larger batch measured smaller) keeps the configured batch. The out-of-memory
ladder stays armed behind the choice.

Nothing of training is disturbed: the random states, BatchNorm running
statistics and gradients are restored, and no optimizer step is taken.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from napari_finetune.devices import empty_device_cache
from napari_finetune.errors import is_oom_error
from napari_finetune.trainer import step as _step
from napari_finetune.trainer.autobatch_decision import AutobatchDecision
from napari_finetune.trainer.batchnorm_floor import split_respects
from napari_finetune.trainer.memory_info import MemoryInfo, format_bytes, memory_info_for
from napari_finetune.trainer.run_state import RunState, TrainingParts
from napari_finetune.trainer.state import left_as_it_was, restore_batchnorm

if TYPE_CHECKING:
    from napari_finetune.data.sampling import PatchSampler

Samples = tuple[np.ndarray, np.ndarray]

__all__ = ["AutobatchDecision", "MemoryInfo", "autobatch", "choose_batch", "profile_sizes"]


def profile_sizes(samples: int, smallest: int = 1) -> list[int]:
    """Micro-batches to measure: powers of two from ``smallest``, then ``samples``."""
    sizes, size = [], max(1, smallest)
    while size < samples:
        sizes.append(size)
        size *= 2
    sizes.append(samples)
    return sizes


def fit_line(points: list[tuple[int, int]]) -> tuple[float, float] | str:
    """``(a, b)`` of ``bytes = a + b * batch``, or why the points make no line."""
    if len(points) < 2:
        return "fewer than 2 sizes could be measured"
    batches = np.array([p[0] for p in points], float)
    measured = np.array([p[1] for p in points], float)
    if np.any(np.diff(measured) < 0):
        return "a larger micro-batch measured less memory than a smaller one"
    b, a = np.polyfit(batches, measured, 1)
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return f"the fitted memory per sample is {b:.3g} bytes, not positive"
    return float(a), float(b)


def choose_batch(
    a: float, b: float, budget: float, samples: int, smallest: int = 1, ceiling: int | None = None
) -> tuple[int, int]:
    """(micro-batch, accumulation): the largest balanced cut of ``samples`` that fits.

    The fit allows ``floor((budget - a) / b)`` samples (at most ``ceiling``, at
    least ``smallest``); the accumulation is the fewest micro-batches of at
    most that many, and the micro-batch the largest part of the balanced cut
    (64 samples, 9 fit -> 8 x 8).
    """
    fits = int(math.floor((budget - a) / b)) if budget > a else 0
    fits = max(smallest, min(samples, ceiling or samples, fits))
    accumulation = math.ceil(samples / fits)
    return math.ceil(samples / accumulation), accumulation


def autobatch(
    state: RunState,
    parts: TrainingParts,
    sampler: PatchSampler,
    memory_fraction: float,
    memory: MemoryInfo | None = None,
    step_samples: Samples | None = None,
) -> AutobatchDecision:
    """Measure, fit and choose; sets the micro-batch and accumulation of ``state``.

    Parameters
    ----------
    state : RunState
        The run's state; its micro-batch and accumulation are set when the fit applies.
    parts : TrainingParts
        The built run; its micro-step is the one measured.
    sampler : PatchSampler
        Draws the profile's samples (unless ``step_samples`` are given).
    memory_fraction : float
        Share of the free memory the chosen micro-batch may plan to use.
    step_samples : (images, labels), optional
        Measure on these (a step's samples, mid-run) instead of drawing from the
        sampler, which a running sample feed owns.
    memory : MemoryInfo, optional
        Where free memory and peaks are read; default the device's own.
    """
    memory = memory or memory_info_for(parts.device)
    samples = int(state.samples_per_step)
    floor = state.batchnorm_floor
    smallest = floor.min_batch if floor is not None else 1
    fraction = float(memory_fraction)
    configured = (state.batch_size, state.accumulation)

    def keep(
        reason: str, points: Sequence[tuple[int, int]] = (), free: int | None = None
    ) -> AutobatchDecision:
        line = (
            f"autobatch: keeping micro-batch {configured[0]} × accumulation {configured[1]} "
            f"({samples} per step): {reason}"
        )
        return AutobatchDecision(
            False, configured[0], configured[1], samples, tuple(points),
            None, None, free, 0, fraction, line,
        )

    if memory is None:
        return keep(f"{parts.device.type} gives no device memory figures to plan with")
    if samples <= smallest:
        return keep("one micro-batch is the whole step, nothing to choose")
    reserved = pending_optimizer_bytes(parts.optimizer)
    points, failed_at = measure(
        parts, state, sampler, memory, samples, smallest,
        lambda: fraction * memory.free_bytes() - reserved, step_samples,
    )
    free = int(memory.free_bytes())
    fit = fit_line(points)
    if isinstance(fit, str):
        return keep(f"{fit} ({_show_points(points)}); the ladder stays armed", points=points,
                    free=free)
    a, b = fit
    budget = fraction * free - reserved
    # A size that ran out of memory is a hard ceiling, whatever the fit says.
    ceiling = None if failed_at is None else max(smallest, failed_at - 1)
    batch, accumulation = choose_batch(a, b, budget, samples, smallest, ceiling)
    if not split_respects(floor, samples, batch):
        return keep("the fitted micro-batch would split below the BatchNorm floor",
                    points=points, free=free)
    state.batch_size, state.accumulation = batch, accumulation
    unit = max(abs(a), b)
    line = (
        f"autobatch: micro-batch {batch} × accumulation {accumulation} ({samples} per step): "
        f"{format_bytes(a, unit)} + {format_bytes(b, unit)}/sample measured at "
        f"{_show_points(points)}, {format_bytes(free)} free × {fraction:g}"
        + (f" less {format_bytes(reserved)} optimizer state" if reserved else "")
        + f" ({memory.name})"
    )
    if failed_at is not None:
        line += f"; batch {failed_at} ran out of memory in the profile"
    if a + b * batch > budget:
        line += "; even that is predicted not to fit, the ladder stays armed"
    return AutobatchDecision(
        True, batch, accumulation, samples, tuple(points), a, b, free, reserved, fraction, line
    )


def measure(
    parts: TrainingParts,
    state: RunState,
    sampler: PatchSampler,
    memory: MemoryInfo,
    samples: int,
    smallest: int,
    budget: Callable[[], float],
    step_samples: Samples | None = None,
) -> tuple[list[tuple[int, int]], int | None]:
    """Peak bytes of the real micro-step at each profile size, state restored after.

    ``budget()`` is the planned limit: a size the points so far predict above
    it is not tried, the first size that runs out of memory ends the profile.

    Returns
    -------
    points : list of (int, int)
        (micro-batch, peak bytes) measured.
    failed_at : int or None
        The size that ran out of memory, if one did.
    """
    model = parts.model
    # Mid-run the sample feed owns the sampler: its state is neither read nor restored.
    own_sampler = sampler if step_samples is None else None
    handle = model.register_forward_hook(lambda *_: memory.observe())
    points: list[tuple[int, int]] = []
    failed_at = None
    try:
        with left_as_it_was(model, own_sampler) as bn:
            images, labels = step_samples or sampler.sample(samples)
            for size in profile_sizes(samples, smallest):
                fit = fit_line(points)
                # Stop before a size the points so far already say cannot fit.
                if not isinstance(fit, str) and fit[0] + fit[1] * size > budget():
                    break
                peak = _measure_one(parts, state, memory, images[:size], labels[:size])
                restore_batchnorm(bn)
                if peak is None:  # out of memory: the profile ends here
                    failed_at = size
                    break
                points.append((size, peak))
    finally:
        handle.remove()
        gc.collect()
        empty_device_cache(parts.device)
    return points, failed_at


def _measure_one(
    parts: TrainingParts,
    state: RunState,
    memory: MemoryInfo,
    images: np.ndarray,
    labels: np.ndarray,
) -> int | None:
    model = parts.model
    model.zero_grad(set_to_none=True)
    gc.collect()
    empty_device_cache(parts.device)
    failed = False
    memory.start_measure()
    try:
        _step.accumulate_gradients(
            parts, state, images, labels, scaled=False, micro_batches=[len(images)]
        )
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        failed = True  # recovered below, outside the except block (its traceback holds tensors)
    peak = memory.measured_peak()
    model.zero_grad(set_to_none=True)
    if failed:
        gc.collect()
        empty_device_cache(parts.device)
        return None
    return int(peak)


def pending_optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes AdamW's two moments will take at the first step (0 once they exist)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p in optimizer.state and optimizer.state[p] for p in params):
        return 0
    return 2 * sum(p.numel() * p.element_size() for p in params)


def _show_points(points: list[tuple[int, int]]) -> str:
    if not points:
        return "no size measured"
    return "batch " + ", ".join(str(size) for size, _ in points)
