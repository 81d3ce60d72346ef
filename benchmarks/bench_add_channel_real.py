"""A structure the sample model never had: painted as an existing channel, or as a new one.

The sample model (synthetic EM: ``membrane``, ``mitochondria``) meets real
fluorescent nuclei (CTC Fluo-N3DH-CHO, :mod:`napari_finetune.samples.real`). A
user can paint the nuclei as the existing ``mitochondria`` channel (its role is
``object``), or add a channel ``nuclei`` (role ``object``,
:mod:`napari_finetune.model.add_channel`, ``train --add-channel nuclei:object``)
and paint them with its label. The simulated user, the painting and the scoring
are :mod:`napari_finetune.cli.real`'s: strokes on a few slices of the left half
(at most 1 % of the voxels), drawn once per volume from the pretrained
prediction, so both ways train on the same strokes (only the label value
differs); scored on the right half, which nobody painted (semantic IoU, F1 of
nuclei matched at IoU > 0.5, object counts). Each row's objects are the ones the
widget's Objects would show the user (:func:`napari_finetune.cli.real.widget_objects`:
sizes from the row's painting, the volume's voxel size), and every run gets the
voxel size as the widget passes it. Every row is a fixed number of optimizer steps
(the load changes the seconds, not the scores).

After a run that added a channel, the old channels must still do what they did
on the sample (the synthetic EM target volume the widget opens): the drift is
``1 - IoU`` of each old channel's mask (probability > 0.5) before and after,
and the change of its IoU against the sample's truth.

Variants (each one setting changed from the widget's defaults, lr 1e-3,
distillation 0.5, hold on):

- ``existing``: nuclei painted as ``mitochondria``;
- ``added-own``: nuclei painted as the new channel with weights of its own (the
  library's default for napari-finetune's UNet, :mod:`napari_finetune.model.add_channel`:
  a one-channel copy of the starting UNet, its output row fitted on the painting
  before step 1); only those train, so the old channels cannot move;
- ``added``: nuclei painted as the new channel as an output row only (the layout
  before the channel had weights of its own; its row fitted on the painting
  before step 1, :mod:`napari_finetune.trainer.new_channel`, then every weight
  trained, the old channels held to the starting model); every ``added-*``
  variant below is of this layout;
- ``added-lr3e-4``: the same at lr 3e-4;
- ``added-hold5``: the hold on the old channels weighted 5 times (the
  trainer's ``HOLD_WEIGHT``, patched here);
- ``added-freeze10``: the shared layers get no gradient for the first 10 steps
  (only the output layer learns), then every weight;
- ``added-head``: only the output layer learns, all steps;
- ``added-replay``: half of each batch's patches come from the domain the sample
  model was trained on (synthetic EM, the ``source`` appearance, another seed than
  the sample's), unpainted: the hold keeps the old channels to the starting
  model there too (the trainer has no such setting; the script wraps its
  sampler); ``added-replay-hold5`` with the hold weighted 5 times;
  ``added-replay-target(-hold5)``: the same, the patches in the sample's
  appearance (``target``) but of another geometry seed than the sample's.

Choose on ``cho-t00``; report on ``cho-t10`` and ``cho-t19``.

Run::

    python benchmarks/bench_add_channel_real.py --volumes cho-t00
    python benchmarks/bench_add_channel_real.py --volumes cho-t10 cho-t19 \\
        --variants existing added-own added-head
    python benchmarks/bench_add_channel_real.py --quick   # cho-t00, 2 variants, 5 steps
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # markdown_table beside this file

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

if TYPE_CHECKING:
    import torch

    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.samples.real import RealVolume
    from napari_finetune.trainer.loop import Finetuner

STEPS, QUICK_STEPS = 30, 5
NEW_NAME, NEW_ROLE = "nuclei", "object"
EXISTING = "mitochondria"


@dataclasses.dataclass(frozen=True)
class Variant:
    """How one row trains."""

    label: str
    added: bool = True
    learning_rate: float | None = None
    hold_weight: float | None = None
    frozen_steps: int = 0  # steps whose shared layers get no gradient (-1: every step)
    replay: float = 0.0  # share of each batch's patches drawn from synthetic EM
    replay_domain: str = "source"  # its appearance: the model's training or the sample's
    own_weights: bool = False  # the added channel gets weights of its own (else a row)


VARIANTS: dict[str, Variant] = {
    "existing": Variant(f"painted as '{EXISTING}' (defaults)", added=False),
    "added-own": Variant(f"added channel '{NEW_NAME}', own weights (defaults)",
                         own_weights=True),
    "added": Variant(f"added channel '{NEW_NAME}' as an output row, every weight trained"),
    "added-lr3e-4": Variant("added, lr 3e-4", learning_rate=3e-4),
    "added-hold5": Variant("added, hold x5", hold_weight=5.0),
    "added-freeze10": Variant("added, shared layers frozen 10 steps", frozen_steps=10),
    "added-head": Variant("added, output layer only", frozen_steps=-1),
    "added-replay": Variant("added, half the patches replayed from synthetic EM", replay=0.5),
    "added-replay-hold5": Variant("added, half replayed, hold x5", replay=0.5,
                                  hold_weight=5.0),
    "added-replay-target": Variant("added, half replayed from the sample's appearance",
                                   replay=0.5, replay_domain="target"),
    "added-replay-target-hold5": Variant("added, half replayed (sample's appearance), hold x5",
                                         replay=0.5, replay_domain="target", hold_weight=5.0),
}
QUICK_VARIANTS = ("existing", "added-own")


class Row(TypedDict):
    """One row of the table."""

    volume: str
    variant: str
    steps: int
    train_s: float
    painted: float
    iou: float
    f1: float
    found: int
    true: int
    # Old channels on the sample: 1 - IoU(before, after) and IoU against truth after - before.
    drift: dict[str, float]
    truth_change: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Sample:
    """The synthetic EM sample, the pretrained masks of its channels and its truth."""

    image: np.ndarray
    truth: np.ndarray  # 0 background, 1 membrane, 2 mitochondria
    before: np.ndarray  # (C, Z, Y, X) bool, the pretrained model's masks


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two masks (1 when both are empty)."""
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


def sample_masks(checkpoint: Checkpoint, image: np.ndarray, channels: int) -> np.ndarray:
    """The first ``channels`` masks (probability > 0.5) of ``checkpoint`` on ``image``."""
    from napari_finetune.cli.simulate import predict_all

    probs = predict_all(checkpoint.model, image, checkpoint, "cpu")
    return np.asarray(probs)[:channels] > 0.5


def load_sample(pretrained: Checkpoint) -> Sample:
    """The sample volume the widget opens and the pretrained model's masks on it."""
    from napari_finetune.samples.synthetic_em import generate_volume

    image, truth = generate_volume()
    before = sample_masks(pretrained, image, len(pretrained.channel_names))
    return Sample(image, truth, before)


@contextmanager
def hold_weight(weight: float | None) -> Iterator[None]:
    """The trainer's hold weight set to ``weight`` (None: unchanged) while inside."""
    import napari_finetune.trainer.losses as losses

    original = losses.HOLD_WEIGHT
    if weight is not None:
        losses.HOLD_WEIGHT = weight
    try:
        yield
    finally:
        losses.HOLD_WEIGHT = original


def shared_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every parameter but the output layer's."""
    from napari_finetune.model.add_channel import output_layer

    name, _ = output_layer(model)
    return [p for n, p in model.named_parameters() if not n.startswith(name + ".")]


class Freeze:
    """Zero the gradients of a model's shared layers (all but the output layer) while
    :attr:`on`. AdamW then moves them by nothing (no weight decay by default), so they
    stay as they were, and they learn again from the step after :attr:`on` turns off."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.on = True
        self.handles = [p.register_hook(self._gradient) for p in shared_parameters(model)]

    def _gradient(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.mul(0.0) if self.on else grad

    def remove(self) -> None:
        """Take the hooks off."""
        for handle in self.handles:
            handle.remove()


class Replay:
    """Unpainted patches of the synthetic EM the sample model was trained on."""

    def __init__(self, pretrained: Checkpoint, domain: str = "source", seed: int = 0) -> None:
        from napari_finetune.data.normalization import intensity_range
        from napari_finetune.samples.synthetic_em import generate_volume

        # Another geometry seed than the sample's (1) and the model's training (10-12).
        image, _ = generate_volume((32, 128, 128), seed=99, domain=domain)
        self.image = image
        self.low, self.high = intensity_range(image, pretrained.normalization)
        self.rng = np.random.default_rng(seed)

    def patches(self, n: int, shape: tuple[int, ...]) -> np.ndarray:
        """``(n, 1, *shape)`` normalised random crops."""
        from napari_finetune.data.normalization import normalize

        out = np.empty((n, 1, *shape), np.float32)
        for i in range(n):
            box = tuple(slice(s, s + p) for s, p in zip(
                (int(self.rng.integers(d - p + 1)) for d, p in zip(self.image.shape, shape,
                                                                  strict=True)),
                shape, strict=True))
            out[i, 0] = normalize(self.image[box], self.low, self.high)
        return out


def replay_into(trainer: Finetuner, replay: Replay, share: float) -> None:
    """Replace ``share`` of every batch the trainer's sampler draws with unpainted
    replayed patches (their labels 0: no painting, so only the hold reads them)."""
    sampler = trainer._get_sampler()
    draw = sampler.sample

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        images, labels = draw(n)
        k = int(round(share * n))
        if k and n > 1:
            k = min(k, n - 1)  # at least one painted patch per batch
            images[n - k:] = replay.patches(k, tuple(labels.shape[1:]))
            labels[n - k:] = 0
        return images, labels

    sampler.sample = sample  # type: ignore[method-assign]


def train_variant(
    variant: Variant, pretrained: Checkpoint, volume: RealVolume, corrections: np.ndarray,
    steps: int, out: Path,
) -> tuple[int, float]:
    """Train one variant from the sample checkpoint; export to ``out``; steps and seconds."""
    from napari_finetune.cli.real import config_for
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.add_channel import add_output_channel
    from napari_finetune.objects import roles_from_metadata
    from napari_finetune.trainer.loop import Finetuner

    if pretrained.path is None:
        raise ValueError("the runs start from the sample checkpoint's file; it has no path.")
    ckpt = load_checkpoint(pretrained.path)
    if variant.added:
        names = list(ckpt.channel_names)
        before = {n: r.to_dict() for n, r in roles_from_metadata(ckpt.metadata, names).items()
                  if r.role}
        ckpt = add_output_channel(ckpt, NEW_NAME, NEW_ROLE, roles_before=before,
                                  own_weights=variant.own_weights)
    # The volume's voxel size, as the widget reads it from the store's scale.
    config = config_for("full", steps, voxel_size=volume.voxel_size)
    if variant.learning_rate is not None:
        config = dataclasses.replace(config, learning_rate=variant.learning_rate)
    trainer = Finetuner.from_checkpoint(ckpt, volume.image, corrections, config)
    if variant.replay:
        replay_into(trainer, Replay(pretrained, variant.replay_domain), variant.replay)
    frozen = Freeze(trainer.model) if variant.frozen_steps else None
    done = 0
    t0 = time.perf_counter()
    try:
        with hold_weight(variant.hold_weight):
            for status in trainer.run():
                done = status.step
                if frozen is not None and 0 < variant.frozen_steps <= done:
                    frozen.on = False
    finally:
        if frozen is not None:
            frozen.remove()
    secs = time.perf_counter() - t0
    trainer.export(out)
    return done, secs


def row_objects(tuned: Checkpoint, probs: np.ndarray, painting: np.ndarray, channel: int,
                volume: RealVolume) -> np.ndarray:
    """Channel ``channel``'s objects as a user of the widget would see them.

    The widget's Objects takes each object channel's sizes from the painting (or,
    without painted objects, from the prediction) and measures in the volume's
    voxel size; :func:`napari_finetune.cli.real.widget_objects` does the same, so both
    rows of a volume are scored on the objects the user would get, not on the
    checkpoint's default sizes.
    """
    from napari_finetune.cli.real import widget_objects

    return widget_objects(tuned, probs, painting, channel, volume.voxel_size)


def volume_rows(volume: RealVolume, variants: list[str], steps: int, workdir: Path,
                sample: Sample, pretrained: Checkpoint, dump: Path | None = None) -> list[Row]:
    """Every variant's row for one volume; with ``dump``, each row's scored channel
    (probability, objects) and the truth go to ``dump/<volume>-<variant>.npz``."""
    from napari_finetune.cli.real import paint_sparse, score, semantic_truth
    from napari_finetune.cli.simulate import predict_all
    from napari_finetune.loading import load_checkpoint
    old = list(pretrained.channel_names)
    existing = old.index(EXISTING)
    semantic = semantic_truth(volume, existing)
    before = predict_all(pretrained.model, volume.image, pretrained, "cpu")
    painting = paint_sparse(volume, semantic, before)
    # The same strokes with the new channel's label (2 + C) instead of the existing one's.
    as_new = painting.copy()
    as_new[painting == existing + 2] = len(old) + 2
    painted = float((painting > 0).mean())
    rows: list[Row] = []
    for name in variants:
        variant = VARIANTS[name]
        channel = len(old) if variant.added else existing
        out = workdir / f"{volume.name}-{name}.pt"
        strokes = as_new if variant.added else painting
        done, secs = train_variant(variant, pretrained, volume, strokes, steps, out)
        tuned = load_checkpoint(out)
        probs = np.asarray(predict_all(tuned.model, volume.image, tuned, "cpu"))
        objects = row_objects(tuned, probs, strokes, channel, volume)
        if dump is not None:
            # For looking at a row: overlays of its probability and objects on the truth.
            np.savez_compressed(dump / f"{volume.name}-{name}.npz", image=volume.image,
                                probability=probs[channel], objects=objects,
                                truth=volume.truth, strokes=strokes)
        s = score(volume, channel, probs[channel], objects,
                  semantic if channel == existing else semantic_truth(volume, channel))
        after = sample_masks(tuned, sample.image, len(old))
        drift, change = {}, {}
        for c, old_name in enumerate(old):
            truth = sample.truth == c + 1
            drift[old_name] = 1.0 - iou(sample.before[c], after[c])
            change[old_name] = iou(after[c], truth) - iou(sample.before[c], truth)
        row: Row = {"volume": volume.name, "variant": name, "steps": done, "train_s": secs,
                    "painted": painted, "iou": s["iou"], "f1": s["score"],
                    "found": int(s["found"]), "true": int(s["true"]), "drift": drift,
                    "truth_change": change}
        rows.append(row)
        print(f"  {row}", flush=True)
    return rows


def table(rows: list[Row], old: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the markdown table."""
    header = ["volume", "row", "steps", "train s", "painted", "IoU nuclei", "F1 (IoU > 0.5)",
              "objects found / true"]
    header += [f"{n} drift on sample (1 - IoU before/after)" for n in old]
    header += [f"{n} IoU vs sample truth, change" for n in old]
    cells = []
    for r in rows:
        cell = [r["volume"], VARIANTS[r["variant"]].label, str(r["steps"]), f"{r['train_s']:.0f}",
                f"{100 * r['painted']:.2f}%", f"{r['iou']:.3f}", f"{r['f1']:.3f}",
                f"{r['found']} / {r['true']}"]
        cell += [f"{r['drift'][n]:.3f}" for n in old]
        cell += [f"{r['truth_change'][n]:+.3f}" for n in old]
        cells.append(cell)
    return header, cells


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    from markdown_table import measured_under, print_header, print_table

    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.real import CATALOGUE, RealDataUnavailable, fetch_real
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volumes", nargs="+", default=["cho-t00"],
                        choices=[n for n in CATALOGUE if n.startswith("cho")], metavar="NAME",
                        help="nuclei volumes of the catalogue (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        help=f"default: every variant (--quick: {', '.join(QUICK_VARIANTS)})")
    parser.add_argument("--steps", type=int,
                        help=f"optimizer steps (default {STEPS}; {QUICK_STEPS} with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{len(QUICK_VARIANTS)} variants at {QUICK_STEPS} steps")
    parser.add_argument("--dump", type=Path,
                        help="write each row's probability, objects and truth here (npz)")
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    variants = args.variants or list(QUICK_VARIANTS if args.quick else VARIANTS)

    print_header("## Adding a channel on real nuclei (benchmarks/bench_add_channel_real.py)")
    pretrained = load_checkpoint(sample_checkpoint_path())
    sample = load_sample(pretrained)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.volumes:
            try:
                volume = fetch_real(name)
            except RealDataUnavailable as exc:
                print(f"bench_add_channel_real: {exc}", file=sys.stderr)
                return 1
            print(f"{name}: {volume.spec.description}, {volume.image.shape}", flush=True)
            rows += volume_rows(volume, variants, steps, Path(tmp), sample, pretrained,
                                args.dump)
    print()
    print(measured_under())
    print()
    print_table(*table(rows, list(pretrained.channel_names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
