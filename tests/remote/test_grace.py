"""A worker whose client is gone trains on for a grace period, and a new client re-attaches.

A real LocalCluster: the run's first client submits the task, reads until the
worker's weights come back, then closes without a word (a laptop that slept or
lost its Wi-Fi: the scheduler releases the task). Within the grace period a new
client re-attaches by the run's id and gets its status and weights; after it,
the run stops and its last weights wait on the worker until a client fetches them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from test_remote_run import CHANNELS, config, volume

from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.messages import WEIGHTS, RunInputs
from napari_finetune.remote.preflight import RemoteError
from napari_finetune.remote.worker import run_leftovers

# One LocalCluster of worker processes: one test at a time beside the parallel suite.
pytestmark = pytest.mark.resource


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    return save_checkpoint(path, model, {"channel_names": CHANNELS})


def finetuner(client, model_file: Path, **overrides) -> RemoteFinetuner:
    image, corrections = volume()
    return RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                  config(**overrides), client, weights_every=1)


def start_and_vanish(client, model_file: Path, **overrides) -> tuple[RunInputs, int]:
    """Start a long run from a client of its own, read until the first weights came, then
    close that client without stopping the run; the inputs and the step it saw last."""
    from distributed import Client, Queue

    from napari_finetune.remote.channel import MessageChannel
    from napari_finetune.remote.worker import train_on_worker

    inputs = finetuner(client, model_file, **overrides).inputs()
    with Client(client.scheduler.address, set_as_default=False) as gone:
        Queue(inputs.queue_name(), client=gone)
        future = gone.submit(train_on_worker, inputs, pure=False)
        channel = MessageChannel(gone)
        seen = 0
        deadline = time.monotonic() + 120
        while not seen:
            assert time.monotonic() < deadline and not future.done(), "no weights came"
            for message in channel.take(inputs.queue_name()):
                if message["kind"] == WEIGHTS:
                    seen = int(message["steps_done"])
            time.sleep(0.05)
        channel.close()
    return inputs, seen


def queued(client, name: str) -> int:
    """How many messages the scheduler holds on the queue ``name`` (-1: no such queue)."""

    def size(dask_scheduler, name: str) -> int:
        queue = dask_scheduler.extensions["queues"].queues.get(name)
        return -1 if queue is None else queue.qsize()

    return client.run_on_scheduler(size, name=name)


def test_a_client_re_attaches_within_the_grace_period_and_gets_status_and_weights(
        client, model_file, tmp_path):
    inputs, seen = start_and_vanish(client, model_file, steps=100_000,
                                    validation_fraction=0.0, remote_grace_s=300.0)
    # Nobody reads: the worker trains on but sends nothing, so no weights pile up on the
    # scheduler (one set per step would, at weights_every=1).
    deadline = time.monotonic() + 60
    while queued(client, inputs.queue_name()) != 0:
        assert time.monotonic() < deadline, \
            "the unread messages stayed on the scheduler (or the run stopped: its kept note)"
        time.sleep(0.2)
    time.sleep(1.5)
    assert queued(client, inputs.queue_name()) == 0

    again = finetuner(client, model_file, steps=100_000, validation_fraction=0.0)
    statuses = []
    for status in again.attach(inputs.run_id):
        statuses.append(status)
        if status.kind == "step" and again.run_record is not None:
            again.stop()
    assert statuses[0].message.startswith(f"re-attaching to the run {inputs.run_id}")
    last = statuses[-1]
    assert last.kind == "stopped", last.message
    # It trained on while nobody read it, and the weights of its last step came back.
    first_step = next(s.step for s in statuses if s.kind == "step")
    assert first_step > seen + 1
    assert again.steps_done == last.step == again.run_record["steps_done"]
    assert again.worker in client.scheduler_info()["workers"]
    assert again.run_record["worker"] == again.worker
    assert again.placement.startswith(f"the dask worker {again.worker} (host ")
    assert again.placement.endswith(", device cpu)")
    again.export(tmp_path / "reattached.pt")
    assert load_checkpoint(tmp_path / "reattached.pt").metadata["run"]["steps_done"] == last.step
    assert client.run_on_scheduler(run_leftovers, run_id=inputs.run_id) == []


def test_after_the_grace_period_the_run_stops_and_its_weights_wait_on_the_worker(
        client, model_file, tmp_path):
    inputs, seen = start_and_vanish(client, model_file, steps=100_000,
                                    validation_fraction=0.0, remote_grace_s=2.0)
    # The run stopped: only a note naming the worker stays on the scheduler.
    deadline = time.monotonic() + 120
    while client.run_on_scheduler(run_leftovers, run_id=inputs.run_id) != [inputs.queue_name()]:
        assert time.monotonic() < deadline, "the run left more than its note (or trained on)"
        time.sleep(0.2)
    assert queued(client, inputs.queue_name()) == 1

    def kept_files(dask_worker) -> list[str]:
        return sorted(p.name for p in Path(dask_worker.local_directory).glob("*kept*"))

    kept = f"napari-finetune-kept-{inputs.run_id}.msgpack"
    [holder] = client.run(kept_files).values()
    assert kept in holder

    again = finetuner(client, model_file, steps=100_000, validation_fraction=0.0)
    statuses = list(again.attach(inputs.run_id))
    assert statuses[-1].kind == "stopped", statuses[-1].message
    assert again.steps_done > seen and again.run_record["steps_done"] == again.steps_done
    assert "no client read the run for 2 s (remote_grace_s)" in again.ended
    again.export(tmp_path / "kept.pt")
    run = load_checkpoint(tmp_path / "kept.pt").metadata["run"]
    assert run["steps_done"] == again.steps_done and "remote_grace_s" in run["ended"]
    # Fetched once: nothing stays on the worker or the scheduler.
    [holder] = client.run(kept_files).values()
    assert kept not in holder
    assert client.run_on_scheduler(run_leftovers, run_id=inputs.run_id) == []
    with pytest.raises(RemoteError, match=f"holds no run {inputs.run_id}"):
        list(finetuner(client, model_file).attach(inputs.run_id))
    # The worker is free again: the next run trains.
    assert list(finetuner(client, model_file, steps=1).run())[-1].kind == "finished"
