"""One rank of the multi-process tests (run as a script, one process per rank).

The environment says who it is, as torchrun would (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). ``python ddp_rank.py OUT SCENARIO [SCENARIO ...]``
joins the process group once, then for each scenario in turn trains the tiny
set-up of ``engine_setup`` for 5 steps with the gloo backend (a new trainer,
seeded as the first), injects the scenario's fault on one rank, and writes
``OUT/SCENARIO/rank-N.pt``: the final weights, the events and the run record.
Several scenarios share one process start and one group (the tests' time).

Scenarios: ``plain``; ``oom`` (rank 1 alone runs out of memory in step 3);
``oom-after-step`` (rank 1 alone runs out of memory after its optimizer step 3);
``nan`` (rank 0 alone gets a NaN under bf16 autocast, from the precision probe on);
``validation`` (held-out checks, rank 0's schedule wants one after every step and
rank 1's only after the last).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from engine_setup import make_trainer

from napari_finetune import testing
from napari_finetune.trainer import distributed
from napari_finetune.trainer.record import run_record

STEPS = 5


def main(out: Path, scenarios: list[str]) -> None:
    torch.set_num_threads(1)
    sync = distributed.start("cpu", timeout_s=float(os.environ.get("DDP_TEST_TIMEOUT", "30")))
    for scenario in scenarios:
        folder = out / scenario
        folder.mkdir(parents=True, exist_ok=True)
        run_scenario(folder, scenario, sync)
    distributed.stop()


def run_scenario(out: Path, scenario: str, sync: distributed.RankSync) -> None:
    mixed = scenario == "nan"
    checked = {"validation": dict(validation_fraction=0.2, validation_every=1)}.get(scenario, {})
    # No normalisation layer: a conv bias before GroupNorm has a gradient of pure
    # rounding noise, which AdamW turns into full-size steps of either sign.
    trainer = make_trainer(
        norm="none", steps=STEPS, batch_size=2, sync=sync, mixed_precision=mixed, cpu_bf16=mixed,
        **checked,
    )
    if scenario == "validation":
        # Each rank's clock says its own thing about what a check costs: here rank
        # 0 finds every step worth a check and rank 1 only the last one.
        own_due = trainer.validator.due
        trainer.validator.due = (  # type: ignore[method-assign]
            (lambda step, total: own_due(step, total) or True) if sync.rank == 0
            else (lambda step, total: own_due(step, total) and step >= total)
        )
    events = []
    faults: list[testing.Fault] = []
    if scenario == "nan" and sync.rank == 0:
        # From the precision probe on: this tiny model's own bf16 gradients are
        # garbage by step 1 or 2 (norms of 1e15 where fp32 has 1e-3), so a NaN
        # injected later would find the run in fp32 already.
        trainer.after_build.append(
            lambda built: faults.append(testing.nan_in_forward(built.model.head))
        )
    for status in trainer.run():
        events.append((status.kind, status.step, status.batch_size, status.accumulation,
                       status.dtype, status.message))
        after_step_2 = status.kind == "step" and status.step == 2
        if after_step_2 and scenario == "oom" and sync.rank == 1:
            testing.oom_above_batch(trainer.model, 1, times=1)
        if after_step_2 and scenario == "oom-after-step" and sync.rank == 1:
            # The worst case: rank 1's update applied, then out of memory; rank 0's fine.
            faults.append(testing.oom_in_optimizer_step(trainer.optimizer, after=True))

    torch.save(
        {"weights": trainer.model.state_dict(), "events": events, "record": run_record(trainer),
         "fired": sum(fault.count for fault in faults)},
        out / f"rank-{sync.rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
