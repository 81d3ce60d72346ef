"""Adaptation quality on the sample: sparse painting against dense training.

On the target-domain sample volume (the demo's), with the pretrained sample
checkpoint (trained on the source domain), it measures foreground IoU per
channel on the held-out half of the volume (never painted):

- **before**: the pretrained model;
- **sparse**: fine-tuned for ``--minutes`` of wall time on the demo's simulated
  painting (<= 1 % of the voxels, on a few slices of the first half; the very
  function ``napari-finetune demo`` uses), once per ``--modes``;
- **dense (upper bound)**: fine-tuned (full, no distillation) on the ground
  truth of *every* voxel of the first half for ``--upper-minutes``.

Goal: sparse reaches >= 90 % of the upper bound's mean IoU within 2 minutes on
2 CPU cores. Usage::

    python benchmarks/bench_adaptation.py                 # ~12 min on 2 cores
    python benchmarks/bench_adaptation.py --minutes 0.5 --upper-minutes 0.5 --shape 32 128 128
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))


def finetune_for(checkpoint_path, image, corrections, config, seconds: float, out: Path):
    """Fine-tune a fresh copy of the checkpoint for ``seconds`` of wall time; export to ``out``.

    Returns (steps done, seconds, list of status lines that changed state).
    """
    from napari_finetune.cli.options import StatusPrinter
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.trainer.loop import Finetuner

    ckpt = load_checkpoint(checkpoint_path)
    trainer = Finetuner(
        ckpt.model, image, corrections, config, metadata=ckpt.metadata, source_sha256=ckpt.sha256
    )
    printer = StatusPrinter(config.steps, quiet=True, echo=False)
    last = None
    for status in trainer.run():
        printer(status)
        last = status
        if status.elapsed_s >= seconds:
            trainer.stop()
    printer.close()
    trainer.export(out)
    return last.step, last.elapsed_s, printer.lines


def main() -> None:
    from napari_finetune.cli.demo import demo_config, load_sample, predict_all
    from napari_finetune.cli.simulate import foreground_iou, simulate_corrections, split_slices
    from napari_finetune.model.checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="sparse fine-tuning time")
    parser.add_argument("--upper-minutes", type=float, default=4.0, help="dense training time")
    parser.add_argument("--shape", type=int, nargs=3, help="sample shape (default: the sample's)")
    parser.add_argument("--modes", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    parser.add_argument("--budget", type=float, default=0.01, help="painted fraction, at most")
    args = parser.parse_args()

    import torch

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads (shared machine: other jobs were running)"
    )
    sample = load_sample(tuple(args.shape) if args.shape else None)
    names = sample.checkpoint.channel_names
    before = predict_all(sample.checkpoint.model, sample.image, sample.checkpoint, "cpu")
    painted_z, held_out = split_slices(sample.truth.shape[0])
    sparse = simulate_corrections(sample.truth, before, painted_z, args.budget, seed=0)
    dense = np.zeros_like(sparse)
    dense[: held_out.start] = np.asarray(sample.truth[: held_out.start]) + 1
    print(
        f"volume {tuple(sample.image.shape)}; painted {100 * (sparse > 0).mean():.2f}% on z = "
        f"{painted_z}; scored on z = {held_out.start}..{held_out.stop - 1}\n"
    )

    rows = [("before (pretrained)", foreground_iou(before, sample.truth, held_out), "-", "-", "-")]
    runs = []
    for mode in args.modes:
        config = dataclasses.replace(demo_config(10**6, False, "cpu", 0), mode=mode)
        runs.append((f"sparse, {mode}", sparse, config, 60 * args.minutes))
    upper = dataclasses.replace(
        demo_config(10**6, False, "cpu", 0),
        mode="full",
        distillation=0.0,
        hold_other_channels=False,
    )
    runs.append(("dense (upper bound), full", dense, upper, 60 * args.upper_minutes))
    with tempfile.TemporaryDirectory() as tmp:
        for label, corrections, config, seconds in runs:
            out = Path(tmp) / "tuned.pt"
            t = time.perf_counter()
            steps, train_s, lines = finetune_for(
                sample.checkpoint.path, sample.image, corrections, config, seconds, out
            )
            tuned = load_checkpoint(out)
            after = predict_all(tuned.model, sample.image, tuned, "cpu")
            rows.append(
                (
                    label,
                    foreground_iou(after, sample.truth, held_out),
                    str(steps),
                    f"{train_s:.0f}",
                    f"{(corrections > 0).mean() * 100:.2f}%",
                )
            )
            print(
                f"{label}: {steps} steps in {train_s:.0f} s "
                f"({time.perf_counter() - t:.0f} s with export and prediction)"
            )
            for line in lines:
                print("   " + line)
    upper_mean = float(np.mean(rows[-1][1]))
    header = [
        "run",
        *(f"IoU {n}" for n in names),
        "mean",
        "% of upper",
        "steps",
        "train s",
        "labelled",
    ]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for label, ious, steps, secs, labelled in rows:
        mean = float(np.mean(ious))
        print(
            f"| {label} | "
            + " | ".join(f"{v:.3f}" for v in ious)
            + f" | {mean:.3f} | {100 * mean / upper_mean:.0f}% | {steps} | {secs} | "
            f"{labelled} |"
        )


if __name__ == "__main__":
    main()
