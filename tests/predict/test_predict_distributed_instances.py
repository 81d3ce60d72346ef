"""``predict --instances --workers N``: objects labelled block by block on dask.distributed.

Real LocalClusters (started by the command line), real OME-Zarr stores with a
pyramid, a real subprocess SIGKILLed mid-run and run again. The reference is
the in-process ``predict --instances`` of the same store and blocks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from napari_finetune.io.omezarr import list_labels, open_volume
from napari_finetune.io.staging import STAGING_PREFIX
from napari_finetune.objects import ChannelRole
from napari_finetune.predict.job import job_dir, labelled_blocks
from ngff_stores import ngff_store
from ngff_validation import assert_valid_ngff
from test_cli import run_cli
from test_cli_instances import BLOCK, OBJECTS, same_up_to_relabelling, textured  # noqa: F401

MASKS = ["prediction-membrane", "prediction-mitochondria"]
BLOCKS = 2 * 3 * 3  # (16, 48, 48) in blocks of (8, 16, 16)


def _labels(store: Path, name: str) -> np.ndarray:
    return np.asarray(open_volume(store / "labels" / name).levels[0])


@pytest.fixture
def reference(capsys, tmp_path, textured) -> Path:  # noqa: F811
    """The in-process ``predict --instances`` of the test store."""
    store = ngff_store(tmp_path / "ref.zarr", "0.5", (2, 4))
    code, _, err = run_cli(capsys, "predict", textured, store, "--instances", *BLOCK)
    assert code == 0, err
    return store


def _assert_same_as(store: Path, reference: Path) -> None:
    assert sorted(list_labels(store)) == sorted(MASKS + OBJECTS)
    for name in MASKS:
        np.testing.assert_array_equal(_labels(store, name), _labels(reference, name))
    for name in OBJECTS:
        got, want = _labels(store, name), _labels(reference, name)
        assert want.max() > 1, name  # objects to compare, not an empty volume
        assert same_up_to_relabelling(got, want), name
        ids = np.unique(got[got > 0])
        assert ids.tolist() == list(range(1, ids.size + 1))  # renumbered 1..N
        levels = open_volume(store / "labels" / name).levels
        assert [a.shape for a in levels] == [a.shape for a in open_volume(store).levels]
        assert all(np.dtype(a.dtype) == np.uint32 for a in levels)
    assert_valid_ngff(store)
    assert not job_dir(store, "prediction").exists()
    assert not list(store.glob(STAGING_PREFIX + "*"))


@pytest.mark.slow
@pytest.mark.resource  # a LocalCluster of worker processes
def test_instances_on_two_workers_equal_the_in_process_objects(capsys, tmp_path, textured,  # noqa: F811
                                                              reference):
    store = ngff_store(tmp_path / "vol.zarr", "0.5", (2, 4))
    code, out, err = run_cli(capsys, "predict", textured, store, "--instances", "--workers", "2",
                             *BLOCK)
    assert code == 0, err
    for name in OBJECTS:
        assert f"{name}: " in out and f"{BLOCKS} blocks labelled and {BLOCKS} relabelled" in out
        assert f"labels/{name}" in out
    _assert_same_as(store, reference)


@pytest.mark.parametrize("role", [
    ChannelRole("boundary", threshold=0.5, seed_distance=1.0, min_size=4),
    ChannelRole("object", threshold=0.65, min_size=6),
    ChannelRole("object", threshold=0.5, split=True, seed_distance=2.0),
    ChannelRole("object", threshold=0.45, min_size=4, split=True, seed_distance=2.0,
                seed_threshold=0.7),
], ids=["boundary", "object", "object-split", "object-split-cores"])
def test_blocks_labelled_in_any_order_and_joined_equal_blockwise_instances(tmp_path, role):
    """The workers' task functions, run here in reverse block order (a cluster finishes
    them in any order), joined from their records alone and relabelled (one block twice,
    as a retried task), give blockwise_instances' ids voxel for voxel. No cluster: the
    tasks are plain functions."""
    from scipy import ndimage

    from napari_finetune.objects import blockwise_instances
    from napari_finetune.objects.blockwise import block_cores, default_halo
    from napari_finetune.predict.distributed import join_blocks
    from napari_finetune.predict.job import (
        labels_array_path,
        prepare_objects,
        probability_path,
    )
    from napari_finetune.predict.tasks import (
        ObjectsTask,
        label_object_block,
        relabel_object_block,
    )

    shape, block = (12, 40, 40), (6, 16, 16)
    rng = np.random.default_rng(1)
    prob = ndimage.gaussian_filter(rng.random(shape), 2.0).astype(np.float32)
    prob = (prob - prob.min()) / (prob.max() - prob.min())
    prepare_objects(tmp_path, "mask", "objects", shape, block)
    zarr.open_array(str(probability_path(tmp_path, "mask")), mode="r+")[...] = prob
    out = zarr.open_array(str(labels_array_path(tmp_path, "objects")), mode="w",
                          zarr_format=3, shape=shape, chunks=block, dtype=np.uint32)
    task = ObjectsTask(str(tmp_path), "mask", "objects", role, default_halo(role, 3))
    blocks = list(block_cores(shape, block))
    for b in reversed(range(len(blocks))):
        label_object_block(task, b, blocks[b][1])
    tables = join_blocks(task, blocks, shape)
    for b, (_, core) in [*enumerate(blocks), (0, blocks[0])]:
        relabel_object_block(task, b, core, tables[b])

    want = np.zeros(shape, np.uint32)
    n = blockwise_instances(prob, role, block, want)
    assert n > 3
    np.testing.assert_array_equal(out[...], want)


@pytest.mark.parametrize("shape, chunks, region, halo", [
    ((30, 33, 20), (3, 11, 5), (3, 22, 10), (6, 4, 2)),
    ((64, 256, 256), (32, 64, 64), (32, 64, 64), (8, 8, 8)),
])
def test_a_block_waits_for_every_region_it_reads(shape, chunks, region, halo):
    """The regions a block's labelling task waits for cover what it reads, the boundary
    role's one voxel lower included (odd chunks put a block's read on an odd start)."""
    from napari_finetune.objects.blockwise import _read_box, block_cores
    from napari_finetune.predict.distributed import _regions_read
    from napari_finetune.predict.tiling import region_grid

    regions = region_grid(shape, region)
    futures = {i: f"region {i}" for i in range(len(regions))}  # any value: it is only named
    for _, core in block_cores(shape, chunks):
        box = _read_box(core, halo, shape, even=True)
        read = {f"region {i}" for i, r in enumerate(regions)
                if all(a.start < b.stop and b.start < a.stop for a, b in zip(r, box, strict=True))}
        assert read <= set(_regions_read(core, halo, shape, region, futures)), core


def _cli(*argv: object) -> list[str]:
    return [sys.executable, "-m", "napari_finetune.cli", "predict", *map(str, argv)]


@pytest.mark.slow
@pytest.mark.resource  # a LocalCluster of worker processes
def test_instances_killed_mid_labelling_then_resumed(tmp_path, textured, reference):  # noqa: F811
    """SIGKILL the command (its process group: workers too) once some blocks are labelled;
    nothing new is listed; the same command again labels only the rest and writes the
    in-process objects."""
    store = ngff_store(tmp_path / "vol.zarr", "0.5", (2, 4))
    argv = _cli(textured, store, "--instances", "--workers", "2", *BLOCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    folder = job_dir(store, "prediction")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(labelled_blocks(folder, OBJECTS[0])) >= 2:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert list_labels(store) == []  # nothing half visible
    before = {name: labelled_blocks(folder, name) for name in OBJECTS}
    assert 0 < sum(map(len, before.values())) < 2 * BLOCKS, before

    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    for name in OBJECTS:
        assert f"{BLOCKS - len(before[name])} blocks labelled" in result.stdout
    _assert_same_as(store, reference)


def _executing(dask_worker) -> int:
    return len(dask_worker.state.executing)


@pytest.mark.slow
@pytest.mark.resource  # a LocalCluster of worker processes
def test_interrupted_while_relabelling_resumes_with_the_same_objects(tmp_path, textured,  # noqa: F811
                                                                     reference):
    """Ctrl-C in the client once the first blocks have their final ids: the same call again
    labels nothing, relabels only the blocks without a final marker, and the objects
    are the in-process ones."""
    from distributed import Client

    from napari_finetune.config import PredictConfig
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.objects import roles_from_metadata
    from napari_finetune.predict.distributed import local_cluster, predict_on_cluster
    from napari_finetune.predict.job import final_blocks

    ckpt = load_checkpoint(textured)
    roles = roles_from_metadata(ckpt.metadata, ckpt.channel_names)
    config = PredictConfig(block_shape=(8, 16, 16), halo=(8, 16, 16), device="cpu")
    store = ngff_store(tmp_path / "vol.zarr", "0.5", (2, 4))
    folder = job_dir(store, "prediction")

    def interrupt_once_relabelling(done: int, total: int) -> None:
        if final_blocks(folder, OBJECTS[0]):
            raise KeyboardInterrupt

    cluster, _ = local_cluster(2, dashboard_address=":0")
    with cluster, Client(cluster) as client:
        with pytest.raises(KeyboardInterrupt):
            predict_on_cluster(textured, store, client, config=config, instances=roles,
                               progress=interrupt_once_relabelling)
        end = time.monotonic() + 60
        while any(client.run(_executing).values()) and time.monotonic() < end:
            time.sleep(0.05)
        assert list_labels(store) == []
        final = final_blocks(folder, OBJECTS[0])
        assert 0 < len(final) < BLOCKS
        assert all(len(labelled_blocks(folder, n)) == BLOCKS for n in OBJECTS)
        run = predict_on_cluster(textured, store, client, config=config, instances=roles)
    assert run.computed == [] and len(run.skipped) == run.total  # no region again
    assert run.blocks[OBJECTS[0]] == (0, BLOCKS - len(final))
    _assert_same_as(store, reference)
