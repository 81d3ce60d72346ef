"""Blockwise instances on the sample: Mvoxel/s on one process, and whether it equals one piece.

Predicts the target-domain sample (64x256x256) with the sample checkpoint in
memory, then for each channel with a role runs
:func:`napari_finetune.objects.blockwise_instances` (numpy in, numpy out, so
the figure is the instance step, not zarr) at a few block shapes, and counts
the one-piece objects (:func:`napari_finetune.objects.instances_of`) that no
blockwise object matches one-to-one.

Then the same step through zarr arrays on disk (what ``predict --instances``
does): one process (:func:`blockwise_instances`, zarr in and out) against two
dask.distributed worker processes (a labelling task per block, the join on the
client, a relabelling task per block:
:func:`napari_finetune.predict.distributed.submit_labelling` and
:func:`~napari_finetune.predict.distributed.relabel_blocks`), the cluster
started before the clock, and whether both give the same objects.

Usage::

    python benchmarks/bench_blockwise_instances.py
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import zarr

from napari_finetune.config import PredictConfig
from napari_finetune.data.normalization import intensity_range
from napari_finetune.io.omezarr import open_volume
from napari_finetune.loading import load_checkpoint
from napari_finetune.objects import (
    ChannelRole,
    blockwise_instances,
    instances_of,
    roles_from_metadata,
)
from napari_finetune.objects.blockwise import block_cores, default_halo
from napari_finetune.predict import predict_volume
from napari_finetune.predict.job import labels_array_path, prepare_objects, probability_path
from napari_finetune.predict.tasks import ObjectsTask
from napari_finetune.samples.store import ensure_sample
from napari_finetune.samples.synthetic_em import sample_checkpoint_path

BLOCKS = [(64, 128, 128), (32, 64, 64)]


def unmatched(whole: np.ndarray, blocks: np.ndarray) -> int:
    """One-piece objects whose voxels are not exactly one blockwise object's."""
    a, b = whole.ravel().astype(np.int64), blocks.ravel().astype(np.int64)
    pairs = np.unique(np.stack([a, b]), axis=1)
    pairs = pairs[:, (pairs[0] > 0) | (pairs[1] > 0)]
    # An object is matched when it meets one blockwise id (not 0) that meets only it.
    per_a = np.bincount(pairs[0], minlength=int(a.max()) + 1)
    per_b = np.bincount(pairs[1], minlength=int(b.max()) + 1)
    bad = (pairs[0] > 0) & ((per_a[pairs[0]] != 1) | (pairs[1] == 0) | (per_b[pairs[1]] != 1))
    return int(np.unique(pairs[0][bad]).size)


def main() -> None:
    store = ensure_sample("target")
    ckpt = load_checkpoint(sample_checkpoint_path())
    image = open_volume(store).data
    probs = np.asarray(predict_volume(ckpt.model, image,
                                      intensity_range(image, ckpt.normalization),
                                      PredictConfig(device="cpu")))
    roles = roles_from_metadata(ckpt.metadata, ckpt.channel_names)
    whole = instances_of(probs, roles, ckpt.channel_names)
    print(f"volume {probs.shape[1:]}  ({probs[0].size / 1e6:.1f} Mvoxel)")
    for c, channel in enumerate(ckpt.channel_names):
        role = roles[channel]
        if not role.role:
            continue
        for block in BLOCKS:
            out = np.zeros(probs.shape[1:], np.uint32)
            t0, c0 = time.perf_counter(), time.process_time()
            n = blockwise_instances(probs[c], role, block, out)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            size = probs[c].size / 1e6
            print(f"{channel} ({role.role}) block {block}: {n} objects (one piece "
                  f"{int(whole[channel].max())}), {size / wall:.1f} Mvoxel/s wall, "
                  f"{size / cpu:.1f} Mvoxel/s cpu; one-piece objects not matched one-to-one: "
                  f"{unmatched(whole[channel], out)}")
    on_two_workers(probs, roles, list(ckpt.channel_names))


def job_folder(where: Path, prob: np.ndarray, role: ChannelRole,
               block: tuple[int, ...]) -> ObjectsTask:
    """A job folder as ``predict --instances --workers`` lays it out, its probability
    written, for one objects image."""
    folder = where / uuid.uuid4().hex[:8]
    name = "objects"
    prepare_objects(folder, "mask", name, prob.shape, block)
    zarr.open_array(str(probability_path(folder, "mask")), mode="r+")[...] = prob
    zarr.open_array(str(labels_array_path(folder, name)), mode="w", zarr_format=3,
                    shape=prob.shape, chunks=block, dtype=np.uint32)
    return ObjectsTask(str(folder), "mask", name, role, default_halo(role, prob.ndim))


def on_two_workers(probs: np.ndarray, roles: dict[str, ChannelRole],
                   channels: list[str]) -> None:
    """One process against 2 dask workers, both through zarr arrays on disk."""
    from distributed import Client, wait

    from napari_finetune.predict.distributed import (
        local_cluster,
        relabel_blocks,
        submit_labelling,
    )

    cluster, _ = local_cluster(2, dashboard_address=":0")
    with cluster, Client(cluster) as client, tempfile.TemporaryDirectory() as tmp:
        client.run(np.zeros, 1)  # workers up before the clock
        for c, channel in enumerate(channels):
            role = roles[channel]
            if not role.role:
                continue
            for block in BLOCKS:
                size = probs[c].size / 1e6
                one = job_folder(Path(tmp), probs[c], role, block)
                prob = zarr.open_array(str(probability_path(Path(one.folder), "mask")))
                out = zarr.open_array(str(labels_array_path(Path(one.folder), one.name)),
                                      mode="r+")
                t0 = time.perf_counter()
                n_one = blockwise_instances(prob, role, block, out)
                wall_one = time.perf_counter() - t0
                two = job_folder(Path(tmp), probs[c], role, block)
                blocks = list(block_cores(probs[c].shape, block))
                t0 = time.perf_counter()
                wait(submit_labelling(client, two, blocks, uuid.uuid4().hex[:8]))
                n_two, _ = relabel_blocks(client, two, blocks, probs[c].shape,
                                          uuid.uuid4().hex[:8])
                wall_two = time.perf_counter() - t0
                got = zarr.open_array(str(labels_array_path(Path(two.folder), two.name)))[...]
                print(f"{channel} ({role.role}) block {block}, zarr: one process "
                      f"{size / wall_one:.1f} Mvoxel/s ({n_one} objects), 2 dask workers "
                      f"{size / wall_two:.1f} Mvoxel/s ({n_two} objects); "
                      f"same objects: {np.array_equal(got, out[...])}")


if __name__ == "__main__":
    main()
