"""What helps a few minutes of painting adapt the sample model across a large shift.

The sample model was trained on synthetic EM (membranes, dark mitochondria); the
real volumes of :mod:`napari_finetune.samples.real` are a shift of modality
(CTC Fluo-N3DH-CHO: bright fluorescent nuclei) or of data (CREMI ssTEM cells).
For one volume, the simulated user and the scoring of
:mod:`napari_finetune.cli.real` are reused unchanged: strokes on a few slices of
the left half in x (at most 1 % of the voxels), every row scored on the right
half, which nobody painted (nuclei: semantic IoU and F1 of objects matched at
IoU > 0.5; cells: boundary IoU and adapted Rand error), with the object counts.
The painting is drawn once per volume from the pretrained prediction, so every
variant trains on the same strokes.

Each variant is a full fine-tune from the sample checkpoint for a fixed number
of optimizer steps (not seconds: the machine's load changes the time, not the
scores), differing from the widget's defaults
(:class:`~napari_finetune.config.FinetuneConfig`: lr 1e-3, distillation 0.5
unless the widget's check turns it off for a starting model that gets most of the
painting wrong, positives weighted like negatives, percentile 1-99 normalisation
per volume) in one setting:

- ``lr`` 1e-4, 3e-4, 1e-3 (default), 3e-3;
- ``distillation`` 0 against 0.5 (the teacher is wrong everywhere on a large
  shift, so its soft targets may hold the student back);
- ``pos``: painted foreground voxels weighted 5 times in the supervised BCE
  (painted foreground is rare); done here by wrapping the trainer's loss, the
  library has no such setting;
- ``inverted``: the percentile range per volume, inverted (bright nuclei come
  in dark, as the EM mitochondria the object channel learnt), for training and
  prediction alike;
- ``steps`` 30 against 60.

Rows also give the pretrained model and the classical baseline
(:func:`napari_finetune.cli.real.classical`: gaussian, Otsu, watershed).
Choose on one volume (``cho-t00``), report on volumes nobody tuned on
(``cho-t10``, ``cremi``); CREMI (25 x 625 x 625, labelled on z = 4) is cropped
to z 0-8 and the first 320 x 320 pixels in y and x unless ``--full-cremi``.

Run::

    python benchmarks/bench_adapt_real.py --volumes cho-t00                # every variant
    python benchmarks/bench_adapt_real.py --volumes cho-t10 cremi \\
        --variants default lr3e-3 dist0        # report on held-out volumes
    python benchmarks/bench_adapt_real.py --quick  # cho-t00, three variants, 10 steps
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # markdown_table beside this file

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

STEPS, QUICK_STEPS = 30, 10
# name -> changes to the defaults: learning_rate, distillation, pos_weight, inverted, steps
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "lr1e-4": {"learning_rate": 1e-4},
    "lr3e-4": {"learning_rate": 3e-4},
    "lr3e-3": {"learning_rate": 3e-3},
    "dist0": {"distillation": 0.0},
    "pos5": {"pos_weight": 5.0},
    "inverted": {"inverted": True},
    "default-60": {"steps": 60},
    "inverted-dist0": {"inverted": True, "distillation": 0.0},
}
QUICK_VARIANTS = ("default", "dist0", "lr3e-3")
CREMI_CROP = (slice(0, 9), slice(0, 320), slice(0, 320))
# A second region of the same sections, nobody's choices were made on (y, x 320-625:
# CREMI is 625 pixels wide, so it is 305 x 305): for checking what was chosen on the first.
CREMI_CROP_HELD_OUT = (slice(0, 9), slice(320, 640), slice(320, 640))
CREMI_CROPS = {"first": CREMI_CROP, "held-out": CREMI_CROP_HELD_OUT}


def crop_volume(volume: Any, crop: tuple[slice, slice, slice]) -> Any:
    """``volume`` cut to ``crop`` (starting at 0 so labelled z indices keep their
    meaning), its painted and scored halves re-split along the cropped x."""
    image = np.ascontiguousarray(volume.image[crop])
    width = image.shape[2]
    everything = slice(0, None)
    return dataclasses.replace(
        volume, image=image, truth=volume.truth[crop], known=volume.known[crop],
        painted=(everything, everything, slice(0, width // 2)),
        scored=(everything, everything, slice(width // 2, width)),
    )


def weighted_positives(pos_weight: float) -> Any:
    """The trainer's loss with painted foreground weighted ``pos_weight`` times."""
    import torch
    import torch.nn.functional as F

    from napari_finetune.trainer.losses import finetune_loss

    def loss(logits: Any, labels: Any, corrected: Any, norms: Any, teacher_probs: Any = None,
             distillation: float = 0.0, hold: bool = False) -> Any:
        base = finetune_loss(logits, labels, corrected, norms, teacher_probs, distillation, hold)
        n_channels = logits.shape[1]
        shape = (1, n_channels) + (1,) * (logits.ndim - 2)
        channel_labels = torch.arange(2, n_channels + 2, device=logits.device).view(shape)
        positive = (labels.unsqueeze(1) == channel_labels) & corrected.to(logits.device).view(shape)
        if not positive.any():
            return base
        bce = F.binary_cross_entropy_with_logits(logits.float()[positive],
                                                 torch.ones_like(logits.float()[positive]),
                                                 reduction="sum")
        return base + (pos_weight - 1.0) * bce / max(norms.supervised, 1)

    return loss


def run_variant(
    name: str, volume: Any, pretrained: Any, corrections: np.ndarray, steps: int,
    low_high: tuple[float, float], out: Path,
) -> tuple[np.ndarray, Any, int, float]:
    """Train one variant; its probabilities of the whole volume, model, steps, seconds."""
    import napari_finetune.trainer.step as step_module
    from napari_finetune.cli.real import config_for
    from napari_finetune.config import PredictConfig
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.predict import predict_volume
    from napari_finetune.trainer.loop import Finetuner

    change = dict(VARIANTS[name])
    pos_weight = float(change.pop("pos_weight", 1.0))
    inverted = bool(change.pop("inverted", False))
    steps = int(change.pop("steps", steps))
    config = config_for("full", steps, voxel_size=volume.voxel_size)
    config = dataclasses.replace(config, **change)
    rng = (low_high[1], low_high[0]) if inverted else low_high
    original = step_module.finetune_loss
    if pos_weight != 1.0:
        step_module.finetune_loss = weighted_positives(pos_weight)
    try:
        ckpt = load_checkpoint(pretrained.path)
        trainer = Finetuner.from_checkpoint(ckpt, volume.image, corrections, config)
        trainer.normalization_range = rng
        t0 = time.perf_counter()
        done = 0
        for status in trainer.run():
            done = status.step
        secs = time.perf_counter() - t0
        trainer.export(out)
    finally:
        step_module.finetune_loss = original
    tuned = load_checkpoint(out)
    probs = predict_volume(tuned.model, volume.image, rng, PredictConfig(device="cpu"))
    return np.asarray(probs), tuned, done, secs


def volume_rows(volume: Any, variants: list[str], steps: int, workdir: Path,
                baselines: bool) -> list[dict[str, Any]]:
    """Pretrained, Otsu and every variant's row for one volume."""
    from napari_finetune.cli.real import (
        channel_of,
        classical,
        paint_sparse,
        score,
        semantic_truth,
        widget_objects,
    )
    from napari_finetune.cli.simulate import predict_all
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    pretrained = load_checkpoint(sample_checkpoint_path())
    channel = channel_of(pretrained, volume)
    semantic = semantic_truth(volume, channel)
    before = predict_all(pretrained.model, volume.image, pretrained, "cpu")
    corrections = paint_sparse(volume, semantic, before)
    painted = float((corrections > 0).mean())
    low_high = intensity_range(volume.image, pretrained.normalization)
    rows: list[dict[str, Any]] = []

    def objects_of(checkpoint: Any, probs: np.ndarray, painting: np.ndarray | None) -> np.ndarray:
        return widget_objects(checkpoint, probs, painting, channel, volume.voxel_size)

    def add(row: str, probs: np.ndarray | None, objects: np.ndarray, steps_done: int,
            secs: float, fraction: float) -> None:
        s = score(volume, channel, probs[channel] if probs is not None else None, objects,
                  semantic)
        r = {"volume": volume.name, "row": row, "steps": steps_done, "train_s": secs,
             "painted": fraction, **s}
        rows.append(r)
        print(f"  {r}", flush=True)

    if baselines:
        add("pretrained", before, objects_of(pretrained, before, None), 0, 0.0, 0.0)
        add("otsu", None, classical(volume), 0, 0.0, 0.0)
    for name in variants:
        probs, tuned, done, secs = run_variant(name, volume, pretrained, corrections, steps,
                                               low_high, workdir / f"{volume.name}-{name}.pt")
        add(name, probs, objects_of(tuned, probs, corrections), done, secs, painted)
    return rows


LABELS = {
    "pretrained": "pretrained (sample model)",
    "otsu": "classical: gaussian, Otsu, watershed",
    "default": "defaults (lr 1e-3, distillation 0.5 unless the check turns it off)",
    "lr1e-4": "lr 1e-4",
    "lr3e-4": "lr 3e-4",
    "lr3e-3": "lr 3e-3",
    "dist0": "distillation 0",
    "pos5": "painted foreground weighted x5",
    "inverted": "inverted percentile range",
    "default-60": "defaults, 60 steps",
    "inverted-dist0": "inverted range, distillation 0",
}


def table(rows: list[dict[str, Any]], kind: str) -> tuple[list[str], list[list[str]]]:
    """Header and cells of one kind's markdown table."""
    if kind == "cells":
        semantic, measure = "IoU boundary", "adapted Rand error (lower is better)"
    else:
        semantic, measure = "IoU nuclei", "F1 (IoU > 0.5)"
    header = ["volume", "row", "steps", "train s", "painted", semantic, measure,
              "objects found / true"]
    cells = [[
        r["volume"], LABELS.get(r["row"], r["row"]), str(r["steps"]) if r["steps"] else "-",
        f"{r['train_s']:.0f}" if r["steps"] else "-",
        f"{100 * r['painted']:.2f}%" if r["painted"] else "-",
        f"{r['iou']:.3f}", f"{r['score']:.3f}", f"{int(r['found'])} / {int(r['true'])}",
    ] for r in rows]
    return header, cells


def main(argv: list[str] | None = None) -> int:
    """Measure and print one markdown table per kind of volume."""
    from markdown_table import print_header, print_table

    from napari_finetune.samples.real import CATALOGUE, RealDataUnavailable, fetch_real

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volumes", nargs="+", default=["cho-t00"], choices=list(CATALOGUE),
                        metavar="NAME", help="catalogue names (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        help=f"default: every variant (--quick: {', '.join(QUICK_VARIANTS)})")
    parser.add_argument("--steps", type=int, help=f"optimizer steps of each variant "
                        f"(default {STEPS}; {QUICK_STEPS} with --quick; 'default-60' runs 60)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="leave out the pretrained and Otsu rows")
    parser.add_argument("--full-cremi", action="store_true",
                        help="CREMI whole (25 x 625 x 625) instead of the z 0-8, 320 x 320 crop")
    parser.add_argument("--quick", action="store_true",
                        help=f"{len(QUICK_VARIANTS)} variants at {QUICK_STEPS} steps")
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    variants = args.variants or list(QUICK_VARIANTS if args.quick else VARIANTS)

    print_header("## Adapting to a large shift (benchmarks/bench_adapt_real.py)")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.volumes:
            try:
                volume = fetch_real(name)
            except RealDataUnavailable as exc:
                print(f"bench_adapt_real: {exc}", file=sys.stderr)
                return 1
            if name == "cremi" and not args.full_cremi:
                volume = crop_volume(volume, CREMI_CROP)
            print(f"{name}: {volume.spec.description}, {volume.image.shape}", flush=True)
            rows = volume_rows(volume, variants, steps, Path(tmp), not args.no_baselines)
            by_kind.setdefault(volume.spec.kind, []).extend(rows)
    print()
    for kind, rows in by_kind.items():
        print_table(*table(rows, kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
