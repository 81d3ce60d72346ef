"""Before step 1: autobatch (when on), then the precision probe.

Autobatch measures at the run's precision; if the probe then falls back to
fp32, whose activations are larger than those just measured, or frees the
teacher, the profile is taken again. When the ladder frees the teacher
mid-run, the micro-batch grows into the memory it gave back the same way
(:func:`choose_micro_batch`, called from the retry loop). Each decision is a
Status with autobatch's line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from napari_finetune.trainer.oom_recovery import iter_probe
from napari_finetune.trainer.status import Status

if TYPE_CHECKING:
    from napari_finetune.trainer.autobatch import Samples
    from napari_finetune.trainer.loop import Finetuner


def memory_aware_start(trainer: Finetuner) -> Iterator[Status]:
    """Autobatch when the config (or the device) asks for it, then the precision probe."""
    use = trainer.config.autobatch_on(trainer.device.type)
    if use:
        yield choose_micro_batch(trainer)
    state, precision = trainer.state, trainer.precision
    mixed, had_teacher = precision.enabled, state.teacher is not None
    probe = iter_probe(
        state, trainer.parts, trainer.sampler, trainer.memory_history, trainer.sync
    )
    for kind, message in probe:
        yield trainer.status(kind, message)
    fell_back = mixed and not precision.enabled
    freed = had_teacher and state.teacher is None
    if use and (fell_back or freed):
        yield choose_micro_batch(trainer)


def choose_micro_batch(trainer: Finetuner, step_samples: Samples | None = None) -> Status:
    """Run autobatch against ``trainer.memory_info`` (None: the device's own).

    ``step_samples``: the current step's samples, when called mid-run (after
    the teacher was freed, to grow into the memory it gave back).
    """
    from napari_finetune.trainer.autobatch import autobatch

    state = trainer.state
    decision = autobatch(trainer, trainer.memory_info, step_samples)
    message = decision.message
    # Several ranks train one micro-batch: the smallest any of them chose.
    agreed = trainer.sync.smallest(state.batch_size)
    if agreed != state.batch_size:
        state.use_micro_batch(agreed)
        message += f"; micro-batch {agreed} × {state.accumulation}, the smallest of the ranks"
    state.autobatch_decision = decision
    if decision.applied:
        # The measured choice is the top rung: the ladder climbs back to it,
        # never above it to a batch the profile said does not fit.
        state.climb.rungs.clear()
    return trainer.status("probe", message)
