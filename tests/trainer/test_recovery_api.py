"""The public recovery API in its documented form, on a real (tiny, CPU) Finetuner."""

from __future__ import annotations

import gc
import inspect
import random
import re
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.trainer import recovery
from napari_finetune.trainer.loop import Finetuner
from napari_finetune.trainer.recovery import halve_batch, probe_precision, survive_oom

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
PUBLIC = {"halve_batch", "survive_oom", "probe_precision"}


def _grads(trainer: Finetuner) -> list[torch.Tensor | None]:
    return [p.grad for p in trainer.model.parameters()]


def _make_stale_gradients(trainer: Finetuner) -> None:
    trainer.model(torch.rand(2, 1, *trainer.config.patch_shape)).sum().backward()
    assert any(g is not None for g in _grads(trainer))


def _teacher_parameters(trainer: Finetuner) -> list[weakref.ref]:
    # Kept in a function so that no local of the test holds the teacher.
    return [weakref.ref(p) for p in trainer.teacher.module.parameters()]


def test_halve_batch_walks_the_ladder_and_keeps_samples_per_step():
    trainer = make_trainer(batch_size=8, accumulation=1)
    assert trainer.optimizer is None  # halve_batch builds it
    rungs = []
    while halve_batch(trainer):
        rungs.append((trainer.batch_size, trainer.accumulation, trainer.samples_per_step))
    assert trainer.optimizer is not None
    assert rungs == [(4, 2, 8), (2, 4, 8), (1, 8, 8)]
    assert halve_batch(trainer) is False
    assert (trainer.batch_size, trainer.accumulation) == (1, 8)


def test_halve_batch_cuts_an_odd_step_without_losing_a_sample():
    trainer = make_trainer(batch_size=5, accumulation=1, steps=1, prefetch_steps=0)
    assert halve_batch(trainer)
    assert (trainer.batch_size, trainer.accumulation, trainer.samples_per_step) == (3, 2, 5)
    seen: list[int] = []
    hook = trainer.model.register_forward_pre_hook(lambda _m, args: seen.append(len(args[0])))
    try:
        events = list(trainer.run())
    finally:
        hook.remove()
    assert events[-1].kind == "finished" and trainer.steps_done == 1
    # The probe's one micro-batch of 3, then the step's 5 samples as 3 + 2.
    assert seen == [3, 3, 2]
    rungs = []
    while halve_batch(trainer):
        rungs.append((trainer.batch_size, trainer.accumulation))
    assert rungs == [(2, 3), (1, 5)]


def test_survive_oom_halves_then_frees_the_teacher_then_gives_up():
    trainer = make_trainer(batch_size=2, accumulation=1)
    trainer.build()
    _make_stale_gradients(trainer)
    assert survive_oom(trainer, 3)
    assert (trainer.batch_size, trainer.accumulation, trainer.samples_per_step) == (1, 2, 2)
    assert all(g is None for g in _grads(trainer))  # stale gradients cleared
    assert trainer.recovery_log[-1] == (
        "out of memory at epoch 3, step 1: batch 2 → 1, accumulation 1 → 2 (effective 2)"
    )
    assert trainer.teacher is not None and trainer.distillation == 0.5
    teacher_parameters = _teacher_parameters(trainer)
    assert teacher_parameters and all(r() is not None for r in teacher_parameters)

    _make_stale_gradients(trainer)
    assert survive_oom(trainer, 4)
    assert all(g is None for g in _grads(trainer))
    assert trainer.teacher is None
    assert trainer.distillation == 0.0 and not trainer.hold_other_channels
    assert trainer.dropped_at_step == 1
    assert trainer.recovery_log[-1] == (
        "out of memory at epoch 4, step 1 at batch 1: dropped distillation and the hold "
        "on the other channels, freed the teacher"
    )
    gc.collect()
    assert all(r() is None for r in teacher_parameters), "the teacher's weights are still held"

    logged = list(trainer.recovery_log)
    assert survive_oom(trainer, 5) is False
    assert trainer.recovery_log == logged
    assert (trainer.batch_size, trainer.accumulation) == (1, 2)


def test_survive_oom_empties_the_device_cache_after_letting_go(monkeypatch):
    """On every rung, and when nothing is left: the trainer's device's cache is emptied
    once the stale gradients (and, on the teacher's rung, the teacher) are let go."""
    from napari_finetune.trainer import oom_recovery

    trainer = make_trainer(batch_size=2, accumulation=1)
    trainer.build()
    emptied = []

    def empty_device_cache(device):
        emptied.append((device, all(g is None for g in _grads(trainer)), trainer.teacher is None))

    monkeypatch.setattr(oom_recovery, "empty_device_cache", empty_device_cache)
    _make_stale_gradients(trainer)
    assert survive_oom(trainer, 1)  # batch 2 -> 1
    assert [(d, cleared) for d, cleared, _ in emptied] == [(trainer.device, True)]
    emptied.clear()
    _make_stale_gradients(trainer)
    assert survive_oom(trainer, 2)  # the teacher freed
    assert [(d, cleared) for d, cleared, _ in emptied] == [(trainer.device, True)] * 2
    assert [gone for *_, gone in emptied] == [False, True]  # the last after the teacher went
    emptied.clear()
    assert survive_oom(trainer, 3) is False  # nothing left, the cache emptied all the same
    assert [(d, cleared) for d, cleared, _ in emptied] == [(trainer.device, True)]


def test_survive_oom_builds_an_unbuilt_trainer():
    trainer = make_trainer(batch_size=4, accumulation=1)
    assert trainer.optimizer is None
    assert survive_oom(trainer, 0)
    assert trainer.optimizer is not None
    assert (trainer.batch_size, trainer.accumulation) == (2, 2)
    assert trainer.recovery_log[-1].startswith("out of memory at epoch 0, step 1: batch 4 → 2")


def test_probe_precision_leaves_rng_batchnorm_and_gradients_as_they_were():
    trainer = make_trainer(norm="batch", batch_size=4)
    trainer.build()
    model = trainer.model
    _make_stale_gradients(trainer)  # gradients, and BatchNorm statistics moved off their start
    grads = [g.clone() for g in _grads(trainer)]
    weights = [p.detach().clone() for p in model.parameters()]
    running = {
        k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_b" in k
    }
    assert running
    torch.manual_seed(11)
    np.random.seed(12)  # noqa: NPY002 - the legacy global state is what the probe must keep
    random.seed(13)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()  # noqa: NPY002
    python_state, sampler_state = random.getstate(), trainer.sampler.get_state()

    messages = probe_precision(trainer)

    assert messages[-1].startswith("precision probe passed at batch 4")
    assert torch.equal(torch.get_rng_state(), torch_state)
    after = np.random.get_state()  # noqa: NPY002
    assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1])
    assert after[2:] == numpy_state[2:]
    assert random.getstate() == python_state
    assert trainer.sampler.get_state() == sampler_state
    for key, value in running.items():
        assert torch.equal(model.state_dict()[key], value), key
    for now, before in zip(_grads(trainer), grads, strict=True):
        assert now is not None and torch.equal(now, before)
    for now, before in zip(model.parameters(), weights, strict=True):
        assert torch.equal(now, before)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda t: halve_batch(t.state),
         "halve_batch(trainer) expects a Finetuner, got RunState; the typed helper is "
         "napari_finetune.trainer.oom_recovery.halve_micro_batch(state)"),
        (lambda t: survive_oom(t.state, t.parts),
         "survive_oom(trainer, epoch) expects a Finetuner, got RunState; the typed helper is "
         "napari_finetune.trainer.oom_recovery.recover_from_oom(state, parts, where)"),
        (lambda t: survive_oom(t, t.parts),
         "survive_oom(trainer, epoch) expects epoch as an int, got TrainingParts"),
        (lambda t: survive_oom(t, True),
         "survive_oom(trainer, epoch) expects epoch as an int, got bool"),
        (lambda t: probe_precision(t.parts),
         "probe_precision(trainer) expects a Finetuner, got TrainingParts; the typed helper "
         "is napari_finetune.trainer.oom_recovery.iter_probe(state, parts, sampler)"),
    ],
)
def test_a_wrong_argument_type_is_one_clear_type_error(call, expected):
    trainer = make_trainer(batch_size=4)
    trainer.build()
    with pytest.raises(TypeError) as info:
        call(trainer)
    assert str(info.value) == expected
    assert (trainer.batch_size, trainer.accumulation) == (4, 1)  # nothing was changed
    assert trainer.recovery_log == []


def test_a_released_trainer_says_so():
    trainer = make_trainer(batch_size=4)
    trainer.build()
    trainer.release()
    with pytest.raises(RuntimeError, match="released; build a new one"):
        halve_batch(trainer)
    assert trainer.batch_size == 4


def _documented_signatures() -> dict[str, tuple[list[str], str]]:
    """``name -> (parameter names, return annotation)`` from architecture.md's list."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("Public recovery API")
    section = text[start : text.index("\n\n", text.index("\n- ", start))]
    found = {}
    for name, params, returns in re.findall(
        r"^- `(\w+)\(([^)]*)\)(?: -> ([^`]+))?`", section, flags=re.MULTILINE
    ):
        names = [p.strip().split(":")[0].split("=")[0].strip() for p in params.split(",")]
        found[name] = ([n for n in names if n], returns.strip())
    return found


def test_architecture_md_documents_the_code_signatures():
    documented = _documented_signatures()
    assert set(documented) == PUBLIC
    for name, (params, returns) in documented.items():
        signature = inspect.signature(getattr(recovery, name))
        assert params == list(signature.parameters), name
        assert returns == str(signature.return_annotation), name
        assert name in recovery.__all__
