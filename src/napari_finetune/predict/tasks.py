"""The worker side of :mod:`napari_finetune.predict.distributed`: one region per task.

A task carries a :class:`RegionTask` (paths, the job's spec: a few hundred
bytes) and a region (with a time point, in a time series); the model never travels
with it. Each worker process
loads the checkpoint at its first task and keeps it, keyed by path, mtime,
size, trust and device (one model and one job at a time per process: a new
one replaces them), so a worker loads a model once per job, not once per task.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.arrays import ArrayTarget, AxisTaken, WritableVolume
from napari_finetune.objects.blockwise import LabelledBlock, label_block
from napari_finetune.objects.roles import ChannelRole
from napari_finetune.predict.job import (
    JobSpec,
    block_record_path,
    labels_array_path,
    mark_done,
    mark_final,
    probability_path,
    provisional_path,
)
from napari_finetune.predict.volume import MaskAndProbability, write_probs

if TYPE_CHECKING:  # torch is imported at the first task, not with this module
    import torch

    from napari_finetune.predict.regions import RegionPredictor


@dataclass(frozen=True)
class RegionTask:
    """What a worker needs for any region of one job (small: sent with every task).

    Attributes
    ----------
    spec : JobSpec
        The job (checkpoint path and version, shapes, halo, range, names).
    trust : tuple of str
        Model factories trusted beyond the allow-list (``--trust-factory``).
    store : str
        The image group, as the workers see it.
    folder : str
        The job folder (labels arrays and done markers).
    device : str
        ``PredictConfig.device``, resolved on each worker.
    torch_threads : int or None
        Threads torch uses in each worker process; None leaves torch's default.
    """

    spec: JobSpec
    trust: tuple[str, ...]
    store: str
    folder: str
    device: str
    torch_threads: int | None


_LOCK = threading.Lock()  # a worker may run several task threads
# One model and one job's predictor per process at a time: a new one replaces them.
_MODELS: dict[tuple, torch.nn.Module] = {}
_PREDICTORS: dict[tuple, RegionPredictor] = {}
_LOADS: Counter = Counter()


def _model(task: RegionTask, device: str) -> torch.nn.Module:
    """The checkpoint's model on ``device``, loaded at this process's first task (caller
    holds the lock)."""
    from napari_finetune.model.checkpoint import load_checkpoint

    spec = task.spec
    key = (spec.checkpoint, spec.checkpoint_mtime_ns, spec.checkpoint_size, task.trust, device)
    if key not in _MODELS:
        _MODELS.clear()
        if task.torch_threads:
            import torch

            torch.set_num_threads(task.torch_threads)
        # The public path, not napari_finetune.loading, which sits above the predictor.
        model = load_checkpoint(spec.checkpoint, device=device, trust=list(task.trust)).model
        _MODELS[key] = model.eval()
        _LOADS[(spec.checkpoint, spec.checkpoint_mtime_ns)] += 1
    return _MODELS[key]


def _predictor(task: RegionTask, time: int | None) -> RegionPredictor:
    """This process's RegionPredictor for ``task``'s job at time point ``time`` (None:
    the image has no time axis)."""
    from napari_finetune.devices import model_in_channels, resolve_device
    from napari_finetune.io.volume import open_volume
    from napari_finetune.predict.regions import RegionPredictor

    spec = task.spec
    key = (spec, task.trust, task.store, task.device, time)
    with _LOCK:
        if key not in _PREDICTORS:
            # One job at a time: its time points' predictors stay, another job's go.
            for old in [k for k in _PREDICTORS if k[:4] != key[:4]]:
                del _PREDICTORS[old]
            device = resolve_device(task.device)
            model = _model(task, device)
            # The channels the client chose, as the client chose them (same call).
            image = open_volume(task.store, keep_axes=True).input.for_model(
                model_in_channels(model), spec.channel)
            if time is not None:
                image = image.at_time(time)
            ranges = list(spec.ranges) or [(spec.low, spec.high)]
            _PREDICTORS[key] = RegionPredictor(model, image, spec.low, spec.high, spec.halo,
                                               device, ranges=ranges)
        return _PREDICTORS[key]


def model_loads() -> dict[str, int]:
    """How many times this process loaded each checkpoint (``path@mtime_ns``: count)."""
    with _LOCK:
        return {f"{path}@{mtime}": n for (path, mtime), n in _LOADS.items()}


def predict_region(task: RegionTask, index: int, core: tuple[slice, ...],
                   time: int | None = None) -> tuple[int, int]:
    """Compute region ``index`` (its spatial ``core`` slices, at time point ``time`` of a
    time series), write it, then mark it done.

    Returns (index, this worker's process id).
    """
    import dask
    import zarr

    predictor = _predictor(task, time)
    # The image is a dask array: read it here, not as new tasks on the cluster
    # this task runs on (a one-thread worker would wait on itself).
    with dask.config.set(scheduler="synchronous"):
        probs = predictor(core)
    folder = Path(task.folder)
    targets: list[ArrayTarget] = [
        at_time(zarr.open_array(str(labels_array_path(folder, name)), mode="r+"), time)
        for name in task.spec.names
    ]
    for mask, _, _ in task.spec.instances:  # its probability too, for the objects
        at = task.spec.names.index(mask)
        prob = zarr.open_array(str(probability_path(folder, mask)), mode="r+")
        targets[at] = MaskAndProbability(targets[at], at_time(prob, time))
    write_probs(targets, core, probs)
    mark_done(folder, index)  # after the chunks: a marked region is always complete
    return index, os.getpid()


def at_time(array: WritableVolume, time: int | None) -> WritableVolume:
    """``array`` at time point ``time`` (a view read and written there); itself for None."""
    return array if time is None else AxisTaken(array, 0, time)


@dataclass(frozen=True)
class ObjectsTask:
    """What a worker needs to label or relabel any block of one objects image.

    Attributes
    ----------
    folder : str
        The job folder.
    mask, name : str
        The mask image whose channel's probability is read, and the objects
        image written.
    role : ChannelRole
        The channel's role (its threshold, seeds...; ``min_size`` is applied by
        the client to whole objects).
    halo : tuple of int
        Context read around each block.
    voxel_size : tuple of float or None
        The volume's voxel size: the objects' distances in physical units
        (:func:`~napari_finetune.objects.blockwise_instances`); None: in voxels.
    """

    folder: str
    mask: str
    name: str
    role: ChannelRole
    halo: tuple[int, ...]
    voxel_size: tuple[float, ...] | None = None


def label_object_block(task: ObjectsTask, block: int, core: tuple[slice, ...],
                       *after: object, time: int | None = None) -> tuple[int, int]:
    """Label block ``block`` (its spatial ``core``, at time point ``time`` of a time
    series) in its own ids; write them and its record.

    ``after`` are the regions whose probabilities the block reads (futures on
    the cluster: the scheduler runs this once they are written). Reads the
    core plus halo only. The record (ids, voxels per id, face slabs) is written
    last, atomically: a block with a record is complete. Returns (block,
    process id).
    """
    import zarr

    folder = Path(task.folder)
    prob = at_time(zarr.open_array(str(probability_path(folder, task.mask)), mode="r"), time)
    labelled = label_block(prob, task.role, core, task.halo, task.voxel_size)
    provisional = at_time(
        zarr.open_array(str(provisional_path(folder, task.name)), mode="r+"), time)
    provisional[core] = labelled.core_ids
    _write_record(block_record_path(folder, task.name, block), labelled)
    return block, os.getpid()


def _write_record(path: Path, labelled: LabelledBlock) -> None:
    from napari_finetune.model.atomic_write import write_atomically

    slabs = {f"lower{axis}": slab for axis, slab in labelled.lower.items()}
    slabs.update({f"upper{axis}": slab for axis, slab in labelled.upper.items()})
    # A reader sees the whole record or none; a killed task's temporary is
    # removed by the next write of the same record.
    write_atomically(
        path,
        # numpy's stub cannot tell that the ** keys (lower0, upper2, ...) never fill
        # savez's allow_pickle keyword.
        lambda handle: np.savez(
            handle, n=np.int64(labelled.n), sizes=labelled.sizes, **slabs  # type: ignore[arg-type]
        ),
    )


def read_block_record(path: Path, ndim: int) -> LabelledBlock:
    """A block's record as written by :func:`label_object_block` (no core ids)."""
    with np.load(path) as record:
        return LabelledBlock(
            int(record["n"]), record["sizes"],
            {a: record[f"lower{a}"] for a in range(ndim) if f"lower{a}" in record},
            {a: record[f"upper{a}"] for a in range(ndim) if f"upper{a}" in record},
            np.empty(0, np.uint32),
        )


def relabel_object_block(task: ObjectsTask, block: int, core: tuple[slice, ...],
                         lut: np.ndarray, time: int | None = None) -> tuple[int, int]:
    """Write block ``block``'s final ids (at time point ``time`` of a time series):
    ``lut[local id]`` (``lut[0]`` is 0), then mark it.

    Reads the provisional ids, never the labels it writes, so a rerun of a
    killed task writes the same. Returns (block, process id).
    """
    import zarr

    folder = Path(task.folder)
    provisional = at_time(
        zarr.open_array(str(provisional_path(folder, task.name)), mode="r"), time)
    local = np.asarray(provisional[core])
    out = at_time(zarr.open_array(str(labels_array_path(folder, task.name)), mode="r+"), time)
    out[core] = lut[local]
    mark_final(folder, task.name, block)
    return block, os.getpid()
