"""Before step 1: autobatch (when on), then the precision probe.

Autobatch measures at the run's precision; if the probe then falls back to
fp32, whose activations are larger than those just measured, the profile is
taken again. Each decision is a ``"probe"`` Status with autobatch's line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from napari_finetune.trainer.recovery import iter_probe
from napari_finetune.trainer.status import Status

if TYPE_CHECKING:
    from napari_finetune.trainer.loop import Finetuner


def memory_aware_start(trainer: Finetuner) -> Iterator[Status]:
    """Autobatch when the config (or the device) asks for it, then the precision probe."""
    use = trainer.config.autobatch_on(trainer.device.type)
    if use:
        yield choose_micro_batch(trainer)
    mixed = trainer.precision.enabled
    for kind, message in iter_probe(trainer):
        yield trainer.status(kind, message)
    if use and mixed and not trainer.precision.enabled:
        yield choose_micro_batch(trainer)


def choose_micro_batch(trainer: Finetuner) -> Status:
    """Run autobatch against ``trainer.memory_info`` (None: the device's own)."""
    from napari_finetune.trainer.autobatch import autobatch

    trainer.autobatch_decision = decision = autobatch(trainer, trainer.memory_info)
    if decision.applied:
        # The measured choice is the top rung: the ladder climbs back to it,
        # never above it to a batch the profile said does not fit.
        trainer.climb.rungs.clear()
    return trainer.status("probe", decision.message)
