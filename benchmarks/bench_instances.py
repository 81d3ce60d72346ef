"""Instances from probabilities on the sample: quality before/after fine-tuning, and speed.

Generates the target-domain sample (the demo's volume) with its instance truth,
predicts it with the pretrained sample checkpoint ("before") and, with
``--checkpoint``, a fine-tuned one ("after", e.g. the demo's
``<out>/finetuned.pt``), turns the probabilities into cells (membrane, a
boundary channel) and mitochondria (an object channel) and scores them on the
never-painted half (z >= depth/2):

1. cells: adapted Rand error and variation of information (split, merge);
   mitochondria: precision, recall, F1 of objects matched at IoU > 0.5 and
   the count error, against the drawn mitochondria and against the visible
   ones (drawn ones that overlap make one blob) -- for the default roles and
   a few other parameter choices;
2. objects that generalise: the default roles (chosen on the sample) on the
   sample's held-out half and on volumes nobody painted or tuned on -- a
   second volume of the sample's microscope (target seed 2) and other
   appearances (the source domain, bench_adaptation's unseen one) -- for each
   model and for the semantic truth blurred by one voxel (an upper bound for
   mitochondria, not for cells: the drawn membrane has gaps where the truth
   has two cells; the dense-trained upper bound is ``--upper``'s). Cells: adapted Rand error
   (truth 0, the membrane, left out), VOI split and VOI merge apart, counts;
   mitochondria: F1 against the visible blobs;
3. speed of the instance step on the whole volume, in Mvoxel/s of wall time
   and of CPU time (scipy and scikit-image run on one core).

Usage::

    python benchmarks/bench_instances.py                          # before only
    python benchmarks/bench_instances.py --checkpoint demo/finetuned.pt
    python benchmarks/bench_instances.py --cache /tmp/probs       # reuse predictions
    python benchmarks/bench_instances.py --unseen --checkpoint tuned_on_unseen.pt
    python benchmarks/bench_instances.py --upper sample unseen third --cache /tmp/probs

``--upper APPEARANCE...`` prints only the objects per appearance against the
dense-trained upper bound (:func:`upper_rows`): bench_adaptation's sparse full
fine-tune (77 steps) and dense training (220 steps) of each appearance
(``sample``, ``unseen``, ``third``), trained by bench_adaptation's own
functions and kept as checkpoints under ``--cache`` (a rerun predicts and
scores only), scored on the painted volume's held-out half and on a second,
never painted volume of the same appearance (another geometry seed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from markdown_table import print_table
from scipy import ndimage

from napari_finetune.objects import ChannelRole, boundary_instances, object_instances
from napari_finetune.objects.roles import SAMPLE_ROLES
from napari_finetune.objects.scores import object_scores, region_scores

MEMBRANE, MITO = SAMPLE_ROLES["membrane"], SAMPLE_ROLES["mitochondria"]
# (label, role): the default first, then the choices the default was picked against.
CELL_CHOICES = [
    ("default", MEMBRANE),
    ("seed_distance 2", replace(MEMBRANE, seed_distance=2.0)),
    ("seed_distance 4", replace(MEMBRANE, seed_distance=4.0)),
    ("seed_distance 6", replace(MEMBRANE, seed_distance=6.0)),
    ("seed_distance 10", replace(MEMBRANE, seed_distance=10.0)),
    ("threshold 0.3", replace(MEMBRANE, threshold=0.3)),
    ("threshold 0.3, seed_distance 6", replace(MEMBRANE, threshold=0.3, seed_distance=6.0)),
    ("min_size 0", replace(MEMBRANE, min_size=0)),
]
MITO_CHOICES = [
    ("default", MITO),
    ("no split, min_size 100 (the default before core seeds)",
     replace(MITO, split=False, seed_threshold=None, min_size=100)),
    ("no split", replace(MITO, split=False, seed_threshold=None)),
    ("seed_threshold 0.85", replace(MITO, seed_threshold=0.85)),
    ("min_size 100", replace(MITO, min_size=100)),
    ("min_size 200", replace(MITO, min_size=200)),
    ("threshold 0.35", replace(MITO, threshold=0.35)),
    ("threshold 0.5", replace(MITO, threshold=0.5)),
    ("split at distance maxima, seed_distance 8",
     replace(MITO, seed_threshold=None, seed_distance=8.0)),
]


def predict(checkpoint_path: Path, image: np.ndarray, cache: Path | None) -> np.ndarray:
    """Probabilities (C, Z, Y, X) as the demo computes them, cached by file content."""
    # The image is part of the key: two volumes of one shape are two predictions.
    key = hashlib.sha256(checkpoint_path.read_bytes() + image.tobytes()).hexdigest()[:12]
    shape = "x".join(map(str, image.shape))
    cached = cache / f"probs_{key}_{shape}.npy" if cache else None
    if cached is not None and cached.exists():
        return np.load(cached)
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.predict import predict_volume

    ckpt = load_checkpoint(checkpoint_path)
    names = ckpt.channel_names
    if names != ["membrane", "mitochondria"]:
        raise SystemExit(f"{checkpoint_path}: channels {names}, expected the sample's.")
    low_high = intensity_range(image, ckpt.normalization)
    probs = np.asarray(predict_volume(ckpt.model, image, low_high, PredictConfig(device="cpu")))
    if cached is not None:
        cache.mkdir(parents=True, exist_ok=True)
        np.save(cached, probs)
    return probs


def fmt(x: float) -> str:
    return f"{x:.3f}"


def main() -> None:
    from napari_finetune.cli.simulate import split_slices
    from napari_finetune.samples.synthetic_em import (
        DEFAULT_SHAPE,
        generate_volume,
        sample_checkpoint_path,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a fine-tuned sample checkpoint (after)")
    parser.add_argument(
        "--shape", type=int, nargs=3, default=DEFAULT_SHAPE, metavar=("Z", "Y", "X")
    )
    parser.add_argument("--cache", type=Path, help="folder to keep predictions in between runs")
    parser.add_argument(
        "--unseen", action="store_true",
        help="bench_adaptation's unseen appearance instead of the sample (nothing was tuned "
        "on it; --shape is ignored); --checkpoint then is one fine-tuned on it",
    )
    parser.add_argument(
        "--upper", nargs="+", metavar="APPEARANCE",
        help="only the objects of the sparse full fine-tune against the dense-trained upper "
        "bound, per appearance (sample, unseen, third); checkpoints are cached under --cache",
    )
    args = parser.parse_args()

    if args.upper:
        upper_tables(args.upper, args.cache)
        return
    if args.unseen:
        from bench_adaptation import UNSEEN_SEED, UNSEEN_SHAPE, unseen_appearance

        image, semantic, truth = generate_volume(
            UNSEEN_SHAPE, UNSEEN_SEED, appearance=unseen_appearance(), instances=True
        )
    else:
        image, semantic, truth = generate_volume(tuple(args.shape), domain="target",
                                                 instances=True)
    _, held = split_slices(image.shape[0])
    # Drawn mitochondria overlap (the image shows one blob with no edge between
    # them), so they are also scored against the visible objects: the connected
    # blobs of the truth.
    visible, _ = ndimage.label(semantic[held] == 2)
    cells = np.unique(truth["cells"][held]).size - 1
    drawn = np.unique(truth["mitochondria"][held]).size - 1
    what = "unseen appearance" if args.unseen else "target sample"
    print(f"# Instances on the {what} {tuple(image.shape)}; scored on z {held.start}..")
    print(f"load average {os.getloadavg()[0]:.2f}; held-out half: {cells} cells, {drawn} drawn "
          f"mitochondria in {visible.max()} visible blobs\n")
    models = [("before", sample_checkpoint_path())]
    if args.checkpoint:
        models.append(("after", args.checkpoint))

    rows_cells, rows_mito, rows_speed = [], [], []
    for when, path in models:
        probs = predict(path, image, args.cache)
        for label, role in CELL_CHOICES:
            s = region_scores(boundary_instances(probs[0], role)[held], truth["cells"][held])
            rows_cells.append([when, label, fmt(s["adapted_rand_error"]), fmt(s["voi_split"]),
                               fmt(s["voi_merge"]), f"{s['n_pred']} / {s['n_true']}"])
        for label, role in MITO_CHOICES:
            mito = object_instances(probs[1], role)[held]
            s = object_scores(mito, truth["mitochondria"][held])
            v = object_scores(mito, visible)
            rows_mito.append([when, label, fmt(s["precision"]), fmt(s["recall"]), fmt(s["f1"]),
                              f"{s['count_error']:+.3f}", fmt(v["f1"]), f"{v['count_error']:+.3f}",
                              f"{s['n_pred']} / {s['n_true']} / {v['n_true']}"])
        rows_speed += speed(when, probs)

    print_table(["model", "cells: roles", "adapted Rand error", "VOI split", "VOI merge",
                 "cells pred / true"], rows_cells)
    print_table(["model", "mitochondria: roles", "precision", "recall", "F1 (IoU > 0.5)",
                 "count error", "F1 vs visible", "count error vs visible",
                 "pred / drawn / visible"], rows_mito)
    print_table(["volume (scored voxels)", "model", "cells: adapted Rand error", "VOI split",
                 "VOI merge", "cells pred / true", "mitochondria F1 vs visible",
                 "mitochondria pred / visible"],
                generalise_rows(models, tuple(args.shape), args.cache))
    print_table(["model", "step (whole volume, default roles)", "wall s", "Mvoxel/s wall",
                 "Mvoxel/s CPU"], rows_speed)


def generalise_volumes(
    shape: tuple[int, int, int],
) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, slice]]:
    """(name, image, semantic truth, cell truth, scored z) of the sample's held-out half and
    of volumes nobody painted or tuned the roles on, all of ``shape``."""
    from bench_adaptation import UNSEEN_SEED, unseen_appearance

    from napari_finetune.cli.simulate import split_slices
    from napari_finetune.samples.synthetic_em import generate_volume

    out = []
    for name, kwargs, held_out in [
        ("sample (target seed 1), held-out half", {"domain": "target"}, True),
        ("second volume (target seed 2), unpainted", {"seed": 2, "domain": "target"}, False),
        ("source appearance (seed 0)", {"seed": 0, "domain": "source"}, False),
        (f"unseen appearance (seed {UNSEEN_SEED})",
         {"seed": UNSEEN_SEED, "appearance": unseen_appearance()}, False),
    ]:
        image, semantic, truth = generate_volume(shape, instances=True, **kwargs)
        scored = split_slices(image.shape[0])[1] if held_out else slice(0, image.shape[0])
        out.append((name, image, semantic, truth["cells"], scored))
    return out


def truth_probability(semantic: np.ndarray) -> np.ndarray:
    """(2, Z, Y, X) probabilities of the semantic truth: each class blurred by one voxel
    (the membrane's 1.5x, so its middle passes 0.5 as a predicted one does).

    Right for mitochondria, not an upper bound for cells: the drawn membrane has gaps
    where the cell truth still has two cells (synthetic_em._cell_instances), which a
    model's membrane may close and this one does not (measured: the fine-tuned
    model's cells score better than it on every volume of the sample's microscope).
    """
    membrane = np.clip(1.5 * ndimage.gaussian_filter((semantic == 1).astype(np.float32), 1.0),
                       0, 1)
    mito = ndimage.gaussian_filter((semantic == 2).astype(np.float32), 1.0)
    return np.stack([membrane, mito])


def generalise_rows(models: list[tuple[str, Path]], shape: tuple[int, int, int],
                    cache: Path | None) -> list[list[str]]:
    """Default roles' objects per volume and model, scored as the demo scores them."""
    from napari_finetune.objects import instances_of
    from napari_finetune.objects.scores import scores_by_role

    names = ["membrane", "mitochondria"]
    rows = []
    for volume, image, semantic, cells, z in generalise_volumes(shape):
        runs = [(when, predict(path, image, cache)) for when, path in models]
        runs.append(("semantic truth, blurred", truth_probability(semantic)))
        for when, probs in runs:
            found = {k: v[z] for k, v in instances_of(probs, SAMPLE_ROLES, names).items()}
            s = scores_by_role(found, SAMPLE_ROLES, names, cells[z], semantic[z])
            c, m = s["membrane"], s["mitochondria"]
            rows.append([volume, when, fmt(c["adapted_rand_error"]), fmt(c["voi_split"]),
                         fmt(c["voi_merge"]), f"{c['n_pred']} / {c['n_true']}", fmt(m["f1"]),
                         f"{m['n_pred']} / {m['n_true']}"])
    return rows


# Second volumes: the painted volume's appearance and shape, another geometry seed.
SECOND_SEEDS = {"sample": 2, "unseen": 8, "third": 24}
UPPER_RUNS = ("before", "full", "dense")


def tuned_checkpoints(name: str, cache: Path) -> dict[str, Path]:
    """``before``, ``full`` and ``dense`` checkpoints of appearance ``name``, trained
    with bench_adaptation's functions on first use and kept under ``cache``.

    The file name holds the run, its step budget and the pretrained checkpoint's
    hash; training is deterministic (bench_adaptation.train), so a cached file is
    what a fresh run would give.
    """
    import json

    from bench_adaptation import STEPS, load_volume, train

    from napari_finetune.cli.simulate import predict_all
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    pretrained = sample_checkpoint_path()
    key = hashlib.sha256(pretrained.read_bytes()).hexdigest()[:8]
    out = {"before": pretrained}
    volume, before = None, None
    for run in ("full", "dense"):
        path = cache / f"tuned_{name}_{run}_{STEPS[run]}steps_{key}.pt"
        if not path.exists():
            if volume is None:
                volume = load_volume(name)
                # The painting is simulated from this prediction, as bench_adaptation does.
                ckpt = volume.checkpoint
                before = np.asarray(predict_all(ckpt.model, volume.image, ckpt, "cpu"))
            cache.mkdir(parents=True, exist_ok=True)
            info = train(volume, run, before, STEPS[run], path)
            path.with_suffix(".json").write_text(json.dumps(info))
            print(f"trained {name} {run}: {info}", flush=True)
        out[run] = path
    return out


def appearance_volumes(
    name: str,
) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, slice]]:
    """(volume, image, semantic truth, cell truth, scored z) of appearance ``name``: the
    painted volume's held-out half and a second volume (another seed), whole."""
    from bench_adaptation import (
        THIRD_SEED,
        UNSEEN_SEED,
        UNSEEN_SHAPE,
        third_appearance,
        unseen_appearance,
    )

    from napari_finetune.cli.simulate import split_slices
    from napari_finetune.samples.synthetic_em import DEFAULT_SHAPE, generate_volume

    if name == "sample":
        shape, painted_seed, kwargs = DEFAULT_SHAPE, 1, {"domain": "target"}
    elif name == "unseen":
        shape, painted_seed, kwargs = UNSEEN_SHAPE, UNSEEN_SEED, {"appearance": unseen_appearance()}
    elif name == "third":
        shape, painted_seed, kwargs = UNSEEN_SHAPE, THIRD_SEED, {"appearance": third_appearance()}
    else:
        raise SystemExit(f"unknown appearance {name!r}: use sample, unseen or third.")
    out = []
    for seed, held_out in [(painted_seed, True), (SECOND_SEEDS[name], False)]:
        image, semantic, truth = generate_volume(shape, seed, instances=True, **kwargs)
        scored = split_slices(shape[0])[1] if held_out else slice(0, shape[0])
        label = (f"painted (seed {seed}), held-out half" if held_out
                 else f"second (seed {seed}), never painted")
        out.append((label, image, semantic, truth["cells"], scored))
    return out


def upper_rows(name: str, cache: Path) -> tuple[list[list[str]], list[list[str]]]:
    """Objects (default roles) of ``before``, sparse full and dense on each volume of
    appearance ``name``, and the sparse - dense gaps in objects beside those in IoU."""
    from napari_finetune.cli.simulate import foreground_iou
    from napari_finetune.objects import instances_of
    from napari_finetune.objects.scores import scores_by_role

    names = ["membrane", "mitochondria"]
    checkpoints = tuned_checkpoints(name, cache)
    rows, gaps = [], []
    for volume, image, semantic, cells, z in appearance_volumes(name):
        runs = [(run, predict(checkpoints[run], image, cache)) for run in UPPER_RUNS]
        runs.append(("semantic truth, blurred", truth_probability(semantic)))
        got: dict[str, tuple[list[float], dict[str, dict[str, float]]]] = {}
        for run, probs in runs:
            found = {k: v[z] for k, v in instances_of(probs, SAMPLE_ROLES, names).items()}
            s = scores_by_role(found, SAMPLE_ROLES, names, cells[z], semantic[z])
            iou = foreground_iou(probs, semantic, z)
            got[run] = (iou, s)
            c, m = s["membrane"], s["mitochondria"]
            rows.append([name, volume, run, fmt(iou[0]), fmt(iou[1]),
                         fmt(c["adapted_rand_error"]), fmt(c["voi_split"]), fmt(c["voi_merge"]),
                         f"{c['n_pred']} / {c['n_true']}", fmt(m["f1"]),
                         f"{m['n_pred']} / {m['n_true']}"])
        (iou_s, s_s), (iou_d, s_d) = got["full"], got["dense"]
        are = s_s["membrane"]["adapted_rand_error"] - s_d["membrane"]["adapted_rand_error"]
        f1 = s_d["mitochondria"]["f1"] - s_s["mitochondria"]["f1"]
        # Positive = the sparse model is worse; the goal is each object gap <= 0.05.
        gaps.append([name, volume, f"{iou_d[0] - iou_s[0]:+.3f}", f"{are:+.3f}",
                     "yes" if are <= 0.05 else "no", f"{iou_d[1] - iou_s[1]:+.3f}",
                     f"{f1:+.3f}", "yes" if f1 <= 0.05 else "no"])
    return rows, gaps


def upper_tables(appearances: list[str], cache: Path | None) -> None:
    """Print :func:`upper_rows` for each appearance (``--upper``)."""
    if cache is None:
        raise SystemExit("--upper trains two models per appearance: give --cache DIR to keep them.")
    from markdown_table import measured_under

    print(f"# Objects against the dense-trained upper bound\n{measured_under()}\n")
    rows, gaps = [], []
    for name in appearances:
        r, g = upper_rows(name, cache)
        rows += r
        gaps += g
    print_table(["appearance", "volume (scored voxels)", "model", "IoU membrane",
                 "IoU mitochondria", "cells: adapted Rand error", "VOI split", "VOI merge",
                 "cells pred / true", "mitochondria F1 vs visible",
                 "mitochondria pred / visible"], rows)
    print_table(["appearance", "volume", "IoU membrane: dense - sparse",
                 "cells ARE: sparse - dense", "<= 0.05", "IoU mitochondria: dense - sparse",
                 "mitochondria F1: dense - sparse", "<= 0.05"], gaps)


def speed(when: str, probs: np.ndarray, repeats: int = 3) -> list[list[str]]:
    """Best of ``repeats`` timings of each channel's instance step on the whole volume."""
    rows = []
    steps: list[tuple[str, object, np.ndarray, ChannelRole]] = [
        ("cells (boundary_instances)", boundary_instances, probs[0], MEMBRANE),
        ("mitochondria (object_instances)", object_instances, probs[1], MITO),
    ]
    for name, fn, prob, role in steps:
        best_wall = best_cpu = float("inf")
        for _ in range(repeats):
            w, c = time.perf_counter(), time.process_time()
            fn(prob, role)  # type: ignore[operator]
            best_wall = min(best_wall, time.perf_counter() - w)
            best_cpu = min(best_cpu, time.process_time() - c)
        mvox = prob.size / 1e6
        rows.append([when, name, f"{best_wall:.2f}", f"{mvox / best_wall:.1f}",
                     f"{mvox / best_cpu:.1f}"])
    return rows


if __name__ == "__main__":
    main()
