"""Finetuner.run: the OOM ladder end to end, exact step counts, precision fall-back."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch
from engine_setup import count_calls, make_trainer

from napari_finetune import testing as faults
from napari_finetune.trainer import precision as precision_module
from napari_finetune.trainer.recovery import RecoveryError


def run_all(trainer):
    return list(trainer.run())


def test_plain_run_counts_steps_and_yields_probe_then_steps():
    trainer = make_trainer(steps=3, batch_size=2)
    trainer.build()
    calls = count_calls(trainer.optimizer)
    events = run_all(trainer)
    assert [e.kind for e in events] == ["probe", "step", "step", "step", "finished"]
    assert [e.step for e in events] == [0, 1, 2, 3, 3]
    assert calls[0] == 3 and trainer.steps_done == 3
    assert all(e.loss is not None for e in events[1:])
    assert events[0].dtype == "float32" and events[0].distillation == "on"


def test_oom_above_batch_in_forward_steps_down_and_loses_no_step():
    trainer = make_trainer(steps=3, batch_size=8)
    trainer.build()
    calls = count_calls(trainer.optimizer)
    fault = faults.oom_above_batch(trainer.model, 2)
    events = run_all(trainer)
    recoveries = [e.message for e in events if e.kind == "recovery"]
    assert recoveries == [
        "out of memory in the precision probe: batch 8 → 4, accumulation 1 → 2 (effective 8)",
        "out of memory in the precision probe: batch 4 → 2, accumulation 2 → 4 (effective 8)",
    ]
    assert fault.count == 2
    # Each recovery Status shows the state its line describes, not the final one.
    probe_recoveries = [e for e in events if e.kind == "recovery"]
    assert [(e.batch_size, e.accumulation) for e in probe_recoveries] == [(4, 2), (2, 4)]
    assert (trainer.batch_size, trainer.accumulation) == (2, 4)
    assert calls[0] == 3 and trainer.steps_done == 3
    assert events[-1].effective_batch == 8 and events[-1].distillation == "on"


def test_oom_mid_run_redoes_the_same_step():
    """The fault arms after the probe: step 1 fails at batch 8 and is redone at 4 x 2."""
    trainer = make_trainer(steps=2, batch_size=8)
    trainer.build()
    calls = count_calls(trainer.optimizer)
    seen = []
    trainer.model.register_forward_pre_hook(lambda m, a: seen.append(a[0].sum().item()))
    run = trainer.run()
    assert next(run).kind == "probe"
    faults.oom_in_backward_above_batch(trainer.model, 4)
    seen.clear()
    events = list(run)
    assert events[0].kind == "recovery"
    assert events[0].message == (
        "out of memory at step 1: batch 8 → 4, accumulation 1 → 2 (effective 8)"
    )
    assert [e.kind for e in events[1:]] == ["step", "step", "finished"]
    # The same 8 samples: the failed batch-8 forward equals the two halves' sum.
    assert seen[0] == pytest.approx(seen[1] + seen[2], rel=1e-5)
    assert calls[0] == 2 and trainer.steps_done == 2


def test_oom_in_optimizer_step_is_not_applied_twice():
    trainer = make_trainer(steps=3, batch_size=4)
    trainer.build()
    calls = count_calls(trainer.optimizer)  # inner: counts the steps that really ran
    fault = faults.oom_in_optimizer_step(trainer.optimizer, times=2)
    events = run_all(trainer)
    assert fault.count == 2
    assert calls[0] == 3 and trainer.steps_done == 3
    assert [e.kind for e in events].count("recovery") == 2
    assert trainer.optimizer.state[trainer.optimizer.param_groups[0]["params"][0]]["step"] == 3


def test_oom_after_a_partial_optimizer_update_is_rolled_back():
    """The worst case: the update is applied, then OOM. Redoing must not apply it twice."""
    # The faulty run ends up cutting every step 1 + 1: so does the reference.
    # (Adam's first steps are nearly sign(gradient), so comparing different
    # cuts would magnify float-order differences to the learning rate.)
    clean = make_trainer(steps=2, batch_size=1, accumulation=2)
    run_all(clean)
    faulty = make_trainer(steps=2, batch_size=2)
    faulty.build()
    fault = faults.oom_in_optimizer_step(faulty.optimizer, times=1, after=True)
    events = run_all(faulty)
    assert fault.count == 1 and [e.kind for e in events].count("recovery") == 1
    first = faulty.optimizer.param_groups[0]["params"][0]
    assert faulty.optimizer.state[first]["step"] == 2
    assert (faulty.batch_size, faulty.accumulation) == (1, 2)
    # Identical, bit for bit; a doubly applied step would be off by ~1e-3.
    for a, b in zip(clean.model.parameters(), faulty.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_teacher_only_oom_drops_distillation_at_batch_one():
    trainer = make_trainer(steps=2, batch_size=2)
    trainer.build()
    teacher_module = trainer.teacher.module
    fault = faults.oom_in_teacher(trainer)
    teacher_ref = weakref.ref(teacher_module)
    del teacher_module
    events = run_all(trainer)
    fired = fault.count
    del fault  # its hook closure holds the teacher
    messages = [e.message for e in events if e.kind == "recovery"]
    assert messages[0].startswith("out of memory in the precision probe: batch 2 → 1")
    assert "dropped distillation and the hold" in messages[1]
    assert fired == 2
    assert trainer.teacher is None and trainer.distillation == 0.0
    assert not trainer.hold_other_channels
    gc.collect()
    assert teacher_ref() is None  # the full fine-tune's frozen copy is freed
    last = events[-1]
    assert (last.distillation, last.hold_other_channels) == ("dropped", "dropped")
    assert last.dropped_at_step == 1 and last.distillation_weight == 0.0
    assert trainer.steps_done == 2


def test_always_oom_fails_cleanly_listing_what_was_tried():
    trainer = make_trainer(steps=2, batch_size=4)
    trainer.build()
    faults.always_oom(trainer.model)
    with pytest.raises(RecoveryError) as info:
        run_all(trainer)
    text = str(info.value)
    for tried in ("batch 4 → 2", "batch 2 → 1", "dropped distillation", "Tried, in order"):
        assert tried in text
    assert "CUDA out of memory" in text  # the last error is quoted
    assert trainer.steps_done == 0


def test_non_oom_error_propagates_untouched():
    trainer = make_trainer(steps=2, batch_size=4)
    trainer.build()
    error = RuntimeError("shape mismatch somewhere")

    def hook(module, args):
        raise error

    trainer.model.register_forward_pre_hook(hook)
    with pytest.raises(RuntimeError) as info:
        run_all(trainer)
    assert info.value is error
    assert trainer.batch_size == 4 and trainer.recovery_log == []


def test_failed_attempt_activations_are_freed_before_the_retry():
    trainer = make_trainer(steps=1, batch_size=4, distillation=0.0, hold_other_channels=False)
    trainer.build()
    refs = []

    def keep_ref(module, args, output):
        refs.append(weakref.ref(output))

    trainer.model.encoders[0].register_forward_hook(keep_ref)
    run = trainer.run()
    assert next(run).kind == "probe"
    refs.clear()
    faults.oom_in_backward_above_batch(trainer.model.head, 2, times=1)
    recovery_event = next(run)
    assert recovery_event.kind == "recovery"
    assert refs and all(r() is None for r in refs), "the failed attempt's tensors are alive"
    assert [e.kind for e in run] == ["step", "finished"]


def test_odd_step_is_split_without_losing_samples():
    trainer = make_trainer(steps=1, batch_size=5, distillation=0.0, hold_other_channels=False)
    trainer.build()
    sizes = []
    trainer.model.register_forward_pre_hook(lambda m, a: sizes.append(a[0].shape[0]))
    run = trainer.run()
    next(run)  # the probe
    faults.oom_above_batch(trainer.model, 3, times=1)
    sizes.clear()
    events = list(run)
    assert sizes == [5, 3, 2]  # failed full batch, then 3 + 2
    assert (events[-1].batch_size, events[-1].accumulation) == (3, 2)


def test_fp16_nan_at_every_step_gives_fp16_up_with_weights_unchanged(monkeypatch):
    # Precision believes it is on a CUDA card without bf16: fp16 + GradScaler.
    monkeypatch.setattr(precision_module, "choose_precision", lambda *a: (torch.float16, True))
    trainer = make_trainer(steps=4, batch_size=2, mixed_precision=True)
    trainer.build()
    assert trainer.precision.describe() == "fp16 with loss scaling"
    calls = count_calls(trainer.optimizer)
    run = trainer.run()
    assert next(run).dtype == "float16"
    before = [p.detach().clone() for p in trainer.model.parameters()]
    fault = faults.nan_in_forward(trainer.model.head)
    redo = next(run)
    assert redo.kind == "recovery" and redo.dtype == "float32"
    assert "redoing this step in fp32 (weights unchanged)" in redo.message
    for p, b in zip(trainer.model.parameters(), before, strict=True):
        assert torch.equal(p, b)
    assert calls[0] == 0
    rest = list(run)
    # Steps 1 and 2 redone in fp32 with fp16 back after each; at step 3, the third
    # bad step within fifty, fp16 is given up.
    assert fault.count == 3
    assert [e.kind for e in rest] == [
        "step", "recovery", "step", "recovery", "step", "step", "finished"
    ]
    assert "training in fp32 from now on" in rest[3].message
    assert calls[0] == 4 and rest[-1].dtype == "float32" and not rest[-1].grad_scaler


def test_fp16_scaler_skip_is_reported_and_the_step_redone(monkeypatch):
    monkeypatch.setattr(precision_module, "choose_precision", lambda *a: (torch.float16, True))
    trainer = make_trainer(steps=2, batch_size=2, mixed_precision=True)
    trainer.build()
    calls = count_calls(trainer.optimizer)
    run = trainer.run()
    next(run)
    fired = []

    def inf_grad(module, args, output):
        if not fired:
            fired.append(1)
            output.register_hook(lambda g: torch.full_like(g, float("inf")))

    trainer.model.head.register_forward_hook(inf_grad)
    events = list(run)
    assert events[0].kind == "recovery"
    assert events[0].message.startswith("fp16 overflow at step 1: the GradScaler skipped")
    assert "scale 65536 → 32768" in events[0].message
    assert [e.kind for e in events[1:]] == ["step", "step", "finished"]
    assert calls[0] == 2 and events[-1].dtype == "float16"


def test_bf16_on_cpu_trains_or_falls_back_cleanly():
    # torch 2.13's CPU bf16 conv3d backward now and then puts NaN into one
    # weight gradient at this tiny size (measured): either outcome is correct,
    # a silent NaN step is not.
    trainer = make_trainer(steps=2, batch_size=2, mixed_precision=True, cpu_bf16=True)
    calls = []
    trainer.after_build.append(lambda t: calls.append(count_calls(t.optimizer)))
    events = run_all(trainer)
    assert events[-1].kind == "finished" and calls[0][0] == 2
    assert all(math.isfinite(e.loss) for e in events if e.kind == "step")
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    if events[-1].dtype == "float32":
        assert any("fp32" in e.message for e in events if e.kind in ("probe", "recovery"))
    else:
        assert events[-1].dtype == "bfloat16"


def test_stop_keeps_the_last_completed_step():
    trainer = make_trainer(steps=50, batch_size=2)
    events = []
    for event in trainer.run():
        events.append(event)
        if event.step == 2:
            trainer.stop()
    assert events[-1].kind == "stopped" and trainer.steps_done == 2
    assert events[-1].message == "stopped after step 2 of 50"


def test_same_seed_same_weights():
    weights = []
    for _ in range(2):
        trainer = make_trainer(steps=2, batch_size=2, mode="lora")
        run_all(trainer)
        weights.append([p.detach().clone() for p in trainer.model.parameters()])
    for a, b in zip(*weights, strict=True):
        assert torch.equal(a, b)


def test_memory_budget_ladder_end_to_end():
    """A real allocation budget: batch 8 does not fit, the ladder finds what does.

    Measured peaks of this set-up: 5.8 MB at batch 8, 3.1 MB at 4, 1.7 MB at 2.
    """
    trainer = make_trainer(steps=2, batch_size=8, patch_shape=(8, 16, 16))
    trainer.build()
    calls = count_calls(trainer.optimizer)
    with faults.MemoryBudget(2_000_000) as budget:
        events = run_all(trainer)
    assert budget.oom_count == 2 and budget.peak_bytes <= 2_000_000
    assert (trainer.batch_size, trainer.accumulation) == (2, 4)
    assert events[-1].kind == "finished" and calls[0] == 2
    assert sum(e.kind == "recovery" for e in events) == budget.oom_count
    assert events[-1].distillation == "on"  # nothing dropped that did not need to be


def test_two_dimensional_lora_run_and_predict():
    trainer = make_trainer(dims=2, steps=2, batch_size=4, mode="lora")
    events = run_all(trainer)
    assert events[-1].kind == "finished"
    probs = trainer.predict((slice(0, 20), slice(0, 24)))
    assert probs.shape == (2, 20, 24) and probs.min() >= 0 and probs.max() <= 1


def test_status_and_record_show_the_true_samples_per_step_after_an_odd_split(tmp_path):
    """5 samples cut 3 + 2 are 5 per step, not 3 x 2 = 6."""
    from napari_finetune.model.checkpoint import load_checkpoint

    trainer = make_trainer(steps=1, batch_size=5, distillation=0.0, hold_other_channels=False)
    trainer.build()
    faults.oom_above_batch(trainer.model, 3)
    events = run_all(trainer)
    recovery = [e for e in events if e.kind == "recovery"][0]
    assert (recovery.batch_size, recovery.accumulation) == (3, 2)
    assert recovery.message.endswith("(effective 5)")
    assert all(e.effective_batch == 5 for e in events)
    run = load_checkpoint(trainer.export(tmp_path / "odd.pt")).metadata["run"]
    assert (run["batch_size"], run["accumulation"], run["samples_per_step"]) == (3, 2, 5)


def test_a_lora_run_says_which_layers_carry_adapters():
    trainer = make_trainer(mode="lora", steps=1, batch_size=2)
    events = list(trainer.run())
    assert events[0].kind == "probe" and events[0].message.startswith("LoRA adapters on 13 layers")
