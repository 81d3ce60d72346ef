"""A resumable prediction job kept in the store: its labels being written, and done markers.

A prediction split into many independent region tasks (on a cluster,
:mod:`napari_finetune.predict_distributed`) keeps its state in one hidden
folder of the store, ``.napari-finetune-job-<name prefix>``::

    job.json              what the job computes (checkpoint, shapes, halo, range...)
    labels/<name>/        the labels images, every level, NGFF metadata written
    done/<region index>   one empty file per region whose chunks are all written

A region's marker is written (atomically: a temporary name renamed) only after
its chunks are, so a region without a marker is computed again, and a region
with one never is. A rerun of the same command finds the folder, checks that
``job.json`` matches (anything else, e.g. a new checkpoint, starts afresh) and
goes on with the regions not marked. Nothing in it is listed in the store's
``labels``: :func:`finish_job` fills the smaller levels and swaps every image
in at once through :func:`~napari_finetune.io.staging.staged_replace` (the
path single-process predictions take), then removes the folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

JOB_PREFIX = ".napari-finetune-job-"


@dataclass(frozen=True)
class JobSpec:
    """What a job computes; a rerun resumes only when all of it is the same.

    Attributes
    ----------
    checkpoint : str
        Absolute path of the model file (workers load it from there).
    checkpoint_mtime_ns, checkpoint_size : int
        The file's version: a re-saved model is a new job.
    names : tuple of str
        Labels images written, one per output channel.
    shape : tuple of int
        Level-0 spatial shape.
    region_shape : tuple of int
        Core of one region: a whole number of output chunks per axis.
    halo : tuple of int
        Context read around each region.
    low, high : float
        Normalisation range, found once by the client.
    """

    checkpoint: str
    checkpoint_mtime_ns: int
    checkpoint_size: int
    names: tuple[str, ...]
    shape: tuple[int, ...]
    region_shape: tuple[int, ...]
    halo: tuple[int, ...]
    low: float
    high: float

    def to_json(self) -> str:
        """The spec as JSON text (tuples become lists)."""
        return json.dumps(asdict(self), sort_keys=True)


def job_dir(store: Path, name_prefix: str) -> Path:
    """The job folder of predictions named ``<name_prefix>-*`` in the image group ``store``."""
    return Path(store) / f"{JOB_PREFIX}{name_prefix}"


def checkpoint_version(path: Path) -> tuple[int, int]:
    """(mtime_ns, size) of a checkpoint file (or folder: its own entry)."""
    stat = Path(path).stat()
    return stat.st_mtime_ns, stat.st_size


def open_job(
    store: Path, name_prefix: str, spec: JobSpec, chunks: tuple[int, ...],
    classes: Sequence[tuple[str, str]] = (),
) -> tuple[Path, bool]:
    """The job folder for ``spec``, resumed when a matching one is there, else made afresh.

    Parameters
    ----------
    store : Path
        The image group (:attr:`Volume.path <napari_finetune.io.volume.Volume.path>`).
    name_prefix : str
        Names the folder, so two predictions of different names do not meet.
    spec : JobSpec
        What the job computes.
    chunks : tuple of int
        Level-0 chunks of the labels images (a fresh job creates them).
    classes : sequence of (channel, colour)
        Per labels image, the class name and colour its value 1 gets in the
        NGFF metadata (none: no colours).

    Returns
    -------
    (Path, bool)
        The folder, and whether an earlier job's done regions were kept.
    """
    from napari_finetune.io.labels import create_labels_array, prediction_metadata

    folder = job_dir(store, name_prefix)
    if _resumable(folder, spec):
        return folder, True
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    metadata = [prediction_metadata(*c) for c in classes] or [(None, None)] * len(spec.names)
    for name, (colors, properties) in zip(spec.names, metadata, strict=True):
        create_labels_array(store, name, spec.shape, np.uint8, chunks, colors, properties,
                            staging=folder)
    (folder / "done").mkdir()
    # Written last: a folder without it (killed while being made) is never resumed.
    _atomic_write(folder / "job.json", spec.to_json())
    return folder, False


def _resumable(folder: Path, spec: JobSpec) -> bool:
    try:
        found = (folder / "job.json").read_text()
    except OSError:
        return False
    images = all((folder / "labels" / name).is_dir() for name in spec.names)
    return found == spec.to_json() and images and (folder / "done").is_dir()


def labels_array_path(folder: Path, name: str) -> Path:
    """Level 0 of the labels image ``name`` inside a job folder."""
    return folder / "labels" / name / "s0"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader sees the whole file or none


def mark_done(folder: Path, index: int) -> None:
    """Record that region ``index`` is written (call only after its chunks are)."""
    _atomic_write(folder / "done" / str(index), "")


def done_regions(folder: Path) -> set[int]:
    """Indices of the regions recorded as written."""
    done = folder / "done"
    if not done.is_dir():
        return set()
    return {int(p.name) for p in done.iterdir() if p.name.isdigit()}


def finish_job(store: Path, folder: Path, names: tuple[str, ...]) -> None:
    """Fill the smaller levels, swap every labels image into the store, remove the folder.

    The swap is :func:`~napari_finetune.io.staging.staged_replace`'s: a reader
    sees each old image or the complete new one, never a half-written one.
    """
    import zarr

    from napari_finetune.io.pyramid import fill_pyramid
    from napari_finetune.io.staging import staged_replace

    for name in names:  # idempotent: a run killed here fills them again
        fill_pyramid(zarr.open_group(str(folder / "labels" / name), mode="r+"))
    with ExitStack() as stack:  # entered in order, swapped in only after the body
        for name in names:
            staging = stack.enter_context(staged_replace(store, name))
            (staging / "labels").mkdir(parents=True)
            os.rename(folder / "labels" / name, staging / "labels" / name)
    shutil.rmtree(folder, ignore_errors=True)

