"""Adaptation quality on two microscope appearances: sparse painting against dense training.

For each appearance, with the pretrained sample checkpoint (trained on the
source domain), it measures foreground IoU per channel on the held-out half of
the volume (z >= depth / 2, never painted):

- **before**: the pretrained model;
- **sparse full / sparse lora**: fine-tuned on the demo's simulated painting
  (<= 1 % of the voxels, on 4 slices of the first half; the very function
  ``napari-finetune demo`` uses) with the demo's settings for a fixed number of
  optimizer **steps** (what 2 minutes give on 2 quiet CPU cores; see
  docs/benchmarks.md for how the budgets were derived), beside the run's live
  validation score (IoU on the held-out painted strokes, ``Status.validation``);
- **dense (upper bound)**: fine-tuned (full, no distillation) on the ground
  truth of *every* voxel of the first half.

Appearances:

- ``sample``: the demo's target domain (``samples/synthetic_em.py``), the one
  the defaults were tuned on;
- ``unseen``: another microscope nobody tuned anything on (:func:`unseen_appearance`):
  strong blur in z, a contrast curve that darkens, more noise, coarse grain,
  and another geometry seed;
- ``third``: a microscope made for issue 42 before any run and never tuned on
  (:func:`third_appearance`): sharp in z, blurred in-plane, strong shot noise,
  a washed-out detector.

``--set FIELD=VALUE`` runs the sparse and dense rows with FinetuneConfig fields
on top of the demo's settings (how options are compared; the row says which).

Goal: the full fine-tune reaches >= 95 % and LoRA >= 85 % of the upper bound's
mean IoU, and neither is worse than before on any channel. Each run writes one
JSON line, so the runs can be spread over processes and the table made at the end::

    python benchmarks/bench_adaptation.py --appearances sample --runs before full lora dense \\
        --json runs.jsonl
    python benchmarks/bench_adaptation.py --table runs.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from napari_finetune.config import FinetuneConfig
    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.samples.synthetic_em import Appearance

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

# Step budgets: 2 minutes of the demo's settings on 2 CPU cores (docs/benchmarks.md).
STEPS = {"full": 77, "lora": 51, "dense": 220}
UNSEEN_SEED = 7
UNSEEN_SHAPE = (48, 256, 256)
THIRD_SEED = 23
APPEARANCES = ("sample", "unseen", "third")


def unseen_appearance() -> Appearance:
    """A microscope the defaults were never tuned on (designed for issue 12, item 5)."""
    from napari_finetune.samples.synthetic_em import Appearance

    return Appearance(
        blur=(1.8, 0.8, 0.8), noise=0.06, shot=0.03, gamma=1.4, texture=0.06,
        texture_scale=4.0, offset=30.0, gain=200.0,
    )


def third_appearance() -> Appearance:
    """A third microscope, made for issue 42 and never tuned on: sharp in z but
    blurred in-plane, little additive noise but strong shot noise, fine grain,
    a bright offset with a low gain (a washed-out detector), another geometry seed."""
    from napari_finetune.samples.synthetic_em import Appearance

    return Appearance(
        blur=(0.7, 1.5, 1.5), noise=0.02, shot=0.06, gamma=0.85, texture=0.12,
        texture_scale=1.8, offset=80.0, gain=120.0,
    )


@dataclasses.dataclass
class Volume:
    """One appearance: image, ground truth, the pretrained checkpoint's path."""

    name: str
    image: Any  # numpy, or the sample store's dask array
    truth: np.ndarray
    checkpoint: Checkpoint


def load_volume(name: str) -> Volume:
    """The ``sample`` store of the demo, or the ``unseen`` appearance made in memory."""
    from napari_finetune.cli.demo import load_sample
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.samples.synthetic_em import generate_volume, sample_checkpoint_path

    if name == "sample":
        sample = load_sample()
        return Volume(name, sample.image, np.asarray(sample.truth), sample.checkpoint)
    if name == "unseen":
        look, seed = unseen_appearance(), UNSEEN_SEED
    else:
        look, seed = third_appearance(), THIRD_SEED
    image, truth = generate_volume(UNSEEN_SHAPE, seed, appearance=look)
    return Volume(name, image, truth, load_checkpoint(sample_checkpoint_path()))


def finetune(
    volume: Volume, corrections: np.ndarray, config: FinetuneConfig, out: Path
) -> dict:
    """Fine-tune a fresh copy of the checkpoint for ``config.steps`` steps; export to ``out``."""
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.trainer.loop import Finetuner

    ckpt = load_checkpoint(volume.checkpoint.path)
    trainer = Finetuner(
        ckpt.model, volume.image, corrections, config, metadata=ckpt.metadata,
        source_sha256=ckpt.sha256,
    )
    t0 = time.perf_counter()
    validation, step = None, 0
    for status in trainer.run():
        step = status.step
        validation = status.validation or validation
    seconds = time.perf_counter() - t0
    trainer.export(out)
    return {"steps": step, "train_s": round(seconds, 1), "validation": validation}


def train(
    volume: Volume, run: str, before: np.ndarray | None, steps: int, out: Path,
    overrides: dict[str, object] | None = None,
) -> dict:
    """Fine-tune for ``run`` (``full`` or ``lora`` on the sparse painting, ``dense``
    on the truth of every voxel of the first half) and export the checkpoint to ``out``.

    Deterministic: the painting is simulated from ``before`` (the pretrained
    model's prediction) with a fixed seed, and the budget is ``steps`` optimizer
    steps, so two calls give the same checkpoint (bench_instances caches it).
    Returns the row's training fields (labelled fraction, steps, seconds, validation).
    """
    from napari_finetune.cli.demo import demo_config
    from napari_finetune.cli.simulate import simulate_corrections, split_slices

    painted_z, held_out = split_slices(volume.truth.shape[0])
    row: dict[str, Any] = {}
    # The widget's settings (demo_config), validated once at the last step:
    # a check costs several steps' time on the CPU, and the step budget is fixed.
    config = dataclasses.replace(
        demo_config(steps, False, "cpu", 0), mode="lora" if run == "lora" else "full",
        validation_every=steps, **(overrides or {}),
    )
    if overrides:
        row["settings"] = {k: overrides[k] for k in sorted(overrides)}
    if run == "dense":
        corrections = np.zeros(volume.truth.shape, np.uint8)
        corrections[: held_out.start] = volume.truth[: held_out.start] + 1
        config = dataclasses.replace(
            config, distillation=0.0, hold_other_channels=False, validation_fraction=0.0
        )
    elif before is None:
        raise ValueError(f"the sparse {run} run needs the pretrained model's prediction.")
    else:
        corrections = simulate_corrections(volume.truth, before, painted_z, 0.01, seed=0)
    row["labelled"] = round(float((corrections > 0).mean()), 4)
    row.update(finetune(volume, corrections, config, out))
    return row


def run_one(
    volume: Volume, run: str, before: np.ndarray | None, steps: int,
    overrides: dict[str, object] | None = None,
) -> dict:
    """One row: ``before``, ``full``, ``lora`` (sparse painting) or ``dense``.

    ``overrides``: FinetuneConfig fields set on top of the demo's settings (the
    options under test, e.g. ``{"lr_schedule": "cosine"}``).
    """
    from napari_finetune.cli.simulate import foreground_iou, predict_all, split_slices
    from napari_finetune.model.checkpoint import load_checkpoint

    _, held_out = split_slices(volume.truth.shape[0])
    row: dict[str, Any] = {"appearance": volume.name, "run": run}
    if run == "before":
        row["iou"] = foreground_iou(before, volume.truth, held_out)
        return row
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tuned.pt"
        row.update(train(volume, run, before, steps, out, overrides))
        tuned = load_checkpoint(out)
        after = predict_all(tuned.model, volume.image, tuned, "cpu")
    row["iou"] = foreground_iou(after, volume.truth, held_out)
    return row


def table(rows: list[dict], names: list[str]) -> str:
    """The markdown table of docs/benchmarks.md, one block of rows per appearance."""
    header = ["appearance", "run", *(f"IoU {n}" for n in names), "mean", "% of upper",
              "validation (held-out strokes)", "steps", "train s", "labelled"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    labels = {"before": "before (pretrained)", "full": "sparse, full", "lora": "sparse, lora",
              "dense": "dense (upper bound)"}
    for appearance in dict.fromkeys(r["appearance"] for r in rows):
        mine = [r for r in rows if r["appearance"] == appearance]
        dense = [r for r in mine if r["run"] == "dense"]
        upper = float(np.mean(dense[-1]["iou"])) if dense else float("nan")
        order = ("before", "full", "lora", "dense")
        for r in sorted(mine, key=lambda r: order.index(r["run"])):
            run, mean = r["run"], float(np.mean(r["iou"]))
            val = r.get("validation")
            label = labels[run] + "".join(
                f", {k}={v}" for k, v in (r.get("settings") or {}).items()
            )
            cells = [
                appearance, label, *(f"{v:.3f}" for v in r["iou"]), f"{mean:.3f}",
                f"{100 * mean / upper:.0f}%" if upper == upper else "-",
                ", ".join(f"{k} {v:.2f}" for k, v in val.items()) if val else "-",
                str(r.get("steps", "-")), str(r.get("train_s", "-")),
                f"{100 * r['labelled']:.2f}%" if "labelled" in r else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appearances", nargs="+", default=list(APPEARANCES),
                        choices=APPEARANCES)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="FinetuneConfig fields on top of the demo's (JSON values), "
                        "e.g. lr_schedule='\"cosine\"' augment_intensity=true")
    parser.add_argument("--runs", nargs="+", default=["before", "full", "lora", "dense"],
                        choices=["before", "full", "lora", "dense"])
    for run, steps in STEPS.items():
        parser.add_argument(f"--steps-{run}", type=int, default=steps,
                            help=f"optimizer steps of the {run} run (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=Path("adaptation-runs.jsonl"),
                        help="append one line per run here (default: %(default)s)")
    parser.add_argument("--table", type=Path, help="only print the table of this JSON-lines file")
    args = parser.parse_args()
    from napari_finetune.samples.synthetic_em import CHANNEL_NAMES

    if args.table:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line]
        print(table(rows, CHANNEL_NAMES))
        return
    import torch

    from napari_finetune.cli.simulate import predict_all

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    overrides = {}
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            overrides[field] = json.loads(value)
        except json.JSONDecodeError:
            overrides[field] = value  # a bare word: a string
    for name in args.appearances:
        volume = load_volume(name)
        ckpt = volume.checkpoint
        # The painting is simulated from the pretrained model's errors.
        sparse = {"before", "full", "lora"} & set(args.runs)
        before = predict_all(ckpt.model, volume.image, ckpt, "cpu") if sparse else None
        for run in args.runs:
            steps = {"full": args.steps_full, "lora": args.steps_lora,
                     "dense": args.steps_dense}.get(run, 0)
            t = time.perf_counter()
            row = run_one(volume, run, before, steps, overrides)
            row["wall_s"] = round(time.perf_counter() - t, 1)
            print(json.dumps(row), flush=True)
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
