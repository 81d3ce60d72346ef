"""The public recovery API: step a :class:`~napari_finetune.trainer.loop.Finetuner` down.

Scripts that drive a ``Finetuner`` by hand and checks outside the project call
these with the trainer itself (docs/architecture.md, "Public recovery API")::

    halve_batch(trainer) -> bool           # 8 x 1 -> 4 x 2 -> 2 x 4 -> 1 x 8; False at batch 1
    survive_oom(trainer, epoch) -> bool    # halve first; at batch 1 drop distillation
                                           # and the hold, free the teacher
    probe_precision(trainer) -> list[str]  # one mixed-precision forward + backward,
                                           # compared with fp32

Each builds the trainer first (:meth:`~napari_finetune.trainer.loop.Finetuner.build`
is idempotent) and delegates to the typed rules of
:mod:`~napari_finetune.trainer.oom_recovery`, which the loop itself calls on its
:class:`~napari_finetune.trainer.run_state.RunState` and
:class:`~napari_finetune.trainer.run_state.TrainingParts`
(``halve_micro_batch(state)``, ``recover_from_oom(state, parts, where)``,
``iter_probe(...)``). A call with anything but a ``Finetuner`` raises one
``TypeError`` that names the expected argument and the typed helper.
"""

from __future__ import annotations

import numbers

from napari_finetune.errors import OOM_MESSAGES, RecoveryError, is_oom_error
from napari_finetune.trainer.loop import Finetuner
from napari_finetune.trainer.oom_recovery import halve_micro_batch, iter_probe, recover_from_oom
from napari_finetune.trainer.precision import Precision, choose_precision

__all__ = [
    "OOM_MESSAGES",
    "Precision",
    "RecoveryError",
    "choose_precision",
    "halve_batch",
    "is_oom_error",
    "probe_precision",
    "survive_oom",
]


def _built_trainer(trainer: object, call: str, helper: str) -> Finetuner:
    """``trainer``, built, or a TypeError naming the expected argument and ``helper``."""
    if not isinstance(trainer, Finetuner):
        raise TypeError(
            f"{call} expects a Finetuner, got {type(trainer).__name__}; "
            f"the typed helper is napari_finetune.trainer.oom_recovery.{helper}"
        )
    trainer.build()
    if trainer.optimizer is None:  # build() does nothing on a released trainer
        raise RuntimeError(
            f"{call}: this Finetuner was released; build a new one to train again."
        )
    return trainer


def halve_batch(trainer: Finetuner) -> bool:
    """Halve the trainer's micro-batch, keep the samples per optimizer step.

    8 x 1 -> 4 x 2 -> 2 x 4 -> 1 x 8. An odd step keeps every sample: 5 x 1 ->
    3 x 2 (micro-batches 3 + 2) -> 2 x 3 -> 1 x 5. The ladder stops above a
    micro-batch that would give a BatchNorm layer one value per channel.

    Parameters
    ----------
    trainer : Finetuner
        Built first if it is not yet; its ``batch_size`` and ``accumulation``
        change in place.

    Returns
    -------
    bool
        False when there is nothing left to halve (batch 1, or the BatchNorm floor).

    Raises
    ------
    TypeError
        ``trainer`` is not a Finetuner (the run state has ``halve_micro_batch(state)``).
    """
    built = _built_trainer(trainer, "halve_batch(trainer)", "halve_micro_batch(state)")
    return halve_micro_batch(built.state)


def survive_oom(trainer: Finetuner, epoch: int) -> bool:
    """Step the trainer one rung down after an out-of-memory at ``epoch``.

    First halve the micro-batch (:func:`halve_batch`); at batch 1 drop
    distillation and the hold on the other channels and free the teacher.
    Stale gradients and the scaler's half-done step are cleared, garbage
    collected and the device cache emptied either way. The action is appended
    to ``trainer.recovery_log`` as "out of memory at epoch E, step N: ...".
    Call it after leaving the ``except`` block that caught the error (its
    traceback holds the failed attempt's activations).

    Parameters
    ----------
    trainer : Finetuner
        Built first if it is not yet; changed in place.
    epoch : int
        The epoch at which the out-of-memory happened (``trainer.epoch``), for
        the log line.

    Returns
    -------
    bool
        False when nothing is left to give up.

    Raises
    ------
    TypeError
        ``trainer`` is not a Finetuner (the typed helper is
        ``recover_from_oom(state, parts, where)``), or ``epoch`` is not an int.
    """
    built = _built_trainer(
        trainer, "survive_oom(trainer, epoch)", "recover_from_oom(state, parts, where)"
    )
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral):
        raise TypeError(
            f"survive_oom(trainer, epoch) expects epoch as an int, got {type(epoch).__name__}"
        )
    state = built.state
    where = f"at epoch {int(epoch)}, step {state.steps_done + 1}"
    return recover_from_oom(state, built.parts, where)


def probe_precision(trainer: Finetuner) -> list[str]:
    """Forward and backward one real micro-batch before training.

    Mixed precision falls back to fp32 when the loss or a gradient is not
    finite, or when the finite result disagrees with an fp32 pass of the same
    weights, inputs and random states (one more forward and backward; output
    cosine under 0.99 or gradient cosine under 0.9,
    :mod:`~napari_finetune.trainer.precision_check`): the verdict names the
    measured cosine and ``trainer.state.precision_check`` keeps the figures for
    the run record. An fp32 run has nothing to compare. An out-of-memory steps
    down the ladder (:func:`survive_oom`'s rules) and the probe is tried again.
    Nothing of training is disturbed: the random states (torch CPU/CUDA, numpy,
    Python, the sampler's generator), the BatchNorm running statistics and the
    gradients are as before, and the weights are not stepped.

    Parameters
    ----------
    trainer : Finetuner
        Built first if it is not yet.

    Returns
    -------
    list of str
        Log lines: one per recovery action, the verdict last (e.g. "precision
        probe: bfloat16 disagrees with fp32 on this model (cosine 0.83): training
        in fp32").

    Raises
    ------
    TypeError
        ``trainer`` is not a Finetuner (the typed helper is ``iter_probe(state, parts,
        sampler)``).
    RecoveryError
        Out of memory with nothing left to give up.
    """
    built = _built_trainer(
        trainer, "probe_precision(trainer)", "iter_probe(state, parts, sampler)"
    )
    probe = iter_probe(built.state, built.parts, built._get_sampler(), built.memory_history)
    return [message for _, message in probe]
