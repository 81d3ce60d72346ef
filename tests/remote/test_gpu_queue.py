"""A worker's one GPU busy with a run: a second run waits in the scheduler's queue for it
and says so, and Stop ends the wait at once. Its own LocalCluster: one worker that
offers GPU=1 (the label only: the runs train on its CPU)."""

from __future__ import annotations

import pytest
from test_remote_run import config, volume

from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.worker import run_leftovers

pytestmark = pytest.mark.resource  # its own LocalCluster


@pytest.fixture
def gpu_client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(processes=True, n_workers=1, threads_per_worker=2,
                           resources={"GPU": 1}, dashboard_address=":0")
    with Client(cluster) as c:
        yield c
    cluster.close()


def test_a_run_waits_while_the_gpu_is_busy_and_stop_ends_the_wait(gpu_client, tmp_path,
                                                                   monkeypatch):
    import napari_finetune.remote.finetuner as finetuner

    # Device "cpu" (no CUDA here) asking for GPU=1 anyway: the label is all dask checks.
    monkeypatch.setattr(finetuner, "resources_for", lambda device: {"GPU": 1})
    start = save_checkpoint(tmp_path / "start.pt", UNet(dims=3, depth=2, features=4,
                                                         out_channels=2), {})
    image, corrections = volume()

    def remote(steps: int) -> RemoteFinetuner:
        return RemoteFinetuner.remote(load_checkpoint(start), image, corrections,
                                      config(steps=steps, validation_fraction=0.0),
                                      gpu_client)

    busy = remote(100_000)
    holding = busy.run()
    next(s for s in holding if s.kind == "step")  # the GPU is taken
    waiting = remote(2)
    statuses = []
    for status in waiting.run():  # the wait would last 600 s: Stop ends it
        statuses.append(status)
        if status.message.startswith("waiting for a worker with a GPU (GPU=1)"):
            waiting.stop()
    assert statuses[-1].message.startswith(
        "waiting for a worker with a GPU (GPU=1), 1 run ahead, on the dask scheduler")
    # What a front end shows while it waits, and for what.
    assert waiting.placement == "waiting for a worker with a GPU (GPU=1), 1 run ahead"
    assert waiting.steps_done == 0 and waiting.worker is None
    assert gpu_client.run_on_scheduler(run_leftovers, run_id=waiting.run_id) == []
    holding.close()  # the busy run stops after its step; its weights come back
    assert busy.steps_done >= 1 and busy.run_record is not None


def test_a_queued_run_says_anew_how_many_runs_are_ahead_when_that_changes(
        gpu_client, tmp_path, monkeypatch):
    """Two runs wait behind the one on the GPU; the first stops waiting, and the second
    says that one run is ahead of it now (its placement too), while still queued."""
    import threading

    import napari_finetune.remote.finetuner as finetuner

    monkeypatch.setattr(finetuner, "resources_for", lambda device: {"GPU": 1})
    monkeypatch.setattr(finetuner, "RECHECK_QUEUE_S", 0.5)
    start = save_checkpoint(tmp_path / "start.pt", UNet(dims=3, depth=2, features=4,
                                                         out_channels=2), {})
    image, corrections = volume()

    def remote(steps: int) -> RemoteFinetuner:
        return RemoteFinetuner.remote(load_checkpoint(start), image, corrections,
                                      config(steps=steps, validation_fraction=0.0),
                                      gpu_client)

    busy = remote(100_000)
    holding = busy.run()
    next(s for s in holding if s.kind == "step")  # the GPU is taken
    first, second = remote(2), remote(2)
    first_waits = threading.Event()

    def wait_first() -> None:
        for status in first.run():
            if status.message.startswith("waiting for"):
                first_waits.set()

    thread = threading.Thread(target=wait_first)
    # Never saying anew would wait 600 s: the assertion below says what was missing.
    watchdog = threading.Timer(30.0, second.stop)
    lines: list[str] = []
    thread.start()
    try:
        assert first_waits.wait(60)
        watchdog.start()
        for status in second.run():
            if status.message.startswith("waiting for"):
                lines.append(status.message.split(", on the dask scheduler")[0])
                if len(lines) == 1:
                    first.stop()  # one run fewer ahead of the second
                else:
                    second.stop()
    finally:
        watchdog.cancel()
        first.stop()
        thread.join(60)
        holding.close()
    assert lines == ["waiting for a worker with a GPU (GPU=1), 2 runs ahead",
                     "waiting for a worker with a GPU (GPU=1), 1 run ahead"]
    assert second.placement == lines[-1] and second.worker is None
    assert gpu_client.run_on_scheduler(run_leftovers, run_id=second.run_id) == []
