"""``napari-finetune train --scheduler ADDRESS --attach RUN_ID``: the command line follows a
run whose client went away and exports its weights as a normal remote train does.

A real LocalCluster: the run is started from a client of its own that reads until the
first weights came back, then closes without a word (a terminal closed, a laptop that
slept); the worker trains on within its grace period, and the command re-attaches by
the run's id.
"""

from __future__ import annotations

import time

import pytest
import torch
from test_remote_store import painting_of

from napari_finetune.config import FinetuneConfig
from napari_finetune.io.omezarr import load_corrections, open_volume, save_corrections
from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.messages import WEIGHTS
from napari_finetune.remote.worker import run_leftovers
from napari_finetune.trainer.loop import Finetuner
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli

pytestmark = pytest.mark.resource  # the tests' LocalCluster

STEPS = 40


def settings() -> FinetuneConfig:
    """The run's settings, as ``train ... --steps STEPS *TRAIN_FAST`` gives them."""
    return FinetuneConfig(steps=STEPS, batch_size=2, patch_shape=(8, 16, 16), device="cpu")


def start_and_vanish(client, store, checkpoint) -> tuple[str, int]:
    """Start the run of ``store`` from a client of its own, read until its first weights
    came back, close that client; the run's id and the step seen last."""
    from distributed import Client, Queue

    from napari_finetune.remote.channel import MessageChannel
    from napari_finetune.remote.worker import train_on_worker

    image = open_volume(store).data
    remote = RemoteFinetuner.remote(load_checkpoint(checkpoint), image,
                                    load_corrections(store), settings(), client,
                                    weights_every=1)
    inputs = remote.inputs()
    with Client(client.scheduler.address, set_as_default=False) as gone:
        Queue(inputs.queue_name(), client=gone)
        future = gone.submit(train_on_worker, inputs, pure=False)
        channel = MessageChannel(gone)
        seen, deadline = 0, time.monotonic() + 120
        while not seen:
            assert time.monotonic() < deadline and not future.done(), "no weights came"
            for message in channel.take(inputs.queue_name()):
                if message["kind"] == WEIGHTS:
                    seen = int(message["steps_done"])
            time.sleep(0.05)
        channel.close()
    return inputs.run_id, seen


def test_attach_follows_a_run_whose_client_went_away_and_exports_its_weights(
    capsys, tmp_path, store, checkpoint, client
):
    save_corrections(store, painting_of((16, 40, 40)))
    run_id, seen = start_and_vanish(client, store, checkpoint)
    assert seen < STEPS
    out = tmp_path / "attached.pt"
    code, stdout, err = run_cli(capsys, "train", store, "-c", checkpoint, "-o", out,
                                "--steps", STEPS, *TRAIN_FAST,
                                "--scheduler", client.scheduler.address, "--attach", run_id)
    assert code == 0, err
    assert f"re-attaching to the run {run_id} on the dask scheduler" in stdout + err
    assert f"finished after {STEPS}/{STEPS} steps; exported {out}" in stdout
    assert "MB to the dask scheduler" not in stdout + err  # nothing was sent again
    tuned = load_checkpoint(out)
    run = tuned.metadata["run"]
    assert run["ended"] == "finished" and run["steps_done"] == STEPS
    assert run["worker"] in client.scheduler_info()["workers"]
    # The weights the worker trained: those of the same run in process.
    local = Finetuner.from_checkpoint(load_checkpoint(checkpoint), open_volume(store).data,
                                      load_corrections(store), settings())
    for _ in local.run():
        pass
    for name, value in local.model.state_dict().items():
        torch.testing.assert_close(tuned.model.state_dict()[name], value, rtol=0, atol=1e-6)
    assert client.run_on_scheduler(run_leftovers, run_id=run_id) == []


def test_attach_to_an_unknown_run_is_one_line(capsys, tmp_path, painted_store, checkpoint,
                                              client):
    address = client.scheduler.address
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST,
                           "--scheduler", address, "--attach", "nosuchrun")
    assert_one_line_error(code, err)
    assert f"the dask scheduler at {address} holds no run nosuchrun" in err
    assert not (tmp_path / "o.pt").exists()


def test_attach_without_a_scheduler_is_one_line(capsys, tmp_path, painted_store, checkpoint):
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", *TRAIN_FAST, "--attach", "abc")
    assert_one_line_error(code, err, expected=2)
    assert "--attach abc re-attaches to a run on a dask scheduler; give its --scheduler" in err


def test_the_runs_first_line_names_its_id(capsys, tmp_path, painted_store, checkpoint, client):
    code, stdout, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                                tmp_path / "o.pt", "--steps", "1", *TRAIN_FAST,
                                "--scheduler", client.scheduler.address)
    assert code == 0, err
    [line] = [line for line in stdout.splitlines() if "MB to the dask scheduler" in line]
    run_id = line.rsplit("; run id ", 1)[1]
    assert len(run_id) == 32 and int(run_id, 16) >= 0  # uuid4's hex
