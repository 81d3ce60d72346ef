"""An error on the worker outside the training loop is reported as itself (its type and
line), not as a lost worker; the command line says what failed."""

from __future__ import annotations

import pytest
from test_remote_run import config, volume

from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.remote.finetuner import RemoteFinetuner, RemoteWorkerLost
from napari_finetune.remote.preflight import RemoteError
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli

pytestmark = pytest.mark.resource  # the LocalCluster's worker is patched for a moment


def _break_on_worker(module: str, name: str, message: str) -> None:
    """On the worker: ``module.name`` raises ``OSError(message)`` when called."""
    import importlib

    target = importlib.import_module(module)
    original = getattr(target, name)

    def broken(*args, **kwargs):
        raise OSError(message)

    broken.original = original  # type: ignore[attr-defined]
    setattr(target, name, broken)


def _mend_on_worker(module: str, name: str) -> None:
    import importlib

    target = importlib.import_module(module)
    setattr(target, name, getattr(target, name).original)


@pytest.fixture
def broken_worker(client):
    """Break a function of the worker's process for one test; mended after it."""
    broken: list[tuple[str, str]] = []

    def breaking(module: str, name: str, message: str) -> None:
        client.run(_break_on_worker, module, name, message)
        broken.append((module, name))

    yield breaking
    for module, name in broken:
        client.run(_mend_on_worker, module, name)


def _run(client, tmp_path) -> RemoteFinetuner:
    start = save_checkpoint(tmp_path / "start.pt", UNet(dims=3, depth=2, features=4,
                                                         out_channels=2), {})
    image, corrections = volume()
    return RemoteFinetuner.remote(load_checkpoint(start), image, corrections, config(steps=2),
                                  client)


def test_a_failure_before_the_loop_is_the_workers_exception(client, broken_worker, tmp_path):
    broken_worker("napari_finetune.remote.process", "training_process", "no /proc here")
    remote = _run(client, tmp_path)
    with pytest.raises(RemoteError) as failed:
        list(remote.run())
    assert not isinstance(failed.value, RemoteWorkerLost)
    line = str(failed.value)
    assert "\n" not in line and "was lost" not in line
    assert "the fine-tune failed on the dask worker tcp://" in line
    assert line.endswith("OSError: no /proc here")


def test_a_task_that_cannot_report_is_read_on_the_scheduler(client, broken_worker, tmp_path):
    """The task fails before it can put a message: its exception, as the scheduler's text."""
    broken_worker("napari_finetune.remote.worker", "Outbox", "queue refused")
    remote = _run(client, tmp_path)
    with pytest.raises(RemoteError) as failed:
        list(remote.run())
    line = str(failed.value)
    assert not isinstance(failed.value, RemoteWorkerLost) and "was lost" not in line
    assert "\n" not in line and "the fine-tune failed on the dask worker" in line
    assert "queue refused" in line


def test_the_command_line_says_what_failed(capsys, tmp_path, painted_store, checkpoint, client,
                                           broken_worker):
    broken_worker("napari_finetune.remote.process", "training_process", "no /proc here")
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST,
                           "--scheduler", client.scheduler.address)
    assert_one_line_error(code, err)
    assert "the fine-tune failed on the dask worker" in err and "OSError: no /proc here" in err
    assert not (tmp_path / "o.pt").exists()
