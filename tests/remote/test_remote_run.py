"""Fine-tuning on a dask worker: a real LocalCluster of one worker process on this machine.

The same seeded run in process and on the worker gives the same losses and the
same weights; Stop ends it after the step in progress with its weights back;
the checks before anything starts are one line each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.preflight import RemoteError, matching_versions
from napari_finetune.trainer.loop import Finetuner

# One LocalCluster of worker processes: one test at a time beside the parallel suite.
pytestmark = pytest.mark.resource

CHANNELS = ["membrane", "mitochondria"]


def volume() -> tuple[np.ndarray, np.ndarray]:
    """A 16x48x48 noisy volume with strokes in two corners (most of it is never reached)."""
    rng = np.random.default_rng(0)
    image = rng.normal(100.0, 10.0, size=(16, 48, 48)).astype(np.float32)
    image[8:12, 4:9, 4:9] += 40.0
    corrections = np.zeros(image.shape, np.uint8)
    corrections[2:6, 2:6, 2:6] = 1
    corrections[8:12, 4:9, 4:9] = 2
    return image, corrections


def config(**overrides) -> FinetuneConfig:
    settings = dict(steps=6, batch_size=2, accumulation=1, patch_shape=(4, 8, 8),
                    learning_rate=1e-3, mode="full", mixed_precision=False, device="cpu",
                    seed=0, validation_fraction=0.25, validation_every=3)
    settings.update(overrides)
    return FinetuneConfig(**settings)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    return save_checkpoint(path, model, {"channel_names": CHANNELS})


def weights_of(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).model.state_dict()


def test_a_remote_run_gives_the_in_process_losses_and_weights(client, model_file, tmp_path):
    image, corrections = volume()
    local = Finetuner.from_checkpoint(load_checkpoint(model_file), image, corrections, config())
    local_losses = [s.loss for s in local.run() if s.kind == "step"]
    local.export(tmp_path / "local.pt")

    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections, config(),
                                    client, weights_every=2)
    statuses = list(remote.run())
    losses = [s.loss for s in statuses if s.kind == "step"]
    assert len(losses) == 6
    np.testing.assert_allclose(losses, local_losses, rtol=0, atol=1e-6)
    assert statuses[-1].kind == "finished"
    assert statuses[-1].validation is not None  # held-out checks ran on the shipped tiles
    assert not [s for s in statuses if s.message.startswith("waiting for")]  # it started
    # Where it trains, said once the worker built the run (a front end shows it).
    import socket

    worker = next(iter(client.scheduler_info()["workers"]))
    assert remote.placement == f"the dask worker {worker} (host {socket.gethostname()}, device cpu)"
    assert [s.message for s in statuses if s.message.startswith("training on ")] == [
        f"training on {remote.placement}"]
    sent = [s.message for s in statuses if s.message.startswith("sending ")]
    assert sent and "MB" in sent[0]
    assert remote.bytes_sent < remote.volume_bytes  # only the reachable tiles travelled

    remote.export(tmp_path / "remote.pt")
    ours, theirs = weights_of(tmp_path / "remote.pt"), weights_of(tmp_path / "local.pt")
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-6)
    run = load_checkpoint(tmp_path / "remote.pt").metadata["run"]
    assert run["ended"] == "finished" and run["steps_done"] == 6
    assert run["worker"] in client.scheduler_info()["workers"]
    assert run["environment"]["host"] and run["environment"]["device"]["type"] == "cpu"


def test_stop_ends_the_run_after_the_step_in_progress_with_its_weights(client, model_file):
    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(steps=500, validation_fraction=0.0), client,
                                    weights_every=1000)
    statuses = []
    for status in remote.run():
        statuses.append(status)
        if status.kind == "step" and status.step == 2:
            remote.stop()
    last = statuses[-1]
    assert last.kind == "stopped" and 2 <= last.step < 500, last.message
    # The weights of the last step came back although none were due before the end.
    assert remote.steps_done == last.step == remote.run_record["steps_done"]


def test_closing_the_run_still_brings_the_last_weights_back(client, model_file):
    """napari's Stop closes the job's generator: the worker stops and its weights come back."""
    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(steps=500, validation_fraction=0.0), client,
                                    weights_every=1000)
    run = remote.run()
    for status in run:
        if status.kind == "step":
            break
    run.close()
    assert remote.steps_done >= 1 and remote.run_record["steps_done"] == remote.steps_done
    assert remote.steps_done < 500


def test_a_run_waits_for_a_worker_with_a_gpu_and_stop_ends_the_wait(client, model_file):
    """No worker offers GPU=1 (device "auto" asks for one): the run says it waits, and Stop
    ends the wait at once (the wait would last 600 s), leaving nothing on the scheduler."""
    from napari_finetune.remote.worker import run_leftovers

    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(device="auto", queue_timeout_s=600.0), client)
    run = remote.run()
    statuses = []
    for status in run:
        statuses.append(status)
        if status.message.startswith("waiting for a worker with a GPU (GPU=1)"):
            remote.stop()
    assert "--queue-timeout-s" in statuses[-1].message and remote.steps_done == 0
    assert remote.run_record is None and remote.worker is None
    assert client.run_on_scheduler(run_leftovers, run_id=remote.run_id) == []


def test_a_cpu_run_asks_for_no_gpu():
    from napari_finetune.remote.preflight import resources_for

    assert resources_for("cpu") == {}
    for device in ("auto", "cuda", "cuda:1"):
        assert resources_for(device) == {"GPU": 1}


def test_other_versions_on_the_worker_are_one_line(client):
    workers = list(client.scheduler_info()["workers"])
    assert matching_versions(client, workers, _here()) == workers
    with pytest.raises(RemoteError) as failed:
        matching_versions(client, workers, {**_here(), "torch": "0.0.1"})
    line = str(failed.value)
    assert "\n" not in line and f"torch {torch.__version__}" in line and "torch 0.0.1" in line


def test_another_build_is_one_line_naming_both_either_way(client, model_file):
    """Same release, other code: refused by the client before sending, and by the task when
    it starts (a worker the client could not ask, e.g. one that joined a queued run)."""
    import dataclasses

    from distributed import Queue

    from napari_finetune.remote.messages import decode
    from napari_finetune.remote.worker import forget_run, train_on_worker

    workers = list(client.scheduler_info()["workers"])
    mine = _here()["napari_finetune_build"]
    other = {**_here(), "napari_finetune_build": "000000000000"}
    with pytest.raises(RemoteError) as failed:
        matching_versions(client, workers, other)
    line = str(failed.value)
    assert "\n" not in line and f"(build {mine})" in line and "(build 000000000000)" in line

    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections, config(),
                                    client)
    inputs = dataclasses.replace(remote.inputs(), versions=other)
    messages = Queue(inputs.queue_name(), client=client)
    assert client.submit(train_on_worker, inputs, pure=False).result(timeout=60) == "failed"
    message = decode(messages.get(timeout=10))
    assert message["kind"] == "failed" and "\n" not in message["line"]
    assert f"has torch {torch.__version__}" in message["line"]
    assert f"(build {mine}) but the client has" in message["line"]
    assert message["line"].endswith("(build 000000000000); install the same versions and code "
                                    "on both.")
    client.run_on_scheduler(forget_run, queues=inputs.queue_names(), events=inputs.event_names())


def test_the_build_is_the_hash_of_the_code(tmp_path):
    from napari_finetune import __version__
    from napari_finetune.remote.build import build_id

    assert __version__ == "0.1.0"  # the release bioimage.io packages pin
    assert len(build_id()) == 12 and int(build_id(), 16) >= 0
    assert _here()["napari_finetune_build"] == build_id()
    from napari_finetune.remote.build import code_hash

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = code_hash(tmp_path / "pkg")
    assert code_hash(tmp_path / "pkg") == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")  # an edit, same release
    assert code_hash(tmp_path / "pkg") != before


def _here() -> dict[str, str]:
    from napari_finetune.remote.build import versions

    return versions()


def test_a_retried_task_says_its_worker_was_lost_and_trains_nothing(client, model_file):
    """dask retries a task whose worker died from scratch: the retry must not train again."""
    from distributed import Event, Queue

    from napari_finetune.remote.messages import decode
    from napari_finetune.remote.worker import train_on_worker

    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections, config(),
                                    client)
    inputs = remote.inputs()
    Event(inputs.started_name(), client=client).set()  # as the first, killed, start left it
    assert client.submit(train_on_worker, inputs, pure=False).result(timeout=60) == "lost"
    message = decode(Queue(inputs.queue_name(), client=client).get(timeout=10))
    assert message["kind"] == "lost"




def test_no_queue_or_event_of_a_run_stays_on_the_scheduler(client, model_file, monkeypatch):
    """Finished, stopped, closed, failed: the run's queues and events are gone after it."""
    image, corrections = volume()
    ids: list[str] = []
    inputs = RemoteFinetuner.inputs

    def remembered(self, stored=None):
        made = inputs(self, stored)
        ids.append(made.run_id)
        return made

    monkeypatch.setattr(RemoteFinetuner, "inputs", remembered)
    finished = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                      config(steps=2), client)
    assert list(finished.run())[-1].kind == "finished"
    closed = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(steps=500, validation_fraction=0.0), client)
    run = closed.run()
    next(s for s in run if s.kind == "step")
    run.close()
    failed = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(steps=2), client, weights_every=1)
    failed.trust = ("no.such.factory",)
    failed.checkpoint = b"not a checkpoint"  # the worker cannot load it: the run fails
    with pytest.raises(RemoteError):
        list(failed.run())
    assert len(ids) == 3
    from napari_finetune.remote.worker import run_leftovers

    for run_id in ids:
        assert client.run_on_scheduler(run_leftovers, run_id=run_id) == [], run_id

