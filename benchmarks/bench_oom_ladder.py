"""Our OOM ladder vs accelerate's ``find_executable_batch_size``, under one MemoryBudget.

Both train the same UNet for the same number of optimizer steps under the
same :class:`~napari_finetune.trainer.faults.MemoryBudget` (a live-bytes
allocation budget that raises ``torch.OutOfMemoryError`` like a small GPU),
starting at the same batch.

* ours: ``Finetuner`` halves the micro-batch and raises the accumulation,
  redoing the interrupted step with the same samples;
* accelerate: the documented pattern, a training function decorated with
  ``find_executable_batch_size`` that rebuilds model and optimizer and starts
  over with ``0.9 x`` the batch after every OOM.

Reported: starting batch, OOM events, optimizer steps lost (applied in a
failed attempt and thrown away, or never applied), effective batch (samples
per optimizer step) at the end, wall time.

    python benchmarks/bench_oom_ladder.py [--steps 6] [--budget-mb 2.0]
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
import torch.nn.functional as F

from napari_finetune.config import FinetuneConfig
from napari_finetune.data.normalization import intensity_range
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.unet import UNet
from napari_finetune.testing import MemoryBudget
from napari_finetune.trainer.loop import Finetuner


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


def ours(start, image, corrections, args):
    config = FinetuneConfig(
        steps=args.steps, batch_size=args.batch, patch_shape=tuple(args.patch), mode="full",
        distillation=0.0, hold_other_channels=False, mixed_precision=False, device="cpu",
    )
    trainer = Finetuner(copy.deepcopy(start), image, corrections, config)
    trainer.build()  # outside the budget: the weights exist before, as on a GPU
    applied = [0]
    inner = trainer.optimizer.step

    def counted(*a, **k):
        applied[0] += 1
        return inner(*a, **k)

    trainer.optimizer.step = counted
    t0 = time.perf_counter()
    with MemoryBudget(args.budget) as budget:
        events = list(trainer.run())
    wall = time.perf_counter() - t0
    return {
        "method": "napari-finetune ladder (halve batch, accumulate, redo step)",
        "start": args.batch,
        "ooms": budget.oom_count,
        "lost": applied[0] - trainer.steps_done + (args.steps - trainer.steps_done),
        "done": trainer.steps_done,
        "effective": trainer.batch_size * trainer.accumulation,
        "end": f"{trainer.batch_size} x {trainer.accumulation}",
        "wall": wall,
        "log": [e.message for e in events if e.kind == "recovery"],
    }


def accelerate_way(start, image, corrections, args):
    from accelerate.utils import find_executable_batch_size

    low_high = intensity_range(image, {"method": "percentile", "low": 1, "high": 99})
    stats = {"applied": 0, "done": 0, "ooms": 0, "batch": None, "log": []}
    # Fresh copies made outside the budget, as ours is built outside it: on a GPU
    # the weights are resident before either method starts.
    copies = [copy.deepcopy(start) for _ in range(args.batch + 1)]

    @find_executable_batch_size(starting_batch_size=args.batch)
    def train(batch_size):
        stats["batch"] = batch_size
        model = copies.pop().train()  # the pattern: fresh model and optimizer per try
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        sampler = PatchSampler(image, corrections, tuple(args.patch), low_high, seed=0)
        done = 0
        try:
            for _ in range(args.steps):
                images, labels = sampler.sample(batch_size)
                x, y = torch.from_numpy(images), torch.from_numpy(labels)
                logits = model(x)
                target = (y.unsqueeze(1) == torch.arange(2, 4).view(1, 2, 1, 1, 1)).float()
                painted = (y > 0).unsqueeze(1).expand_as(logits)
                loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
                loss[painted].mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                stats["applied"] += 1
                done += 1
        except Exception:
            stats["ooms"] += 1
            stats["log"].append(f"OOM at batch {batch_size} after {done} steps: start over")
            raise
        stats["done"] = done

    t0 = time.perf_counter()
    with MemoryBudget(args.budget):
        try:
            train()
        except RuntimeError as exc:  # "No executable batch size found"
            stats["log"].append(str(exc))
    wall = time.perf_counter() - t0
    return {
        "method": "accelerate find_executable_batch_size (x0.9, start over)",
        "start": args.batch,
        "ooms": stats["ooms"],
        "lost": stats["applied"] - stats["done"] + (args.steps - stats["done"]),
        "done": stats["done"],
        "effective": stats["batch"],
        "end": f"{stats['batch']} x 1",
        "wall": wall,
        "log": stats["log"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--patch", type=int, nargs=3, default=[8, 16, 16])
    parser.add_argument("--budget-mb", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    args.budget = int(args.budget_mb * 1e6)
    torch.set_num_threads(args.threads)
    image, corrections = volume()
    torch.manual_seed(0)
    start = UNet(dims=3, depth=2, features=4, norm="group")
    print(
        f"MemoryBudget {args.budget_mb} MB of live tensors, UNet depth 2 features 4, patch "
        f"{tuple(args.patch)}, {args.steps} optimizer steps, starting batch {args.batch}, CPU\n"
    )
    rows = [ours(start, image, corrections, args), accelerate_way(start, image, corrections, args)]
    print("| method | start batch | OOM events | steps done | optimizer steps lost | "
          "end (batch x accum) | effective batch | wall s |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['method']} | {r['start']} | {r['ooms']} | {r['done']} | {r['lost']} | "
              f"{r['end']} | {r['effective']} | {r['wall']:.2f} |")
    for r in rows:
        print(f"\n{r['method']}:")
        for line in r["log"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
