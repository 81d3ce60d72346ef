"""One host read of a device value per optimizer step (bf16 and fp32), counted on the CPU.

Every read (``float(loss)``, ``bool(finite)``) waits for the GPU's queue; the
step reads its loss and its gradients' verdict together.
"""

from __future__ import annotations

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.testing.host_reads import HostReads, Read
from napari_finetune.trainer import loop


def counted_attempts(monkeypatch, trainer, first_attempt_check=None):
    """Run ``trainer``; for every attempt at a step: (dtype, outcome, host reads)."""
    attempts = []
    original = loop.run_step

    def run_step(parts, *args, **kwargs):
        before = [p.detach().clone() for p in parts.model.parameters()]
        counter = HostReads(parts.device, parts.model.parameters())
        with counter:
            outcome = original(parts, *args, **kwargs)
        if first_attempt_check is not None and not attempts:
            first_attempt_check(outcome, before, list(parts.model.parameters()))
        attempts.append((parts.precision.dtype_name, outcome.kind, counter.reads))
        return outcome

    monkeypatch.setattr(loop, "run_step", run_step)
    events = list(trainer.run())
    assert events[-1].kind == "finished"
    return attempts


@pytest.mark.parametrize("mixed", [True, False], ids=["bf16", "fp32"])
def test_a_step_reads_one_device_value(monkeypatch, mixed):
    trainer = make_trainer(dims=2, steps=3, batch_size=2, mixed_precision=mixed, cpu_bf16=True)
    trainer.build()
    attempts = counted_attempts(monkeypatch, trainer)
    dtype = "bfloat16" if mixed else "float32"
    assert [(d, kind) for d, kind, _ in attempts] == [(dtype, "applied")] * 3
    assert all(len(reads) == 1 for _, _, reads in attempts), attempts


def test_nonfinite_bf16_gradients_are_refused_in_the_same_read(monkeypatch):
    trainer = make_trainer(dims=2, steps=1, batch_size=2, mixed_precision=True, cpu_bf16=True)
    trainer.build()
    weight = next(trainer.parts.model.parameters())
    real_step = loop.run_step

    def with_inf_gradients(*args, **kwargs):
        # A finite loss, inf gradients; after the run's precision probe, which
        # would choose fp32 for such gradients before step 1.
        hook = weight.register_hook(lambda grad: grad * float("inf"))
        try:
            return real_step(*args, **kwargs)
        finally:
            hook.remove()

    monkeypatch.setattr(loop, "run_step", with_inf_gradients)
    checked = []

    def untouched(outcome, before, after):
        assert outcome.kind == "nonfinite" and outcome.loss == outcome.loss  # finite loss
        assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
        assert all(p.grad is None for p in after)
        checked.append(True)

    attempts = counted_attempts(monkeypatch, trainer, untouched)
    assert checked and attempts[0][:2] == ("bfloat16", "nonfinite")
    assert len(attempts[0][2]) == 1
    # fp32 from then on: its redo of the step is applied (the gradients unchecked).
    assert [a[:2] for a in attempts[1:]] == [("float32", "applied")]


def test_the_counter_tells_device_values_from_host_ones():
    model = torch.nn.Linear(3, 1)
    counts = torch.from_numpy(__import__("numpy").ones(4))
    with HostReads("cpu", model.parameters()) as counter:
        loss = model(torch.ones(2, 3).to("cpu")).sum()
        loss.backward()
        int(counts.sum())  # labels' counts: on the host on a GPU too
        step = torch.tensor(0.0, device="cpu")  # an optimizer's host counter
        step += 1
        step.item()
        float(loss.detach())
        bool(torch.isfinite(model.weight.grad).all())
        total = torch.zeros(())
        total += loss.detach()
        total.tolist()
    assert [r.call for r in counter.reads] == ["__float__", "__bool__", "tolist"]
    assert isinstance(counter.reads[0], Read) and counter.reads[0].where.startswith(
        "test_step_syncs.py:")
