"""Blockwise instances on the sample: Mvoxel/s on one process, and whether it equals one piece.

Predicts the target-domain sample (64x256x256) with the sample checkpoint in
memory, then for each channel with a role runs
:func:`napari_finetune.objects.blockwise_instances` (numpy in, numpy out, so
the figure is the instance step, not zarr) at a few block shapes, and counts
the one-piece objects (:func:`napari_finetune.objects.instances_of`) that no
blockwise object matches one-to-one.

Usage::

    python benchmarks/bench_blockwise_instances.py
"""

from __future__ import annotations

import time

import numpy as np

from napari_finetune.config import PredictConfig
from napari_finetune.data.normalization import intensity_range
from napari_finetune.io.omezarr import open_volume
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.objects import blockwise_instances, instances_of, roles_from_metadata
from napari_finetune.predict import predict_volume
from napari_finetune.samples.synthetic_em import ensure_sample, sample_checkpoint_path

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


if __name__ == "__main__":
    main()
