"""The CREMI crop's cells one by one: which predicted cells cover each true cell, and back.

At the widget's defaults the fine-tuned model gives the CREMI crop (z 0-8, 320 x 320,
``bench_real.py --cremi-crop``) a low adapted Rand error but about half as many
comparable cells as the reference (:func:`napari_finetune.cli.real.countable_cells`).
This script says why, cell by cell, on the labelled slice of the scored half:

- for each true cell: its pixels, whether it is counted, and the predicted cells
  covering it (overlap pixels, and how much of each predicted cell lies on the
  labelled pixels of the scored half);
- for each predicted cell touching the labelled patch: its size on the slice, the
  share of it on the patch, and the true cells it covers;
- VOI split and merge (:func:`napari_finetune.objects.scores.region_scores`);
- the boundary channel's threshold, seed distance and min size the objects step used
  and where they came from (:func:`napari_finetune.objects.roles_from_painting`);
- the same scores with one thing changed at a time (:func:`what_if`): half and twice the
  seed distance; the reference's outlines written into the membrane on the labelled
  slice only, or on every section; each section's objects made alone (2D). These are
  diagnostics, never settings of the product: they say where the cells are lost.

Training takes minutes on a CPU, so the fine-tuned probabilities are saved once
(``--train``, an npz) and every later run reads them: the objects step can be tried
again in seconds.

Run::

    python benchmarks/cells_one_by_one.py --train --npz /tmp/cells/cremi_full.npz
    python benchmarks/cells_one_by_one.py --npz /tmp/cells/cremi_full.npz
    python benchmarks/cells_one_by_one.py --train --crop held-out --balance-classes \\
        --npz /tmp/cells/held_out_balanced.npz
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from napari_finetune.objects import ChannelRole
    from napari_finetune.samples.real import RealVolume

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_adapt_real beside this file

os.environ.setdefault("OMP_NUM_THREADS", "1")

STEPS = 40


def cremi_crop(name: str = "first") -> RealVolume:
    """The CREMI crop bench_real's ``--cremi-crop [name]`` scores."""
    from bench_adapt_real import CREMI_CROPS, crop_volume

    from napari_finetune.samples.real import fetch_real

    return crop_volume(fetch_real("cremi"), CREMI_CROPS[name])


def train_and_save(npz: Path, steps: int, crop: str = "first",
                   balance_classes: bool = False) -> None:
    """Fine-tune the sample model at the widget's defaults as ``real_rows``'s ``full`` row
    does, and save the probabilities (before and after) with the painting."""
    from napari_finetune.cli.real import (
        channel_of,
        config_for,
        paint_sparse,
        semantic_truth,
        train,
    )
    from napari_finetune.cli.simulate import predict_all
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    volume = cremi_crop(crop)
    pretrained = load_checkpoint(sample_checkpoint_path())
    channel = channel_of(pretrained, volume)
    semantic = semantic_truth(volume, channel)
    before = predict_all(pretrained.model, volume.image, pretrained, "cpu")
    sparse = paint_sparse(volume, semantic, before)
    config = config_for("full", steps, "cpu", volume.voxel_size)
    config.balance_classes = balance_classes
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cremi-full.pt"
        done, secs = train(pretrained.path, volume, sparse, config, None, out)
        tuned = load_checkpoint(out)
        probs = predict_all(tuned.model, volume.image, tuned, "cpu")
    np.savez_compressed(npz, before=np.asarray(before), after=np.asarray(probs),
                        painting=sparse, channel=channel, steps=done, seconds=secs)
    print(f"saved {npz}: {done} steps in {secs:.0f} s", flush=True)


def sizes_used(probs: np.ndarray, painting: np.ndarray | None, voxel_size: tuple[float, ...],
               channel: int) -> tuple[ChannelRole, dict[str, str]]:
    """The boundary channel's role as the widget's Objects sizes it, and the sources."""
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.objects import roles_from_metadata, roles_from_painting
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    ckpt = load_checkpoint(sample_checkpoint_path())
    names = ckpt.channel_names
    roles = roles_from_metadata(ckpt.metadata, names)
    found = roles_from_painting(roles, painting, names, voxel_size,
                                probabilities={names[channel]: probs[channel]})
    return found.roles[names[channel]], found.sources[names[channel]]


def one_by_one(objects: np.ndarray, volume: RealVolume, min_overlap: int = 1) -> list[str]:
    """Lines of the two tables and the VOI on the labelled slices of the scored half."""
    from napari_finetune.cli.real import countable_cells
    from napari_finetune.objects.scores import region_scores

    z = volume.labelled_z
    part = volume.scored
    truth, known = volume.truth, volume.known
    scored = np.zeros(known.shape, bool)
    scored[part] = True
    on = (scored & known)[z]
    pred_z, true_z = objects[z], truth[z]
    counted_pred, counted_true = countable_cells(objects, truth, known, part, z)
    n = max(int(pred_z.max()), 0) + 1
    pred_whole = np.bincount(pred_z.ravel(), minlength=n)
    pred_on = np.bincount(pred_z[on].ravel(), minlength=n)
    m = int(true_z.max()) + 1
    true_whole = np.bincount(true_z.ravel(), minlength=m)
    true_on = np.bincount(true_z[on].ravel(), minlength=m)
    # Overlap pixels of (true, predicted) pairs on the labelled pixels of the whole slice.
    labelled = known[z]
    pairs = np.stack([true_z[labelled], pred_z[labelled]])
    keys, overlap = np.unique(pairs, axis=1, return_counts=True)
    lines = ["true cells with pixels on the scored patch (pixels on the slice / on the "
             "patch; counted; predicted cells covering it: id overlap [id's share on patch])"]
    for t in np.flatnonzero(true_on):
        if t == 0:
            continue
        cover = [(int(p), int(c)) for (tt, p), c in zip(keys.T, overlap, strict=True)
                 if tt == t and c >= min_overlap]
        cover.sort(key=lambda pc: -pc[1])
        said = ", ".join(
            (f"{p} {c} [{pred_on[p] / max(pred_whole[p], 1):.0%}]" if p else f"none {c}")
            for p, c in cover)
        lines.append(f"  true {t}: {true_whole[t]} / {true_on[t]}; "
                     f"{'counted' if t in counted_true else 'not counted'}; {said}")
    lines.append("predicted cells touching the scored patch (pixels on the slice / on the "
                 "patch; counted; true cells it covers: id overlap)")
    for p in np.flatnonzero(pred_on):
        if p == 0:
            continue
        cover = sorted(((int(t), int(c)) for (t, pp), c in zip(keys.T, overlap, strict=True)
                        if pp == p and t > 0 and c >= min_overlap), key=lambda tc: -tc[1])
        said = ", ".join(f"{t} {c}" for t, c in cover)
        lines.append(f"  pred {p}: {pred_whole[p]} / {pred_on[p]} "
                     f"({pred_on[p] / pred_whole[p]:.0%}); "
                     f"{'counted' if p in counted_pred else 'not counted'}; {said}")
    s = region_scores(pred_z[:, part[1], part[2]], true_z[:, part[1], part[2]])
    boundary_on = int((pred_z[on] == 0).sum())
    lines.append(f"adapted Rand error {s['adapted_rand_error']:.3f}, VOI split "
                 f"{s['voi_split']:.3f}, merge {s['voi_merge']:.3f}; counted "
                 f"{counted_pred.size} / {counted_true.size}; {boundary_on} of {int(on.sum())} "
                 "labelled pixels of the patch on no predicted cell (boundary or dropped)")
    return lines


def true_outlines(truth: np.ndarray) -> np.ndarray:
    """(Y, X) bool: both sides of every edge of a labelled cell, against another cell
    or against unlabelled pixels (the reference's outlines, as a perfect membrane)."""
    edge = np.zeros(truth.shape, bool)
    for axis in (0, 1):
        a = np.take(truth, range(truth.shape[axis] - 1), axis=axis)
        b = np.take(truth, range(1, truth.shape[axis]), axis=axis)
        e = (a != b) & ((a > 0) | (b > 0))
        lo = [slice(None)] * 2
        hi = [slice(None)] * 2
        lo[axis], hi[axis] = slice(0, -1), slice(1, None)
        edge[tuple(lo)] |= e
        edge[tuple(hi)] |= e
    return edge


def per_section(prob: np.ndarray, role: ChannelRole) -> np.ndarray:
    """The objects step on each z section alone (2D), ids made distinct across sections."""
    from napari_finetune.objects import boundary_instances

    out = np.zeros(prob.shape, np.uint32)
    offset = 0
    for k in range(prob.shape[0]):
        labels = boundary_instances(prob[k], role).astype(np.uint32)
        labels[labels > 0] += offset
        offset = max(offset, int(labels.max()))
        out[k] = labels
    return out


def what_if(prob: np.ndarray, role: ChannelRole, volume: RealVolume) -> list[str]:
    """The same scores with the membrane or the objects step changed, one thing at a time:
    where the cells are lost. Diagnostics only; none of these is a setting of the product."""
    from dataclasses import replace

    from napari_finetune.cli.real import countable_cells
    from napari_finetune.objects import boundary_instances
    from napari_finetune.objects.scores import region_scores

    z = volume.labelled_z
    part = volume.scored
    truth, known = volume.truth, volume.known
    size = volume.voxel_size
    edge = true_outlines(truth[z[0]])
    kept = ((prob[z[0]] > role.threshold) & edge).sum() / edge.sum()
    lines = [f"the reference's outlines on z = {z[0]}: {int(edge.sum())} pixels, "
             f"{kept:.0%} of them above the threshold; {(prob > role.threshold).mean():.1%} "
             "of the crop's voxels above it"]

    def line(what: str, objects: np.ndarray) -> None:
        s = region_scores(objects[z][:, part[1], part[2]], truth[z][:, part[1], part[2]])
        found, true = countable_cells(objects, truth, known, part, z)
        lines.append(f"  {what}: adapted Rand error {s['adapted_rand_error']:.3f}, VOI split "
                     f"{s['voi_split']:.2f} / merge {s['voi_merge']:.2f}, cells "
                     f"{found.size} / {true.size}")

    line("as the widget (3D)", boundary_instances(prob, role, size))
    sd = role.seed_distance
    for factor in (0.5, 2.0):
        changed = replace(role, seed_distance=max(1.0, sd * factor))
        line(f"seed distance {changed.seed_distance:g}", boundary_instances(prob, changed, size))
    outlined = prob.copy()
    outlined[z[0]][edge] = 1.0
    line(f"3D, the true outlines made membrane on z = {z[0]} only",
         boundary_instances(outlined, role, size))
    everywhere = prob.copy()
    everywhere[:, edge] = 1.0
    line("3D, the true outlines made membrane on every section",
         boundary_instances(everywhere, role, size))
    line("each section alone (2D)", per_section(prob, role))
    line(f"each section alone, the true outlines made membrane on z = {z[0]}",
         per_section(outlined, role))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Train once (``--train``) or read the saved probabilities; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", type=Path, default=Path("/tmp/cells/cremi_full.npz"))
    parser.add_argument("--train", action="store_true", help="fine-tune and save the npz first")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--crop", choices=("first", "held-out"), default="first",
                        help="bench_real's --cremi-crop region (default: %(default)s)")
    parser.add_argument("--balance-classes", action="store_true",
                        help="train with FinetuneConfig.balance_classes on")
    args = parser.parse_args(argv)
    if args.train:
        train_and_save(args.npz, args.steps, args.crop, args.balance_classes)
    from napari_finetune.objects import boundary_instances

    saved = np.load(args.npz)
    volume = cremi_crop(args.crop)
    channel = int(saved["channel"])
    for which in ("before", "after"):
        probs = saved[which]
        painting = saved["painting"] if which == "after" else None
        role, sources = sizes_used(probs, painting, volume.voxel_size, channel)
        print(f"## {which}: {role} ({sources})")
        objects = boundary_instances(probs[channel], role, volume.voxel_size)
        for line in one_by_one(objects, volume) + what_if(probs[channel], role, volume):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
