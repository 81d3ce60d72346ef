"""Seconds to a better model: held-out IoU against wall-clock seconds from the click.

For each appearance (``sample``: the demo's target volume; ``unseen``: a
microscope nobody tuned anything on, ``bench_adaptation.unseen_appearance``),
the sample checkpoint is fine-tuned at the widget's defaults
(``FinetuneConfig()``, the given device) on the demo's simulated painting
(<= 1 % of the voxels, on 4 slices of the first half), full and LoRA. At
wall-clock marks from the start of the run (building, autobatch and the probe
count: it is what a user waits for after the click), the model's mean
foreground IoU on the never-painted half is scored; the scoring itself is off
the clock. The dense bound is the same model trained on every voxel of the
painted half for ``--dense-s`` seconds. The table gives the IoU at each mark,
its share of the dense bound and the seconds to 90 % and 95 % of it.

    python benchmarks/bench_time_to_quality.py                  # CPU, ~12 minutes
    python benchmarks/bench_time_to_quality.py --quick          # ~3 minutes
    python benchmarks/bench_time_to_quality.py --device cuda    # bench_gpu.py part 6 too
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from markdown_table import print_header, print_table

if TYPE_CHECKING:
    from napari_finetune.config import FinetuneConfig

Point = tuple[float, int, float]  # (seconds from the click, steps, held-out IoU)


def sync(device: str) -> None:
    """Wait for the device (CUDA) so wall-clock marks are honest."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def quality_curve(
    image: Any,
    labels: np.ndarray,
    config: FinetuneConfig,
    marks: list[float],
    score: Callable[[Any, tuple[float, float]], float],
    load: Callable[[], tuple[Any, dict]],
) -> list[Point]:
    """Train a fresh copy of the model and score it as each mark of seconds passes.

    Parameters
    ----------
    image, labels : array-like
        The volume and the corrections (0 unpainted, 1 background, k >= 2 channel k - 2).
    config : FinetuneConfig
        The run's settings; its ``steps`` only bound the run, the last mark ends it.
    marks : list of float
        Seconds from the start of the run (the click) at which to score.
    score : callable
        ``score(model, normalization_range) -> mean IoU``; its time does not count.
    load : callable
        A fresh ``(model, metadata)``.
    """
    from napari_finetune.trainer.loop import Finetuner

    model, metadata = load()
    trainer = Finetuner(model, image, labels, config, metadata=metadata)
    points: list[Point] = []
    pending = sorted(marks)
    paused = 0.0
    started = time.perf_counter()
    for status in trainer.run():
        if status.kind != "step":
            continue
        sync(config.device)
        elapsed = time.perf_counter() - started - paused
        while pending and elapsed >= pending[0]:
            pending.pop(0)
            t = time.perf_counter()
            points.append((elapsed, status.step, score(trainer.model,
                                                       trainer.normalization_range)))
            paused += time.perf_counter() - t
        if not pending:
            trainer.stop()
    if pending:  # the run ended before the last mark: score where it ended
        elapsed = time.perf_counter() - started - paused
        points.append((elapsed, trainer.steps_done,
                       score(trainer.model, trainer.normalization_range)))
    return points


def seconds_to(points: list[Point], goal: float) -> str:
    """The first mark at or above ``goal`` IoU, or "> last mark"."""
    hit = next((t for t, _, iou in points if iou >= goal), None)
    return f"{hit:.1f}" if hit is not None else f"> {points[-1][0]:.0f}"


def appearance_rows(
    name: str,
    image: Any,
    truth: np.ndarray,
    checkpoint: Any,
    device: str,
    marks: list[float],
    dense_s: float,
    small: bool,
) -> tuple[list[list[str]], str]:
    """Table rows of one appearance, and its one-line summary (before, dense bound)."""
    from napari_finetune.cli.simulate import (
        foreground_iou,
        predict_all,
        simulate_corrections,
        split_slices,
    )
    from napari_finetune.config import FinetuneConfig, PredictConfig
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.predict import predict_volume

    painted_z, held_out = split_slices(truth.shape[0])

    def score(model: Any, low_high: tuple[float, float]) -> float:
        probs = predict_volume(model, image, low_high, PredictConfig(device=device))
        return float(np.mean(foreground_iou(probs, truth, held_out)))

    def load() -> tuple[Any, dict]:
        fresh = load_checkpoint(checkpoint.path)
        return fresh.model, fresh.metadata

    before_probs = predict_all(checkpoint.model, image, checkpoint, device)
    before = float(np.mean(foreground_iou(before_probs, truth, held_out)))
    corrections = simulate_corrections(truth, before_probs, painted_z, 0.01, seed=0)
    dense = np.zeros(truth.shape, np.uint8)
    dense[: held_out.start] = np.asarray(truth[: held_out.start]) + 1
    defaults = dataclasses.replace(FinetuneConfig(), device=device, steps=1_000_000, seed=0)
    if small:  # the dry run's tiny volume cannot hold the default patch
        defaults = dataclasses.replace(defaults, batch_size=2, patch_shape=(8, 32, 32))
    bound_config = dataclasses.replace(defaults, distillation=0.0, hold_other_channels=False,
                                       validation_fraction=0.0)
    bound = quality_curve(image, dense, bound_config, [dense_s], score, load)[-1][2]
    rows = []
    for mode in ("full", "lora"):
        config = dataclasses.replace(defaults, mode=mode)
        points = quality_curve(image, corrections, config, marks, score, load)
        to90, to95 = seconds_to(points, 0.90 * bound), seconds_to(points, 0.95 * bound)
        for t, step, iou in points:
            rows.append([name, mode, f"{t:.1f}", str(step), f"{iou:.3f}", f"{iou / bound:.0%}",
                         to90, to95])
    summary = (f"{name}: {'x'.join(map(str, truth.shape))}, 1 % painted on "
               f"{len(painted_z)} slices; before {before:.3f}, dense bound {bound:.3f} "
               f"({dense_s:g} s of dense training)")
    return rows, summary


HEADER = ["appearance", "mode", "s from the click", "steps", "held-out IoU", "of dense",
          "s to 90 %", "s to 95 %"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--appearances", nargs="+", default=["sample", "unseen"],
                        choices=["sample", "unseen"])
    parser.add_argument("--marks", nargs="+", type=float, default=[15, 30, 60, 120],
                        help="seconds from the click at which to score")
    parser.add_argument("--dense-s", type=float, default=120.0,
                        help="training seconds of the dense bound")
    parser.add_argument("--quick", action="store_true",
                        help="marks 10 20 40, dense 40 s, the unseen appearance only")
    args = parser.parse_args()
    import torch
    from bench_adaptation import load_volume

    if args.quick:
        args.marks, args.dense_s, args.appearances = [10, 20, 40], 40.0, ["unseen"]
    print_header(f"time to quality on {args.device}, torch {torch.__version__}")
    rows, summaries = [], []
    for name in args.appearances:
        volume = load_volume(name)
        more, summary = appearance_rows(name, volume.image, volume.truth, volume.checkpoint,
                                        args.device, args.marks, args.dense_s, small=False)
        rows += more
        summaries.append(summary)
    for line in summaries:
        print(line)
    print()
    print_table(HEADER, rows)


if __name__ == "__main__":
    main()
