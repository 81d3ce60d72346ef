"""``napari-finetune train --scheduler``: the local command's run on a dask worker."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.loading import load_checkpoint
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli

pytestmark = pytest.mark.resource  # the tests' LocalCluster


def test_train_on_a_scheduler_exports_the_local_runs_weights(
    capsys, tmp_path, painted_store, checkpoint, client
):
    args = ["train", painted_store, "-c", checkpoint, "--steps", "3", *TRAIN_FAST]
    code, _, err = run_cli(capsys, *args, "-o", tmp_path / "local.pt")
    assert code == 0, err
    address = client.scheduler.address
    code, stdout, err = run_cli(capsys, *args, "-o", tmp_path / "remote.pt",
                                "--scheduler", address)
    assert code == 0, err
    assert f"fine-tuning on a worker of the dask scheduler {address}" in stdout
    assert "finished after 3/3 steps" in stdout and "MB to the dask scheduler" in stdout
    assert f"the worker reads it from {painted_store}" in stdout  # a shared filesystem
    local, remote = load_checkpoint(tmp_path / "local.pt"), load_checkpoint(tmp_path / "remote.pt")
    for name, value in local.model.state_dict().items():
        torch.testing.assert_close(remote.model.state_dict()[name], value, rtol=0, atol=1e-6)
    run = remote.metadata["run"]
    assert run["ended"] == "finished" and run["worker"] in client.scheduler_info()["workers"]


def test_train_on_an_unreachable_scheduler_is_one_line(capsys, tmp_path, painted_store,
                                                       checkpoint):
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST,
                           "--scheduler", "tcp://127.0.0.1:9")
    assert_one_line_error(code, err)
    assert "cannot reach the dask scheduler at tcp://127.0.0.1:9" in err
    assert not (tmp_path / "o.pt").exists()


def test_tls_files_go_together(capsys, tmp_path, painted_store, checkpoint):
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", *TRAIN_FAST, "--scheduler", "tls://127.0.0.1:9",
                           "--tls-ca-file", "ca.pem")
    assert_one_line_error(code, err, expected=2)
    assert "--tls-ca-file, --tls-cert and --tls-key go together" in err


def test_train_with_device_auto_waits_for_a_gpu_worker_and_gives_up_in_one_line(
    capsys, tmp_path, painted_store, checkpoint, client
):
    """The tests' worker offers no GPU: ``--device auto`` asks for one, says it waits, and
    ``--queue-timeout-s`` ends the wait with one line; nothing is exported."""
    address = client.scheduler.address
    code, stdout, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                                tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST,
                                "--device", "auto", "--queue-timeout-s", "3",
                                "--scheduler", address)
    assert "waiting for a worker with a GPU (GPU=1)" in stdout + err
    assert_one_line_error(code, err)
    assert "no worker with a free GPU (GPU=1)" in err and "within 3 s" in err
    assert "--device cpu" in err
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("address, warned", [("tcp://10.1.2.3:8786", True),
                                             ("tcp://127.0.0.1:9", False)])
def test_a_plain_tcp_scheduler_of_another_machine_is_warned_of_before_the_run(
        capsys, monkeypatch, tmp_path, painted_store, checkpoint, address, warned):
    """One line, said before the connection is tried (which fails here: no scheduler; the
    connection is not made, whatever this machine's network answers at that address)."""
    from napari_finetune.remote import finetuner
    from napari_finetune.remote.preflight import RemoteError

    said_before: list[str] = []

    def connect(address, security=None, timeout_s=5.0):
        said_before.append(capsys.readouterr().err)
        raise RemoteError(f"cannot reach the dask scheduler at {address} (test)")

    monkeypatch.setattr(finetuner, "connect", connect)
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST, "--scheduler", address)
    assert_one_line_error(code, err)
    assert f"cannot reach the dask scheduler at {address}" in err
    [before] = said_before
    lines = [line for line in before.splitlines() if line.strip()]
    if warned:
        assert len(lines) == 1, before
        assert lines[0].startswith(f"warning: {address} is not encrypted: the checkpoint, "
                                   "the painted tiles and the weights")
        assert "tls://" in lines[0] and "--tls-ca-file, --tls-cert and --tls-key" in lines[0]
    else:
        assert lines == [], before


def test_train_over_the_send_cap_is_one_line(capsys, tmp_path, painted_store, checkpoint,
                                             client):
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST,
                           "--max-send-bytes", "1000", "--scheduler", client.scheduler.address)
    assert_one_line_error(code, err)
    assert "MB to the dask scheduler at" in err and "over the cap of 0.0 MB" in err
    assert "image tiles around the painting 0.0 MB" in err  # the worker reads the store
    assert not (tmp_path / "o.pt").exists()
