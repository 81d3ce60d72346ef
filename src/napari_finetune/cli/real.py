"""The sample model, fine-tuned or not, and a classical baseline, on real labelled volumes.

Shared by ``napari-finetune demo --real`` and ``benchmarks/bench_real.py`` so
both print the same rows. For one volume of :mod:`napari_finetune.samples.real`:

- a simulated user (:func:`napari_finetune.cli.simulate.simulate_corrections`)
  paints a few slices of the left half in x, on labelled voxels only, at most
  1 % of the volume's voxels (and at most a tenth of the labelled voxels of
  that half, so a volume labelled on one slice is not painted densely);
- every row is scored on the right half, which nobody painted:

  - ``pretrained``: the sample model as the widget preselects it;
  - ``full`` / ``lora``: fine-tuned with the widget's default settings
    (:class:`~napari_finetune.config.FinetuneConfig`'s), for a fixed number of
    steps or for a fixed time (the load of the machine then changes the steps,
    the step rows do not move with it);
  - ``dense``: the same half painted densely (every labelled voxel), full
    fine-tune, no distillation, the same steps;
  - ``otsu``: what a user can do in napari without a network (scikit-image):
    gaussian smoothing, Otsu's threshold, a distance-transform watershed (for
    EM cells in 2D, on the membranes Otsu finds).

Nuclei: F1 of objects matched at IoU > 0.5 and semantic IoU of the object
channel. Cells: adapted Rand error on the labelled pixels (truth 0 is
*unlabelled* there and ignored) and the IoU of the boundary channel against
the boundaries between labelled cells. Each row says how many objects it found
beside the truth's count in the scored part. Nuclei are scored as objects of the
half holding most of them, away from the field's in-plane edges (:func:`scorable`):
predicted and true alike, so a sliver across the cut or a cap at the edge, which the
reference labels only sometimes, is counted on neither side. Cells are counted
when most of their pixels on the labelled slices lie on labelled pixels of the
scored half (:func:`countable_cells`), predicted and true alike: CREMI's reference
labels a patch of one slice, and a predicted cell covering a few of its pixels is
no cell to compare. Each row keeps the count of every object in the scored part
beside (``found_any`` / ``true_any``), the count before these rules.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from napari_finetune.config import FinetuneConfig, Mode

if TYPE_CHECKING:
    from pathlib import Path

    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.samples.real import RealVolume

RUNS = ("pretrained", "full", "full-time", "lora", "lora-time", "dense", "otsu")
# Of the labelled voxels of the painted half, at most this share is painted.
KNOWN_SHARE = 0.1
BUDGET = 0.01


class RealRow(TypedDict):
    """One row of the real-volume table."""

    volume: str
    run: str
    steps: int  # optimizer steps done (0: no training)
    train_s: float
    painted: float  # fraction of the volume's voxels painted
    iou: float  # semantic IoU of the scored channel on the scored part
    score: float  # F1 (nuclei) or adapted Rand error (cells)
    found: int  # objects found in the scored part (those scorable / countable_cells count)
    true: int  # objects of the truth in the scored part (likewise)
    found_any: int  # every object with a voxel in the scored part (the count before 38b56d7)
    true_any: int  # every true object with a voxel there (cells: a labelled one)


def channel_of(checkpoint: Checkpoint, volume: RealVolume) -> int:
    """Index of the channel the volume's kind is scored on: the boundary channel for
    cells, the object channel for nuclei (by the checkpoint's instance roles)."""
    from napari_finetune.objects import roles_from_metadata

    names = checkpoint.channel_names
    roles = roles_from_metadata(checkpoint.metadata, names)
    wanted = "boundary" if volume.spec.kind == "cells" else "object"
    for c, name in enumerate(names):
        if roles[name].role == wanted:
            return c
    raise ValueError(f"the model has no {wanted} channel to score {volume.name} on.")


def semantic_truth(volume: RealVolume, channel: int) -> np.ndarray:
    """uint8 class map for painting: 0 background, ``channel + 1`` the scored class,
    255 unknown (never painted)."""
    from napari_finetune.samples.real import boundary_truth

    if volume.spec.kind == "cells":
        sem = boundary_truth(volume.truth, volume.known)
        sem[sem == 1] = channel + 1
        return sem
    sem = np.where(volume.truth > 0, channel + 1, 0).astype(np.uint8)
    sem[~volume.known] = 255
    return sem


def paint_sparse(
    volume: RealVolume, semantic: np.ndarray, probabilities: np.ndarray, seed: int = 0
) -> np.ndarray:
    """The simulated user's strokes on a few labelled slices of the painted half."""
    from napari_finetune.cli.simulate import simulate_corrections

    part = volume.painted
    z_all = volume.labelled_z
    # A few slices inside the stack (the middle ones), all of them when there are few.
    slices = z_all[1:-1][:3] if len(z_all) > 3 else z_all
    known = volume.known[part]
    budget = min(BUDGET * volume.truth.size, KNOWN_SHARE * int(known.sum()))
    crop_truth = semantic[part]
    crop_probs = probabilities[(slice(None), part[0], part[1], part[2])]
    # Strokes only on labelled voxels: on CREMI's patch-labelled slice, strokes centred
    # on unlabelled voxels (a class of their own to the painter) and then wiped spent
    # three quarters of the budget on nothing (222 voxels painted of 834).
    painted = simulate_corrections(crop_truth, crop_probs, slices, budget / crop_truth.size,
                                   seed, paintable=known)
    corrections = np.zeros(volume.truth.shape, np.uint8)
    corrections[part] = painted
    return corrections


def paint_dense(volume: RealVolume, semantic: np.ndarray) -> np.ndarray:
    """Every labelled voxel of the painted half, with its class."""
    corrections = np.zeros(volume.truth.shape, np.uint8)
    sem = semantic[volume.painted]
    corrections[volume.painted] = np.where(volume.known[volume.painted], sem + 1, 0)
    return corrections


def train(
    checkpoint_path: Path | None, volume: RealVolume, corrections: np.ndarray,
    config: FinetuneConfig, seconds: float | None, out: Path,
) -> tuple[int, float]:
    """Fine-tune a fresh copy of the checkpoint; stop after ``seconds`` if given; export.

    Returns the steps done and the training time in seconds.
    """
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.trainer.loop import Finetuner

    if checkpoint_path is None:
        raise ValueError("fine-tuning starts from a checkpoint file; this one has no path.")
    ckpt = load_checkpoint(checkpoint_path)
    trainer = Finetuner.from_checkpoint(ckpt, volume.image, corrections, config)
    t0 = time.perf_counter()
    step = 0
    for status in trainer.run():
        step = status.step
        if seconds is not None and time.perf_counter() - t0 > seconds:
            trainer.stop()  # the last completed step's weights are kept, as the widget's Stop
    elapsed = time.perf_counter() - t0
    trainer.export(out)
    return step, elapsed


def widget_objects(
    checkpoint: Checkpoint, probs: np.ndarray, painting: np.ndarray | None, channel: int,
    voxel_size: tuple[float, ...] | None,
) -> np.ndarray:
    """Channel ``channel``'s objects as the widget's Objects makes them: the checkpoint's
    roles, each object channel's sizes from the painting or else the prediction,
    distances in the voxel size."""
    from napari_finetune.objects import instances_of, roles_from_metadata, roles_from_painting

    names = checkpoint.channel_names
    roles = roles_from_metadata(checkpoint.metadata, names)
    probs = np.asarray(probs)
    found = roles_from_painting(roles, painting, names, voxel_size,
                                probabilities={names[channel]: probs[channel]})
    return instances_of(probs, found.roles, names, voxel_size)[names[channel]]


def config_for(run: str, steps: int, device: str = "cpu",
               voxel_size: tuple[float, ...] | None = None) -> FinetuneConfig:
    """The widget's default settings for ``run``, on the CPU, checked once at the end
    (a held-out check every 10 steps would cost several steps' time on a CPU), with the
    volume's voxel size as the widget reads it from a store's scale."""
    mode: Mode = "lora" if run.startswith("lora") else "full"
    config = FinetuneConfig(steps=steps, mode=mode, device=device, seed=0,
                            validation_every=steps, voxel_size=voxel_size,
                            distillation_check=True)
    if run == "dense":
        config = dataclasses.replace(config, distillation=0.0, hold_other_channels=False,
                                     validation_fraction=0.0)
    return config


def score(
    volume: RealVolume, channel: int, probability: np.ndarray | None, objects: np.ndarray,
    semantic: np.ndarray,
) -> dict[str, float]:
    """Semantic IoU, the kind's score and the object counts on the scored part.

    ``probability``: the scored channel's (Z, Y, X) probability (its mask is
    ``> 0.5``), or None for the baseline, whose mask comes from its objects
    (:func:`baseline_mask`). The IoU counts labelled voxels only.
    """
    from napari_finetune.objects.scores import object_scores, region_scores

    part = volume.scored
    known = volume.known[part]
    truth = volume.truth[part]
    pred = objects[part]
    cls = semantic[part] == channel + 1
    mask = (probability[part] > 0.5) if probability is not None else baseline_mask(pred, volume)
    inter = int((mask & cls & known).sum())
    union = int(((mask | cls) & known).sum())
    iou = inter / union if union else 1.0
    if volume.spec.kind == "cells":
        z = volume.labelled_z
        # Only labelled slices: elsewhere truth 0 is unlabelled, which region_scores leaves out.
        s = region_scores(pred[z], truth[z])
        found, true = countable_cells(objects, volume.truth, volume.known, part, z)
        return {"iou": iou, "score": s["adapted_rand_error"], "found": found.size,
                "true": true.size, "found_any": s["n_pred"], "true_any": s["n_true"]}
    s = object_scores(*scorable(objects, volume.truth, part))
    # The counts before scorable (every object with a voxel in the part), for the record.
    before = object_scores(pred, truth)
    return {"iou": iou, "score": s["f1"], "found": s["n_pred"], "true": s["n_true"],
            "found_any": before["n_pred"], "true_any": before["n_true"]}


def countable_cells(
    pred: np.ndarray, truth: np.ndarray, known: np.ndarray, part: tuple[slice, ...],
    labelled_z: list[int],
) -> tuple[np.ndarray, np.ndarray]:
    """Ids of the predicted and true cells counted on a partly labelled volume.

    A cell, predicted or true alike, is counted when most of its pixels on the
    labelled slices lie on labelled pixels (``known``) of ``part``. The reference
    of CREMI labels a patch of one slice: a predicted cell lying mostly outside
    the patch that covers a few of its pixels (10-106 pixels for 8 of the 20 cells
    at the defaults) is no cell anyone can compare with the truth, and a true cell
    lying mostly in the painted half is that half's. The adapted Rand error does not
    use this: it is computed on every labelled pixel of ``part``.

    Parameters
    ----------
    pred, truth : numpy.ndarray
        Whole-volume ZYX labels, 0 no cell (in ``truth``: unlabelled).
    known : numpy.ndarray
        ZYX bool, the voxels whose truth is known.
    part : tuple of slice
        The scored part of the volume.
    labelled_z : list of int
        The slices with known truth; only their pixels are looked at.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        The counted predicted ids and the counted true ids, sorted.
    """
    scored = np.zeros(known.shape, bool)
    scored[part] = True
    on = (scored & known)[labelled_z]
    return _mostly_on(pred[labelled_z], on), _mostly_on(truth[labelled_z], on)


def _mostly_on(labels: np.ndarray, on: np.ndarray) -> np.ndarray:
    """Ids (not 0) with more than half their pixels where ``on`` is True."""
    n = int(labels.max()) + 1
    whole = np.bincount(labels.ravel(), minlength=n)
    inside = np.bincount(labels[on].ravel(), minlength=n)
    keep = inside * 2 > whole
    keep[0] = False
    return np.flatnonzero(keep)


def scorable(
    pred: np.ndarray, truth: np.ndarray, part: tuple[slice, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and true objects (whole-volume labels) cut to ``part``, only those scored.

    Left out, of both alike:

    - objects with most of their voxels outside ``part``: a nucleus of the painted half
      reaching a voxel across the cut is no object of the scored half (cho-t00 counted
      such a one-voxel sliver as a true nucleus no prediction could match);
    - objects touching an in-plane face of the volume (the last two axes; the few
      sections in z cut every nucleus): the reference labels the caps of nuclei cut
      by the field's edge on some faces and not on others (cho-t00 and cho-t19: caps
      of 2200-2300 voxels, plainly nuclei in the image, unlabelled; others labelled),
      so such a cap is a coin toss, not a count;
    - predicted objects lying mostly on a true object left out: they are its prediction.

    Every other predicted object counts, a false one included.
    """
    keep_true = _owned_away_from_faces(truth, part)
    keep_pred = _owned_away_from_faces(pred, part)
    t, p = truth[part], pred[part]
    dropped_truth = (t > 0) & ~keep_true[t]
    ids = np.flatnonzero(keep_pred)
    if ids.size:
        inside = np.bincount(p.ravel(), minlength=keep_pred.size)
        on_dropped = np.bincount(p[dropped_truth], minlength=keep_pred.size)
        keep_pred[ids] = on_dropped[ids] * 2 <= inside[ids]
    return np.where(keep_pred[p], p, 0), np.where(keep_true[t], t, 0)


def _owned_away_from_faces(labels: np.ndarray, part: tuple[slice, ...]) -> np.ndarray:
    """Per id: whether most of the object lies in ``part`` and it touches no in-plane face."""
    n = int(labels.max()) + 1
    whole = np.bincount(labels.ravel(), minlength=n)
    inside = np.bincount(labels[part].ravel(), minlength=n)
    keep = inside * 2 > whole
    for axis in (-2, -1):
        for index in (0, -1):
            face = np.take(labels, index, axis=axis)
            keep[np.unique(face)] = False
    keep[0] = False
    return keep


def baseline_mask(objects: np.ndarray, volume: RealVolume) -> np.ndarray:
    """The baseline's semantic mask: its objects (nuclei) or the lines between them (cells)."""
    if volume.spec.kind == "nuclei":
        return objects > 0
    from skimage.segmentation import find_boundaries

    return np.stack([find_boundaries(s, mode="inner") for s in objects])


def classical(volume: RealVolume) -> np.ndarray:
    """Instance labels a user gets with scikit-image alone (no model, no network).

    Nuclei: gaussian smoothing (2 pixels in-plane, scaled to the voxel size in
    z), Otsu's threshold, a watershed of the distance transform (in nm) from
    seeds at its in-plane maxima at least half a nucleus apart. Cells (EM, slice by slice):
    gaussian smoothing, Otsu's threshold (membranes are the dark side), a
    watershed of the distance to the membranes from its maxima.
    """
    from scipy import ndimage
    from skimage.feature import peak_local_max
    from skimage.filters import gaussian, threshold_otsu
    from skimage.segmentation import watershed

    image = volume.image.astype(np.float32)
    vz, vy, vx = volume.voxel_size
    if volume.spec.kind == "nuclei":
        smooth = gaussian(image, sigma=(2.0 * vy / vz, 2.0, 2.0))
        mask = smooth > threshold_otsu(smooth)
        dist = ndimage.distance_transform_edt(mask, sampling=(vz, vy, vx))
        # Seeds in-plane: a stack a few slices deep gives a flat top in z, whose many
        # equal maxima would each seed a nucleus. One seed per ~5 µm (CHO nuclei ~10 µm).
        plane = gaussian(dist.max(axis=0), sigma=2.0)
        r = max(1, int(round(2500.0 / vy)))
        peaks = peak_local_max(plane, min_distance=r, labels=ndimage.label(mask.any(axis=0))[0],
                               exclude_border=False)
        markers = np.zeros(mask.shape, np.int32)
        for i, (y, x) in enumerate(peaks, start=1):
            markers[int(dist[:, y, x].argmax()), y, x] = i
        labels = watershed(-dist, markers, mask=mask)
        return _drop_small(labels, 200)
    out = np.zeros(image.shape, np.uint32)
    offset = 0
    for z in volume.labelled_z:
        smooth = gaussian(image[z], sigma=1.0)
        interior = smooth > threshold_otsu(smooth)
        dist = ndimage.distance_transform_edt(interior)
        peaks = peak_local_max(dist, min_distance=10, labels=ndimage.label(interior)[0],
                               exclude_border=False)
        markers = np.zeros(interior.shape, np.int32)
        markers[tuple(peaks.T)] = np.arange(1, len(peaks) + 1)
        # No mask: every pixel, membranes included, goes to the nearest cell.
        labels = watershed(-dist, markers)
        out[z] = np.where(labels > 0, labels + offset, 0)
        offset += len(peaks)
    return out


def _drop_small(labels: np.ndarray, min_size: int) -> np.ndarray:
    sizes = np.bincount(labels.ravel())
    small = sizes < min_size
    small[0] = False
    out = labels.copy()
    out[small[labels]] = 0
    return out.astype(np.uint32)


def real_rows(
    volume: RealVolume, runs: tuple[str, ...] | list[str], steps: int, seconds: float,
    workdir: Path, device: str = "cpu", progress: bool = True, checkpoint: Path | None = None,
) -> list[RealRow]:
    """Every row of ``runs`` for one real volume (see the module docstring).

    Parameters
    ----------
    volume : RealVolume
        From :func:`napari_finetune.samples.real.fetch_real`.
    runs : names from :data:`RUNS`
    steps : int
        Optimizer steps of the fixed-step rows (``full``, ``lora``, ``dense``).
    seconds : float
        Training time of the ``*-time`` rows.
    workdir : Path
        Where the fine-tuned checkpoints are written.
    checkpoint : Path, optional
        The pretrained model every row starts from; the sample model (what the widget
        preselects) when not given.
    """
    from napari_finetune.cli.simulate import predict_all
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        raise ValueError(f"unknown runs {unknown}; use {', '.join(RUNS)}.")
    pretrained = load_checkpoint(checkpoint or sample_checkpoint_path())
    channel = channel_of(pretrained, volume)
    semantic = semantic_truth(volume, channel)
    before = predict_all(pretrained.model, volume.image, pretrained, device)
    sparse = paint_sparse(volume, semantic, before)
    rows: list[RealRow] = []

    def add(run: str, probs: np.ndarray | None, objects: np.ndarray, step: int, secs: float,
            painted: np.ndarray | None) -> None:
        prob = probs[channel] if probs is not None else None
        s = score(volume, channel, prob, objects, semantic)
        fraction = float((painted > 0).mean()) if painted is not None else 0.0
        row: RealRow = {"volume": volume.name, "run": run, "steps": step,
                        "train_s": round(secs, 1), "painted": fraction,
                        "iou": round(s["iou"], 4), "score": round(s["score"], 4),
                        "found": int(s["found"]), "true": int(s["true"]),
                        "found_any": int(s["found_any"]), "true_any": int(s["true_any"])}
        rows.append(row)
        if progress:
            print(f"  {volume.name} {run}: {row}", flush=True)

    def objects_of(checkpoint: Checkpoint, probs: np.ndarray,
                   painting: np.ndarray | None) -> np.ndarray:
        return widget_objects(checkpoint, probs, painting, channel, volume.voxel_size)

    for run in runs:
        if run == "pretrained":
            add(run, before, objects_of(pretrained, before, None), 0, 0.0, None)
        elif run == "otsu":
            t0 = time.perf_counter()
            labels = classical(volume)
            add(run, None, labels, 0, time.perf_counter() - t0, None)
        else:
            painting = paint_dense(volume, semantic) if run == "dense" else sparse
            timed = run.endswith("-time")
            # A timed run stops on the clock; its step budget only has to be out of reach.
            config = config_for(run, 100_000 if timed else steps, device, volume.voxel_size)
            out = workdir / f"{volume.name}-{run}.pt"
            done, secs = train(pretrained.path, volume, painting, config,
                               seconds if timed else None, out)
            tuned = load_checkpoint(out)
            probs = predict_all(tuned.model, volume.image, tuned, device)
            add(run, probs, objects_of(tuned, probs, painting), done, secs, painting)
    return rows


ROW_LABELS = {
    "pretrained": "pretrained, before any step",
    "full": "fine-tuned, full, {steps} steps",
    "full-time": "fine-tuned, full, {secs:.0f} s",
    "lora": "fine-tuned, LoRA, {steps} steps",
    "lora-time": "fine-tuned, LoRA, {secs:.0f} s",
    "dense": "dense bound (full, {steps} steps)",
    "otsu": "classical: gaussian, Otsu, watershed",
}


def table(rows: list[RealRow], kind: str) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the markdown table of ``rows`` (volumes of one ``kind``)."""
    if kind == "cells":
        measure, semantic = "adapted Rand error (0 ignored; lower is better)", "IoU boundary"
    else:
        measure, semantic = "F1 (IoU > 0.5)", "IoU nuclei"
    header = ["volume", "row", "steps", "train s", "painted", semantic, measure,
              "objects found / true"]
    cells = []
    for r in rows:
        label = ROW_LABELS[r["run"]].format(steps=r["steps"], secs=r["train_s"])
        cells.append([
            r["volume"], label, str(r["steps"]) if r["steps"] else "-",
            f"{r['train_s']:.0f}" if r["steps"] else "-",
            f"{100 * r['painted']:.2f}%" if r["painted"] else "-",
            f"{r['iou']:.3f}", f"{r['score']:.3f}", counts(r),
        ])
    return header, cells


def counts(row: RealRow) -> str:
    """``found / true``, and the count of every object in the scored part beside it
    where the two differ (the scoring changed: both figures stay in the table)."""
    text = f"{row['found']} / {row['true']}"
    if (row["found_any"], row["true_any"]) != (row["found"], row["true"]):
        text += f" (any: {row['found_any']} / {row['true_any']})"
    return text


def markdown(rows: list[RealRow], kind: str) -> str:
    """:func:`table` as markdown text."""
    header, cells = table(rows, kind)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines)
