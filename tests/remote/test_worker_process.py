"""The training task tunes its worker process (torch's threads, glibc's allocator) and
puts it back: a dask nanny's defaults made a worker train ~40 % slower than a process."""

from __future__ import annotations

import resource

import numpy as np
import pytest
from test_remote_run import config, volume

from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.process import training_process, usable_cpus

pytestmark = pytest.mark.resource  # the LocalCluster


def page_faults_of_buffers(tuned: bool) -> int:
    """Minor page faults of 100 1-MiB buffers made, written and freed one after another."""

    def churn() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(100):
            np.ones(1 << 20, np.uint8)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    if not tuned:
        return churn()
    with training_process(1):
        return churn()


@pytest.fixture
def one_thread_client():
    """A worker of one task thread, as the user guide starts one: the training gets its CPUs."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                           dashboard_address=":0")
    with Client(cluster) as c:
        yield c
    cluster.close()


def test_the_task_trains_on_the_workers_cpus_and_restores_torchs_threads(
    one_thread_client, tmp_path
):
    import torch

    client = one_thread_client
    model_file = save_checkpoint(tmp_path / "model.pt",
                                 UNet(dims=3, depth=2, features=4, out_channels=2), {})
    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(steps=2), client)
    assert [s.kind for s in remote.run()][-1] == "finished"
    [cpus] = client.run(usable_cpus).values()
    [task_threads] = client.run(lambda dask_worker: dask_worker.state.nthreads).values()
    assert remote.worker_tuning["cpus"] == cpus
    assert task_threads == 1 and remote.worker_tuning["threads"] == cpus
    # The nanny's OMP_NUM_THREADS=1 again for the worker's other tasks.
    [after] = client.run(torch.get_num_threads).values()
    assert after == 1


def test_buffers_are_reused_not_mapped_anew_during_the_task(one_thread_client):
    # The nanny's MALLOC_TRIM_THRESHOLD_ pins glibc's mmap threshold at 128 KiB: each
    # 1-MiB buffer is mapped and faulted in again (256 faults each); tuned, it is reused.
    # A worker of its own: the thresholds are the process's, so a training task of
    # another test still ending on a shared worker would hold them raised meanwhile.
    client = one_thread_client
    untuned = client.submit(page_faults_of_buffers, False, pure=False).result()
    tuned = client.submit(page_faults_of_buffers, True, pure=False).result()
    assert untuned > 100 * 200
    assert tuned < untuned / 10
    # Put back afterwards: the worker's other tasks get the environment's allocator.
    assert client.submit(page_faults_of_buffers, False, pure=False).result() > 100 * 200
