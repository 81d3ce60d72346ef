"""Predict a whole OME-Zarr store on dask.distributed: one task per output region.

The client (:func:`predict_on_cluster`) cuts level 0 into regions that are a
whole number of the labels' output chunks
(:func:`~napari_finetune.predict.tiling.chunk_aligned_block`), so no two
tasks ever write the same chunk and the workers need no lock. Each task
(:func:`~napari_finetune.predict.tasks.predict_region`) reads its region plus
halo lazily from the store, predicts it with
:class:`~napari_finetune.predict.regions.RegionPredictor`
(the in-process path's code, OOM step-down included), writes the uint8
decisions straight into the job's labels arrays, and only then marks the
region done (:mod:`napari_finetune.predict.job`). A rerun skips marked
regions; a worker that dies mid-task has written no marker, and the scheduler
runs its task again elsewhere (same input, same code: the same result).

The model never travels with a task: a task carries the checkpoint's path and
version, and each worker process loads it once and keeps it
(:mod:`napari_finetune.predict.tasks`). Workers therefore need the
store and the checkpoint at the same paths (a shared file system on a cluster).

With ``instances`` (``predict --instances``), each channel with a role also
gets ``labels/objects-<channel>`` as the in-process path writes it
(:func:`~napari_finetune.objects.blockwise_instances`, block = output chunk):
the regions keep that channel's probability in the job folder; one task per
block labels it in its own ids as soon as the regions it reads (core plus
halo) are written; the client joins the blocks' records (offsets, face links,
``min_size`` on whole objects: :class:`~napari_finetune.objects.blockwise.FaceJoiner`,
cheap: faces only); and one task per block writes its final ids 1..N. Every
phase keeps markers in the job folder (:mod:`napari_finetune.predict.job`), so
a killed run resumed finishes with the same objects.

A store with channels is read as the model takes them (all of them, or the one
``--channel`` picks) and normalised per channel; a time series gets one task per time
point and region, one labelling per time point and block, and objects numbered per
time point, as the in-process path writes them.

When every region is done, the client fills the smaller levels and swaps the
labels images into the store (:func:`~napari_finetune.predict.job.finish_job`):
until then nothing new is listed in ``labels``.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.config import PredictConfig
from napari_finetune.objects import ChannelRole
from napari_finetune.objects.blockwise import FaceJoiner, block_cores, contextual, default_halo
from napari_finetune.predict.job import (
    JobSpec,
    block_record_path,
    checkpoint_version,
    done_regions,
    final_blocks,
    finish_job,
    labelled_blocks,
    open_job,
)
from napari_finetune.predict.store import instance_roles, objects_names
from napari_finetune.predict.tasks import (
    ObjectsTask,
    RegionTask,
    label_object_block,
    predict_region,
    read_block_record,
    relabel_object_block,
)
from napari_finetune.predict.tiling import chunk_aligned_block, region_grid
from napari_finetune.predict.volume import Progress, spatial_config

if TYPE_CHECKING:
    from distributed import Client, Future, LocalCluster

MISSING_DISTRIBUTED = (
    "--workers and --scheduler need dask.distributed: pip install 'napari-finetune[distributed]'"
)


class DistributedUnavailableError(ImportError):
    """dask.distributed is not installed; the message says how to get it."""


def require_distributed() -> None:
    """Raise :class:`DistributedUnavailableError` (one line) when distributed is missing."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise DistributedUnavailableError(MISSING_DISTRIBUTED) from None


@dataclass
class ClusterRun:
    """What :func:`predict_on_cluster` did.

    Attributes
    ----------
    names : list of str
        Labels images written (``labels/<name>``).
    total : int
        Region tasks: regions in the volume, times its time points.
    skipped : list of int
        Regions found done by an earlier run, not computed again.
    computed : list of (int, int)
        (region index, worker process id) of each region computed by this run.
    objects : dict of str to int
        Per objects image written (``--instances``), its number of objects (over all
        time points of a time series: each numbers its own from 1).
    blocks : dict of str to (int, int)
        Per objects image, the blocks this run labelled and relabelled (the
        others were done by an earlier run).
    """

    names: list[str]
    total: int
    skipped: list[int] = field(default_factory=list)
    computed: list[tuple[int, int]] = field(default_factory=list)
    objects: dict[str, int] = field(default_factory=dict)
    blocks: dict[str, tuple[int, int]] = field(default_factory=dict)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def local_cluster(workers: int, dashboard_address: str = ":8787") -> tuple[LocalCluster, int]:
    """A LocalCluster of ``workers`` processes (one task thread each) and the torch threads
    each should use, so that workers x threads <= this machine's cores.

    Raises ValueError for ``workers < 1``, :class:`DistributedUnavailableError`
    without dask.distributed.
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}.")
    require_distributed()
    from distributed import LocalCluster

    threads = max(1, usable_cores() // workers)
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        silence_logs=logging.ERROR,
        dashboard_address=dashboard_address,
    )
    return cluster, threads


def plan_regions(
    shape: Sequence[int], block: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[slice, ...]]]:
    """(output chunks, region shape, regions) for a level 0 of ``shape`` and ``block``.

    The chunks are those the labels arrays get (the block clipped to the
    volume, split by :func:`~napari_finetune.io.pyramid.bounded_chunks` when
    huge); each region is a whole number of them, so each chunk lies in
    exactly one region.
    """
    from napari_finetune.io.pyramid import bounded_chunks

    clipped = tuple(min(int(b), int(s)) for b, s in zip(block, shape, strict=True))
    chunks = bounded_chunks(clipped)
    region_shape = chunk_aligned_block(clipped, chunks)
    return chunks, region_shape, region_grid(tuple(shape), region_shape)


def predict_on_cluster(
    checkpoint: str | os.PathLike,
    store_path: str | os.PathLike,
    client: Client,
    name_prefix: str = "prediction",
    config: PredictConfig | None = None,
    trust: Sequence[str] = (),
    torch_threads: int | None = None,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    instances: Mapping[str, ChannelRole] | None = None,
    voxel_size: Sequence[float] | None = None,
    channel: int | None = None,
) -> ClusterRun:
    """Predict an OME-Zarr store region by region on the cluster of ``client``.

    Writes what :func:`~napari_finetune.predict.store.predict_to_omezarr`
    writes (one uint8 labels image per channel, every level), and resumes a
    job that a killed run of the same command left (module doc).

    Parameters
    ----------
    checkpoint : path-like
        The model file; workers load it from this path.
    store_path : path-like
        The OME-Zarr store; its level 0 is predicted.
    client : distributed.Client
        Connected to the scheduler whose workers do the work.
    name_prefix : str
        Label names are ``<name_prefix>-<channel>``.
    config : PredictConfig, optional
        Block (= output chunk; regions are whole chunks), halo and device.
    trust : sequence of str
        Factories trusted beyond the allow-list.
    torch_threads : int, optional
        torch threads per worker process (None: leave the workers' setting).
    progress : callable, optional
        ``progress(done, total)`` as regions complete (skipped ones count as done).
    log : callable, optional
        Receives a line when an earlier job is resumed.
    instances : mapping of channel name to ChannelRole, optional
        Channels with a role also get ``labels/objects-<channel>`` (module doc),
        as :func:`~napari_finetune.predict.store.predict_to_omezarr` writes them.
    voxel_size : sequence of float, optional
        The volume's voxel size for the objects' distances; default the store's scale.
    channel : int, optional
        The store's channel a single-channel model predicts, for a store with several
        (:meth:`~napari_finetune.arrays.AxesImage.for_model`); a model with as many
        input channels as the store takes them all.

    A store with time points gets one task per time point and region, and its objects
    one labelling per time point and block, numbered per time point, as
    :func:`~napari_finetune.predict.store.predict_to_omezarr` numbers them.

    Returns a :class:`ClusterRun`. A task's error (e.g. out of memory at the
    smallest block) is raised here, after cancelling the other tasks.
    """
    require_distributed()
    from distributed import as_completed

    from napari_finetune.data.normalization import intensity_ranges
    from napari_finetune.devices import check_model_fits_image, model_in_channels
    from napari_finetune.io.volume import open_volume
    from napari_finetune.model.checkpoint import load_checkpoint

    path = Path(checkpoint).resolve()
    # The public path, not napari_finetune.loading, which sits above the predictor.
    ckpt = load_checkpoint(path, trust=list(trust))  # here: names, range, a clear error early
    volume = open_volume(Path(store_path), keep_axes=True)
    image = volume.input.for_model(model_in_channels(ckpt.model), channel)
    shape = image.spatial_shape
    check_model_fits_image(ckpt.model, shape)
    block, halo = spatial_config(config or PredictConfig(), len(shape))
    chunks, region_shape, regions = plan_regions(shape, block)
    ranges = tuple(intensity_ranges(image, ckpt.normalization))
    mtime, size = checkpoint_version(path)
    names = tuple(f"{name_prefix}-{channel}" for channel in ckpt.channel_names)
    roles = instance_roles(instances, ckpt.channel_names)
    object_names = objects_names(name_prefix, list(roles))
    entries = tuple((f"{name_prefix}-{channel}", name, json.dumps(asdict(role), sort_keys=True))
                    for (channel, role), name in zip(roles.items(), object_names, strict=True))
    spec = JobSpec(str(path), mtime, size, names, shape, region_shape, tuple(halo),
                   *ranges[0], entries, chunks if entries else (), axes=image.axes,
                   channel=channel, ranges=ranges, time_points=image.time_points)
    store = volume.path.resolve()  # workers elsewhere have another working directory
    classes = list(zip(ckpt.channel_names, ckpt.channel_colors, strict=True))
    folder, resumed = open_job(store, name_prefix, spec, chunks, classes)
    done = done_regions(folder)
    # Tasks are numbered time point after time point: task t * regions + r.
    times = list(range(image.time_points)) if image.has_time else [None]
    tasks = [(t, core) for t in times for core in regions]
    if resumed and log is not None:
        log(f"resuming: {len(done)} of {len(tasks)} regions already written, not recomputed")
    run = ClusterRun(list(names) + object_names, len(tasks), skipped=sorted(done))
    task = RegionTask(
        spec, tuple(trust), str(store), str(folder),
        (config or PredictConfig()).device, torch_threads,
    )
    token = uuid.uuid4().hex[:8]  # keys of this run only: a rerun never meets old results
    futures = {
        i: client.submit(predict_region, task, i, core, t, key=f"nf-region-{token}-{i}",
                         pure=False)
        for i, (t, core) in enumerate(tasks)
        if i not in done
    }
    # The objects' distances in the store's voxel size, as predict_to_omezarr measures them.
    spacing = tuple(voxel_size) if voxel_size is not None else volume.voxel_size
    objects = [ObjectsTask(str(folder), mask, name, roles[channel],
                           default_halo(roles[channel], len(shape), spacing), spacing)
               for (mask, name, _), channel in zip(entries, roles, strict=True)]
    blocks = list(block_cores(shape, chunks))
    total = len(tasks) + 2 * len(blocks) * len(times) * len(objects)
    counted = [len(done) + sum(len(labelled_blocks(folder, o.name)) + len(final_blocks(
        folder, o.name)) for o in objects)]

    def tick(_future: object = None) -> None:
        if _future is not None:
            counted[0] += 1
        if progress is not None:
            progress(counted[0], total)

    tick()
    labelling = []
    for o in objects:  # each block once the regions it reads (at its time point) are written
        for n, t in enumerate(times):
            labelling += submit_labelling(
                client, o, blocks, token,
                functools.partial(_regions_read, halo=o.halo, shape=shape,
                                  region_shape=region_shape, futures=futures,
                                  first=n * len(regions)),
                time=t, first=n * len(blocks),
            )
    try:
        for future in as_completed([*futures.values(), *labelling]):
            result = future.result()  # re-raises the task's error
            if str(future.key).startswith("nf-region-"):
                run.computed.append(result)
            tick(future)
        for o in objects:
            counts, relabelled = [], 0
            for n, t in enumerate(times):  # ids are numbered per time point
                count, done_now = relabel_blocks(client, o, blocks, shape, token, tick,
                                                 time=t, first=n * len(blocks))
                counts.append(count)
                relabelled += done_now
            run.objects[o.name] = sum(counts)
            run.blocks[o.name] = (sum(str(f.key).startswith(f"nf-label-{token}-{o.name}-")
                                      for f in labelling), relabelled)
    except BaseException:
        client.cancel([*futures.values(), *labelling])  # the markers stay
        raise
    finish_job(store, folder, names + tuple(object_names))
    return run


def _regions_read(core: tuple[slice, ...], halo: Sequence[int], shape: Sequence[int],
                  region_shape: Sequence[int], futures: Mapping[int, object],
                  first: int = 0) -> list[object]:
    """The futures of the regions (not yet done) that a block's core plus halo reads;
    ``first`` is the index of its time point's first region.

    One voxel more below: the boundary role may start its read one voxel lower
    (its coarse grid stays on the volume's even voxels).
    """
    per_axis = [range(max(0, c.start - h - 1) // r, (min(n, c.stop + h) - 1) // r + 1)
                for c, h, n, r in zip(core, halo, shape, region_shape, strict=True)]
    counts = [-(-n // r) for n, r in zip(shape, region_shape, strict=True)]
    wanted = (first + int(np.ravel_multi_index(i, counts))
              for i in itertools.product(*per_axis))
    return [futures[i] for i in wanted if i in futures]


def submit_labelling(
    client: Client, task: ObjectsTask, blocks: list[tuple[tuple[int, ...], tuple[slice, ...]]],
    token: str, after: Callable[[tuple[slice, ...]], list[object]] = lambda core: [],
    time: int | None = None, first: int = 0,
) -> list[Future]:
    """One labelling task per block of ``task``'s objects image not labelled yet.

    ``after(core)`` gives the futures the block must wait for (the regions it
    reads). Blocks are ``block_cores(shape, block)``, in its order; in a time
    series, those of time point ``time``, numbered from ``first``.
    """
    labelled = labelled_blocks(Path(task.folder), task.name)
    return [
        client.submit(label_object_block, task, first + b, core, *after(core), time=time,
                      key=f"nf-label-{token}-{task.name}-{first + b}", pure=False)
        for b, (_, core) in enumerate(blocks) if first + b not in labelled
    ]


def relabel_blocks(
    client: Client, task: ObjectsTask, blocks: list[tuple[tuple[int, ...], tuple[slice, ...]]],
    shape: tuple[int, ...], token: str, tick: Callable[[object], None] | None = None,
    time: int | None = None, first: int = 0,
) -> tuple[int, int]:
    """Join every labelled block's record on the client (every block must be labelled),
    then one task per block without a final marker writes its final ids. In a time
    series, the blocks of time point ``time``, numbered from ``first``: its own ids.

    Returns (objects N, blocks relabelled by this call). ``tick(future)`` after each.
    """
    from distributed import as_completed

    tables = join_blocks(task, blocks, shape, first)
    final = final_blocks(Path(task.folder), task.name)
    futures = [
        client.submit(relabel_object_block, task, first + b, core, tables[b], time,
                      key=f"nf-relabel-{token}-{task.name}-{first + b}", pure=False)
        for b, (_, core) in enumerate(blocks) if first + b not in final
    ]
    try:
        for future in as_completed(futures):
            future.result()
            if tick is not None:
                tick(future)
    except BaseException:
        client.cancel(futures)
        raise
    return int(max((t.max(initial=0) for t in tables), default=0)), len(futures)


def join_blocks(
    task: ObjectsTask, blocks: list[tuple[tuple[int, ...], tuple[slice, ...]]],
    shape: tuple[int, ...], first: int = 0,
) -> list[np.ndarray]:
    """Per block, its own ids 0..n -> final ids 1..N (uint32; 0 stays 0), from the blocks'
    records alone (every block labelled), as the in-process join gives them; the
    records are those numbered from ``first`` (a time point's, in a time series).

    Reads one record at a time; holds what :class:`FaceJoiner` holds (the faces
    waiting for their upper block, the links, one size per id), never a block.
    """
    folder = Path(task.folder)
    joiner = FaceJoiner(shape, contextual(task.role))
    offsets, counts = [], []
    for b, (index, core) in enumerate(blocks):  # C order, as the in-process join
        record = read_block_record(block_record_path(folder, task.name, first + b),
                                   len(shape))
        offsets.append(joiner.add(index, core, record))
        counts.append(record.n)
    lut = joiner.final_ids(task.role.min_size)
    tables = []
    for offset, n in zip(offsets, counts, strict=True):
        # Its own slice of the volume's table: what one task needs, not the whole.
        own = lut[offset:offset + n + 1].copy()
        own[0] = 0
        tables.append(own)
    return tables
