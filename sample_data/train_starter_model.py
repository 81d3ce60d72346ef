"""Train the starter UNet on the broader synthetic family (EM, fluorescent nuclei and cells).

Reproducible (seeded, 2 threads): draws its training volumes from
:func:`napari_finetune.samples.starter.starter_volume` (EM membranes in the EM
generator's two domains, bright textured nuclei, bright-membrane cells; voxels 1-5x
coarser in z; contrast inverted half of the time), starts from the sample model's
weights (same ``UNet(dims=3, in_channels=1, out_channels=2, depth=3, features=8,
norm="group")``, so everything downstream loads it) and trains it with sigmoid +
(BCE + Dice) per channel. Saves into the package
(``src/napari_finetune/samples/starter_unet.pt``) with its channels named for what
they are (``boundaries``, ``objects``) and their instance roles, and prints the
foreground IoU per channel on held-out volumes of each family.

Usage::

    .venv/bin/python sample_data/train_starter_model.py [--steps 400]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from train_sample_model import NORMALIZATION, batch, fit, iou, predict

from napari_finetune.data.normalization import intensity_range, normalize
from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.samples.starter import (
    CHANNEL_NAMES,
    FAMILIES,
    INSTANCE_ROLES,
    MAX_ANISOTROPY,
    starter_checkpoint_path,
    starter_volume,
)
from napari_finetune.samples.synthetic_em import GENERATOR_VERSION as EM_VERSION
from napari_finetune.samples.synthetic_em import sample_checkpoint_path
from napari_finetune.samples.synthetic_fluo import GENERATOR_VERSION as FLUO_VERSION

TRAIN_SEEDS = range(100, 136)
HELD_OUT_SEEDS = range(900, 912)
VOLUME_SHAPE = (24, 128, 128)
PATCH = (16, 64, 64)


def load(seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    """A volume normalised as the model will see it, its (C, ...) truth, what was drawn."""
    image, truth, drawn = starter_volume(VOLUME_SHAPE, seed)
    low, high = intensity_range(image, NORMALIZATION)
    return normalize(image, low, high), truth.astype(np.float32), drawn


def train(steps: int, seed: int, lr: float) -> tuple[nn.Module, dict]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    volumes = [load(s) for s in TRAIN_SEEDS]
    drawn = time.perf_counter() - t0
    families = {f: sum(v[2]["family"] == f for v in volumes) for f in FAMILIES}
    print(f"{len(volumes)} volumes drawn in {drawn:.0f} s: {families}", flush=True)
    # The sample model's weights to start from: its EM membranes are a head start.
    model = load_checkpoint(sample_checkpoint_path()).model
    seconds = fit(model, lambda: batch(rng, volumes, 2, PATCH), steps, lr)
    record = {"steps": steps, "batch_size": 2, "patch_shape": list(PATCH), "optimizer": "AdamW",
              "learning_rate": lr, "schedule": "one-cycle", "loss": "BCE + soft Dice per channel",
              "initialised_from": sample_checkpoint_path().name,
              "train_seeds": [TRAIN_SEEDS.start, TRAIN_SEEDS.stop - 1],
              "volume_shape": list(VOLUME_SHAPE), "families": families, "seed": seed,
              "augmentation": "flips, 90-degree y-x turns",
              "seconds": round(seconds, 1),
              "torch_threads": torch.get_num_threads()}
    return model, record


def evaluate(model: nn.Module) -> list[tuple[str, list[float]]]:
    """IoU per channel on each held-out volume (objects' IoU is 1.0 where there are none
    and none predicted: the cells family has no objects)."""
    rows = []
    for s in HELD_OUT_SEEDS:
        image, truth, drawn = load(s)
        name = (f"{drawn['family']} (seed {s}, z x{drawn['anisotropy']}"
                f"{', inverted' if drawn['inverted'] else ''})")
        rows.append((name, iou(predict(model, image, tile=(24, 128, 128)), truth)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=starter_checkpoint_path())
    parser.add_argument("--evaluate-only", action="store_true",
                        help="measure the checkpoint at --out instead of training a new one")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)

    if args.evaluate_only:
        model = load_checkpoint(args.out).model
    else:
        model, record = train(args.steps, args.seed, args.lr)
        metadata = {
            "channel_names": list(CHANNEL_NAMES),
            "normalization": dict(NORMALIZATION),
            "instance_roles": {k: dict(v) for k, v in INSTANCE_ROLES.items()},
            # No "voxel_size": the family's voxels are 1 to MAX_ANISOTROPY times coarser
            # in z, so no one size is the one it was trained at (a mismatch warning
            # against any would be wrong).
            "trained_on": f"starter family: synthetic EM (generator v{EM_VERSION}) and "
                          f"fluorescence (synthetic_fluo v{FLUO_VERSION}) nuclei and cells, "
                          f"z 1-{MAX_ANISOTROPY}x coarser than y-x, contrast inverted at random",
            "training": record,
        }
        save_checkpoint(args.out, model, metadata)
        print(f"saved {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    print("| held-out volume | " + " | ".join(f"IoU {c}" for c in CHANNEL_NAMES) + " |")
    print("|---|---|---|")
    for name, values in evaluate(model):
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |", flush=True)


if __name__ == "__main__":
    main()
