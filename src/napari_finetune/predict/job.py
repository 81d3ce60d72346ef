"""A resumable prediction job kept in the store: its labels being written, and done markers.

A prediction split into many independent region tasks (on a cluster,
:mod:`napari_finetune.predict.distributed`) keeps its state in one hidden
folder of the store, ``.napari-finetune-job-<name prefix>``::

    job.json              what the job computes (checkpoint, shapes, halo, range...)
    labels/<name>/        the labels images, every level, NGFF metadata written
    done/<region index>   one empty file per region whose chunks are all written

With instances (``predict --instances``), per objects image ``labels/<objects name>``
(uint32, staged like the masks) and its phases' state::

    probability/<mask name>        the channel's probability, written with its mask
    provisional/<objects name>     each block's own ids 1..n (level-0 shape)
    blocks/<objects name>/<b>.npz  block b labelled: n, voxels per id, its face slabs
    final/<objects name>/<b>       block b's final ids written into the labels image

A time series' regions and blocks are numbered time point after time point (region
``t * regions + r``), and its labels, probability and provisional ids have the time
axis first.

Each marker (``.npz`` or empty file) is written atomically after what it
records, and every phase is idempotent (the final ids are read from the
provisional ones, never from themselves), so a killed job resumed finishes
with the same objects.

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
from typing import Any

import numpy as np

from napari_finetune.model.atomic_write import write_atomically

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
    instances : tuple of (str, str, str)
        Per channel with an instance role: (its mask's name, objects image
        name, the role as JSON).
    object_block : tuple of int
        The core block of the instance labelling (the output chunks).
    axes : str
        The model input's axes (:class:`~napari_finetune.arrays.AxesImage`: ``"zyx"``,
        ``"czyx"``, ``"tzyx"``...): a ``t`` gives the labels a time axis, one task per
        time point and region.
    channel : int or None
        The store's channel a single-channel model reads (``--channel``); None: the
        channels the model takes, all of them.
    ranges : tuple of (float, float)
        One normalisation range per input channel (one for a single channel).
    time_points : int
        Time points predicted (1 without a time axis).
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
    instances: tuple[tuple[str, str, str], ...] = ()
    object_block: tuple[int, ...] = ()
    axes: str = ""
    channel: int | None = None
    ranges: tuple[tuple[float, float], ...] = ()
    time_points: int = 1

    def to_json(self) -> str:
        """The spec as JSON text (tuples become lists)."""
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def has_time(self) -> bool:
        """Whether the labels have a time axis (first), one time point per task."""
        return "t" in self.axes

    @property
    def labels_shape(self) -> tuple[int, ...]:
        """The shape of the labels arrays: ``shape``, after the time points if any."""
        return (self.time_points,) * self.has_time + tuple(self.shape)

    def labels_chunks(self, chunks: tuple[int, ...]) -> tuple[int, ...]:
        """The labels arrays' chunks of spatial ``chunks``: one time point per chunk."""
        return (1,) * self.has_time + tuple(chunks)


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
        Level-0 spatial chunks of the labels images (a fresh job creates them; a time
        series' have one time point each).
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
    # Without classes the arrays get no colours or properties.
    metadata: list[tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]] = [
        prediction_metadata(*c) for c in classes
    ] or [(None, None)] * len(spec.names)
    shape, label_chunks = spec.labels_shape, spec.labels_chunks(chunks)
    for name, (colors, properties) in zip(spec.names, metadata, strict=True):
        create_labels_array(store, name, shape, np.uint8, label_chunks, colors, properties,
                            staging=folder)
    (folder / "done").mkdir()
    for mask, name, _ in spec.instances:
        create_labels_array(store, name, shape, np.uint32, label_chunks, staging=folder)
        prepare_objects(folder, mask, name, shape, label_chunks)
    # Written last: a folder without it (killed while being made) is never resumed.
    _atomic_write(folder / "job.json", spec.to_json())
    return folder, False


def _resumable(folder: Path, spec: JobSpec) -> bool:
    try:
        found = (folder / "job.json").read_text()
    except OSError:
        return False
    names = [*spec.names, *(name for _, name, _ in spec.instances)]
    images = all((folder / "labels" / name).is_dir() for name in names)
    return found == spec.to_json() and images and (folder / "done").is_dir()


def labels_array_path(folder: Path, name: str) -> Path:
    """Level 0 of the labels image ``name`` inside a job folder."""
    return folder / "labels" / name / "s0"


def prepare_objects(folder: Path, mask: str, name: str, shape: tuple[int, ...],
                    chunks: tuple[int, ...]) -> None:
    """The empty probability (of ``mask``'s channel) and provisional ids of the objects
    image ``name``, and its marker folders (the labels image is made apart)."""
    import zarr

    for array, dtype in ((probability_path(folder, mask), np.float32),
                         (provisional_path(folder, name), np.uint32)):
        zarr.open_array(str(array), mode="w", zarr_format=3, shape=shape, chunks=chunks,
                        dtype=dtype)
    (folder / "blocks" / name).mkdir(parents=True)
    (folder / "final" / name).mkdir(parents=True)


def probability_path(folder: Path, mask: str) -> Path:
    """The probability of the mask image ``mask``'s channel in a job folder (instances)."""
    return folder / "probability" / mask


def provisional_path(folder: Path, name: str) -> Path:
    """The block-local ids of the objects image ``name`` inside a job folder."""
    return folder / "provisional" / name


def block_record_path(folder: Path, name: str, block: int) -> Path:
    """Block ``block``'s labelling record of the objects image ``name``."""
    return folder / "blocks" / name / f"{block}.npz"


def mark_final(folder: Path, name: str, block: int) -> None:
    """Record that block ``block`` of ``name`` has its final ids written."""
    _atomic_write(folder / "final" / name / str(block), "")


def final_blocks(folder: Path, name: str) -> set[int]:
    """Blocks of the objects image ``name`` whose final ids are written."""
    return _indices(folder / "final" / name)


def labelled_blocks(folder: Path, name: str) -> set[int]:
    """Blocks of the objects image ``name`` labelled (their record written)."""
    where = folder / "blocks" / name
    if not where.is_dir():
        return set()
    return {int(p.stem) for p in where.glob("*.npz") if p.stem.isdigit()}


def _indices(where: Path) -> set[int]:
    if not where.is_dir():
        return set()
    return {int(p.name) for p in where.iterdir() if p.name.isdigit()}


def _atomic_write(path: Path, text: str) -> None:
    """A reader sees the whole file or none; a killed writer's temporary goes at the retry."""
    write_atomically(path, lambda handle: handle.write(text.encode()))


def mark_done(folder: Path, index: int) -> None:
    """Record that region ``index`` is written (call only after its chunks are)."""
    _atomic_write(folder / "done" / str(index), "")


def done_regions(folder: Path) -> set[int]:
    """Indices of the regions recorded as written."""
    return _indices(folder / "done")


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
