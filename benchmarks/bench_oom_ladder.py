"""Memory that shrinks and grows mid-run: our ladder (with and without autobatch) vs
accelerate's ``find_executable_batch_size`` and Lightning's ``BatchSizeFinder``.

Every method trains the same UNet from the same weights under one
:class:`~napari_finetune.testing.MemoryBudget` (live-bytes budget raising
``torch.OutOfMemoryError`` like a small GPU), asked for 64 samples per step:

* the budget first fits a training step of 12 samples (calibrated below);
* after the 60th applied optimizer step it shrinks to fit 6 (another program
  takes memory), after the 80th it grows back to fit 12.

Rows:

* ours + autobatch: the micro-batch is chosen from a measured profile before
  step 1; the ladder halves it at the shrink (accumulation doubled, the
  interrupted step redone) and climbs back after 25 clean steps;
* ours without autobatch: starts at 64 x 1 and steps down to what fits;
* accelerate: the documented pattern, a training function decorated with
  ``find_executable_batch_size(starting_batch_size=64)`` that starts over
  with 0.9 x the batch after every OOM;
* Lightning: ``BatchSizeFinder(mode="power", init_val=64)`` before training;
  an OOM during training ends the run (it has no recovery).

Reported: OOM events (refused allocations; at the start, i.e. before the first
applied step, and later), optimizer steps lost or replayed (applied and then
thrown away by a restart, plus steps never done), effective batch (samples per
optimizer step) and micro-batch at the end, micro-batch history, wall time.

    python benchmarks/bench_oom_ladder.py [--steps 100] [--patch 4 8 8]
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
import torch.nn.functional as F
from markdown_table import print_table

from napari_finetune.config import FinetuneConfig
from napari_finetune.data.normalization import intensity_range
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.unet import UNet
from napari_finetune.testing import MemoryBudget
from napari_finetune.trainer.loop import Finetuner

SAMPLES = 64


def volume(shape=(24, 48, 48), seed=0):
    rng = np.random.default_rng(seed)
    image = rng.normal(100, 10, size=shape).astype(np.float32)
    corrections = np.zeros(shape, np.uint8)
    for _ in range(8):
        c = [int(rng.integers(6, s - 6)) for s in shape]
        box = tuple(slice(x - 2, x + 2) for x in c)
        image[box] += 50
        corrections[box] = 2
        corrections[tuple(slice(x + 3, x + 5) for x in c)] = 1
    return image, corrections


class Schedule:
    """The budget as a function of optimizer steps applied (by any attempt)."""

    def __init__(self, fits: dict[int, int], args: argparse.Namespace) -> None:
        self.fits, self.args = fits, args
        self.applied = 0
        self.budget: MemoryBudget | None = None

    def bytes_now(self) -> int:
        if self.args.shrink_at <= self.applied < self.args.grow_at:
            return self.fits[self.args.small]
        return self.fits[self.args.large]

    def step_applied(self) -> None:
        self.applied += 1
        self.budget.budget_bytes = self.bytes_now()

    def start(self) -> MemoryBudget:
        self.budget = MemoryBudget(self.bytes_now())
        return self.budget


def config(args, batch, steps, autobatch):
    return FinetuneConfig(
        steps=steps, batch_size=batch, accumulation=1, patch_shape=tuple(args.patch),
        mode="full", distillation=0.0, hold_other_channels=False, mixed_precision=False,
        device="cpu", autobatch=autobatch, prefetch_steps=0,
    )


def calibrate(start, image, corrections, args) -> dict[int, int]:
    """Bytes that fit a training step of N samples but not N + 1 (our step's peak)."""
    peaks = {}
    for n in sorted({args.small, args.small + 1, args.large, args.large + 1}):
        trainer = Finetuner(copy.deepcopy(start), image, corrections, config(args, n, 2, False))
        trainer.build()
        with MemoryBudget(10**12) as budget:
            list(trainer.run())
        peaks[n] = budget.peak_bytes
    return {n: (peaks[n] + peaks[n + 1]) // 2 for n in (args.small, args.large)}


def ours(start, image, corrections, args, fits, autobatch):
    schedule = Schedule(fits, args)
    trainer = Finetuner(
        copy.deepcopy(start), image, corrections, config(args, SAMPLES, args.steps, autobatch)
    )
    trainer.build()  # outside the budget: the weights exist before, as on a GPU
    inner = trainer.optimizer.step
    first = {}

    def counted(*a, **k):
        out = inner(*a, **k)
        first.setdefault("ooms", budget.oom_count)
        schedule.step_applied()
        return out

    trainer.optimizer.step = counted
    history, last = [str(SAMPLES)], SAMPLES
    t0 = time.perf_counter()
    with schedule.start() as budget:
        trainer.memory_info = budget
        events = []
        for event in trainer.run():
            events.append(event)
            if event.batch_size != last:
                history.append(f"{event.batch_size} @{event.step + 1}")
                last = event.batch_size
    wall = time.perf_counter() - t0
    redone = sum(e.kind == "recovery" and "out of memory at step" in e.message for e in events)
    return {
        "method": f"ours {'+ autobatch' if autobatch else 'without autobatch'}",
        "ooms": budget.oom_count,
        "ooms_start": first.get("ooms", budget.oom_count),
        "lost": schedule.applied - trainer.steps_done + (args.steps - trainer.steps_done),
        "redone": redone,
        "effective": trainer.samples_per_step,
        "micro": f"{trainer.batch_size} × {trainer.accumulation}",
        "history": " → ".join(history),
        "wall": wall,
        "log": [e.message for e in events if e.kind in ("recovery", "probe")],
    }


def _loss(model, x, y):
    logits = model(x)
    target = (y.unsqueeze(1) == torch.arange(2, 4).view(1, 2, *[1] * (y.dim() - 1))).float()
    painted = (y > 0).unsqueeze(1).expand_as(logits)
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return loss[painted].mean()


def accelerate_way(start, image, corrections, args, fits):
    from accelerate.utils import find_executable_batch_size

    schedule = Schedule(fits, args)
    low_high = intensity_range(image, {"method": "percentile", "low": 1, "high": 99})
    stats = {"done": 0, "batch": None, "log": [], "history": [], "ooms_start": None}
    copies = [copy.deepcopy(start) for _ in range(40)]  # made outside the budget

    @find_executable_batch_size(starting_batch_size=SAMPLES)
    def train(batch_size):
        stats["batch"] = batch_size
        stats["history"].append(f"{batch_size} @{schedule.applied + 1}")
        model = copies.pop().train()  # the pattern: fresh model and optimizer per try
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sampler = PatchSampler(image, corrections, tuple(args.patch), low_high, seed=0)
        done = 0
        try:
            for _ in range(args.steps):
                images, labels = sampler.sample(batch_size)
                _loss(model, torch.from_numpy(images), torch.from_numpy(labels)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if stats["ooms_start"] is None:
                    stats["ooms_start"] = budget.oom_count
                schedule.step_applied()
                done += 1
        except Exception:
            stats["log"].append(f"OOM at batch {batch_size} after {done} steps: start over")
            raise
        stats["done"] = done

    t0 = time.perf_counter()
    with schedule.start() as budget:
        try:
            train()
        except RuntimeError as exc:  # "No executable batch size found"
            stats["log"].append(str(exc))
    wall = time.perf_counter() - t0
    return {
        "method": "accelerate `find_executable_batch_size` (× 0.9, start over)",
        "ooms": budget.oom_count,
        "ooms_start": stats["ooms_start"],
        "lost": schedule.applied - stats["done"] + (args.steps - stats["done"]),
        "redone": None,
        "effective": stats["batch"],
        "micro": f"{stats['batch']} × 1",
        "history": " → ".join(h.split(" @")[0] if i == 0 else h
                              for i, h in enumerate(stats["history"])),
        "wall": wall,
        "log": stats["log"],
    }


def lightning_way(start, image, corrections, args, fits):
    import logging
    import warnings

    import lightning as L
    from lightning.pytorch.callbacks import BatchSizeFinder

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    schedule = Schedule(fits, args)
    low_high = intensity_range(image, {"method": "percentile", "low": 1, "high": 99})
    sampler = PatchSampler(image, corrections, tuple(args.patch), low_high, seed=0)
    stats = {"done": 0, "log": [], "ooms_start": None, "tuned": False}

    class Patches(torch.utils.data.Dataset):
        def __len__(self):
            return 10**6

        def __getitem__(self, _i):
            x, y = sampler.sample(1)
            return torch.from_numpy(x[0]), torch.from_numpy(y[0])

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = copy.deepcopy(start)
            self.batch_size = SAMPLES

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Patches(), batch_size=self.batch_size)

        def training_step(self, batch, _i):
            return _loss(self.model, *batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Finder(BatchSizeFinder):
        def scale_batch_size(self, trainer, pl_module):
            super().scale_batch_size(trainer, pl_module)
            stats["tuned"] = True
            stats["ooms_start"] = budget.oom_count

    class Count(L.Callback):
        def on_train_batch_end(self, trainer, *_a):
            if stats["tuned"]:
                stats["done"] += 1
                schedule.step_applied()

    module = Module()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Finder(mode="power", init_val=SAMPLES, max_trials=10), Count()],
    )
    t0 = time.perf_counter()
    with schedule.start() as budget:
        try:
            trainer.fit(module)
        except Exception as exc:  # noqa: BLE001 - an OOM in training ends a Lightning run
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            stats["log"].append(f"{type(exc).__name__} at step {stats['done'] + 1}: {first}")
    wall = time.perf_counter() - t0
    return {
        "method": "Lightning `BatchSizeFinder` (power), then `fit`",
        "ooms": budget.oom_count,
        "ooms_start": stats["ooms_start"],
        "lost": args.steps - stats["done"],
        "redone": None,
        "effective": module.batch_size,
        "micro": f"{module.batch_size} × 1",
        "history": f"{module.batch_size}",
        "wall": wall,
        "log": stats["log"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--patch", type=int, nargs=3, default=[4, 8, 8])
    parser.add_argument("--large", type=int, default=12, help="samples the budget fits")
    parser.add_argument("--small", type=int, default=6, help="... while it is shrunk")
    parser.add_argument("--shrink-at", type=int, default=60)
    parser.add_argument("--grow-at", type=int, default=80)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", nargs="*", default=[], help="rows to leave out: "
                        "autobatch, ladder, accelerate, lightning")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    image, corrections = volume()
    torch.manual_seed(0)
    start = UNet(dims=3, depth=2, features=4, norm="group")
    fits = calibrate(start, image, corrections, args)
    print(
        f"MemoryBudget fitting {args.large} samples ({fits[args.large] / 1e6:.2f} MB), "
        f"{args.small} ({fits[args.small] / 1e6:.2f} MB) from step {args.shrink_at} to "
        f"{args.grow_at}; UNet depth 2 features 4, patch {tuple(args.patch)}, {args.steps} "
        f"steps of {SAMPLES} samples, CPU\n"
    )
    runs = {
        "autobatch": lambda: ours(start, image, corrections, args, fits, True),
        "ladder": lambda: ours(start, image, corrections, args, fits, False),
        "accelerate": lambda: accelerate_way(start, image, corrections, args, fits),
        "lightning": lambda: lightning_way(start, image, corrections, args, fits),
    }
    rows = []
    for name, run in runs.items():
        if name in args.skip:
            continue
        try:
            rows.append(run())
        except ImportError as exc:
            print(f"{name}: not installed ({exc}); row left out")
    print_table(
        ["method", "OOM events (at start + later)", "steps lost or replayed",
         "OOM retries of a step", "effective batch at the end", "micro-batch × accumulation "
         "at the end", "micro-batch history (@step)", "wall s"],
        [
            [r["method"], f"{r['ooms']} ({r['ooms_start']} + {r['ooms'] - (r['ooms_start'] or 0)})",
             str(r["lost"]), "–" if r["redone"] is None else str(r["redone"]),
             str(r["effective"]), r["micro"], r["history"], f"{r['wall']:.1f}"]
            for r in rows
        ],
    )
    for r in rows:
        print(f"{r['method']}:")
        for line in r["log"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
