"""The precision probe's comparison with fp32: what healthy bf16 measures, and what it costs.

For each model the probe (``probe_precision``) runs on the CPU under bf16
(``cpu_bf16=True``) with the run's real loss, several times on one built
trainer (the probe leaves everything as it was, so each repetition is the
same). Reported, median over the repetitions:

* the agreement the probe measured: output cosine and relative error of bf16
  against an fp32 pass of the same weights and inputs, the gradient's cosine;
* the probe's wall time, and the part of it spent in the fp32 pass and the
  comparison (``oom_recovery.compare_with_fp32``, timed by wrapping it): the
  probe without the comparison is the difference, as before this check.

    python benchmarks/bench_probe.py [--repeats 5] [--threads 1]

Run with ``PYTHONPATH`` at the ``src`` of a commit from before the
comparison, it times that probe (the "before" of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from markdown_table import measured_under, print_table

from napari_finetune.config import FinetuneConfig
from napari_finetune.loading import load_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.samples.synthetic_em import sample_checkpoint_path
from napari_finetune.trainer import oom_recovery
from napari_finetune.trainer.loop import Finetuner
from napari_finetune.trainer.recovery import probe_precision


def volume(shape: tuple[int, int, int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A noisy volume with bright boxes painted as class 1 and background as 2."""
    rng = np.random.default_rng(seed)
    image = rng.normal(100.0, 10.0, size=shape).astype(np.float32)
    corrections = np.zeros(shape, np.uint8)
    for _ in range(6):
        c = [int(rng.integers(4, s - 4)) for s in shape]
        box = tuple(slice(x - 3, x + 3) for x in c)
        image[box] += 50.0
        corrections[box] = 1
    corrections[:2, :4, :4] = 2
    return image, corrections


def trainer_for(model: torch.nn.Module, out_channels: int, patch: tuple[int, int, int],
                batch: int) -> Finetuner:
    """A bf16 CPU trainer on ``model`` (full fine-tune, distillation as by default)."""
    image, corrections = volume(tuple(2 * p for p in patch))
    corrections = np.minimum(corrections, out_channels)
    config = FinetuneConfig(
        steps=1, batch_size=batch, accumulation=1, patch_shape=patch, mode="full",
        mixed_precision=True, cpu_bf16=True, device="cpu", seed=0,
        validation_fraction=0.0, autobatch=False,
    )
    trainer = Finetuner(model, image, corrections, config)
    trainer.build()
    return trainer


def timed(fn: Callable[..., object], spent: list[float]) -> Callable[..., object]:
    """``fn``, adding the seconds of each call to ``spent``."""

    def wrapper(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    return wrapper


def measure(name: str, trainer: Finetuner, repeats: int) -> list[str]:
    """One row: the agreement and the probe's time with and without the comparison.

    Run against a napari-finetune from before the comparison (no
    ``compare_with_fp32``: ``PYTHONPATH=<its src>``), the row has the probe's
    time only, in the "with" column: the same script measures before and after.
    """
    spent: list[float] = []
    original = getattr(oom_recovery, "compare_with_fp32", None)
    if original is not None:
        oom_recovery.compare_with_fp32 = timed(original, spent)
    totals = []
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            probe_precision(trainer)
            totals.append(time.perf_counter() - start)
    finally:
        if original is not None:
            oom_recovery.compare_with_fp32 = original
    total = statistics.median(totals)
    if original is None:
        return [name, "-", "-", "-", "-", "-", f"{total * 1e3:.0f}", "-", "-"]
    check = trainer.state.precision_check
    if check is None or len(spent) != repeats:
        raise RuntimeError(f"{name}: the probe made no comparison ({check})")
    comparison = statistics.median(spent)
    without = statistics.median(t - s for t, s in zip(totals, spent, strict=True))
    return [
        name, f"{check.output_cosine:.6f}", f"{check.output_rel_error:.4f}",
        f"{check.grad_cosine:.4f}", "yes" if check.agree else "no",
        f"{without * 1e3:.0f}", f"{total * 1e3:.0f}", f"{comparison * 1e3:.0f}",
        f"+{100 * (total - without) / without:.0f} %",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    checkpoint = load_checkpoint(sample_checkpoint_path())
    sample, out = checkpoint.model, len(checkpoint.channel_names)
    cases = [
        ("sample UNet, 32³ × 2", sample, out, (32, 32, 32), 2),
        ("UNet depth 2 × 4 features, 16×32×32 × 2",
         UNet(dims=3, depth=2, features=4), 2, (16, 32, 32), 2),
        ("UNet depth 3 × 16 features, 32³ × 2",
         UNet(dims=3, depth=3, features=16), 2, (32, 32, 32), 2),
        ("UNet depth 2 × 4 features, BatchNorm, 16×32×32 × 4",
         UNet(dims=3, depth=2, features=4, norm="batch"), 2, (16, 32, 32), 4),
    ]
    rows = []
    for name, model, channels, patch, batch in cases:
        rows.append(measure(name, trainer_for(model, channels, patch, batch), args.repeats))
    print(f"Measured under: {measured_under()}; torch {torch.__version__}, "
          f"{args.threads} torch thread(s), median of {args.repeats}")
    print()
    print_table(
        ["model, patch × batch (bf16, CPU)", "output cosine", "output rel. error",
         "gradient cosine", "agrees", "probe without comparison (ms)",
         "probe with comparison (ms)", "comparison (ms)", "added"],
        rows,
    )


if __name__ == "__main__":
    main()
