"""A dask scheduler SIGKILLed mid-run loses no weights: ``train --scheduler`` exports the
last weights received, its record says the scheduler was lost, and it exits 1 with one
line. A real ``dask scheduler`` and ``dask worker`` in processes of their own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli

pytestmark = pytest.mark.resource  # a scheduler and a worker process, one SIGKILLed

SRC = Path(__file__).resolve().parents[2] / "src"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def dask_processes(tmp_path):
    """(address, scheduler process, worker process): ``dask scheduler`` and one ``dask
    worker`` (no nanny, one thread), both killed at the end."""
    from distributed import Client

    dask = str(Path(sys.executable).parent / "dask")
    address = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log = (tmp_path / "dask.log").open("w")
    scheduler = subprocess.Popen(
        [dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
         "--dashboard-address", ":0"], stdout=log, stderr=subprocess.STDOUT, env=env)
    worker = subprocess.Popen(
        [dask, "worker", address, "--nthreads", "1", "--no-nanny", "--dashboard-address", ":0",
         "--death-timeout", "60"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=120)
        yield address, scheduler, worker
    finally:
        for process in (worker, scheduler):
            if process.poll() is None:
                process.kill()
            process.wait(30)
        log.close()


def test_a_killed_scheduler_leaves_the_weights_received_exported(
    capsys, tmp_path, painted_store, checkpoint, dask_processes, monkeypatch
):
    address, scheduler, _ = dask_processes
    received = threading.Event()
    receive = RemoteFinetuner._receive

    def receive_and_tell(self, message):
        receive(self, message)
        received.set()

    monkeypatch.setattr(RemoteFinetuner, "_receive", receive_and_tell)

    def kill_the_scheduler() -> None:
        if received.wait(240):  # the first weights are here: the run is under way
            scheduler.send_signal(signal.SIGKILL)

    threading.Thread(target=kill_the_scheduler, daemon=True).start()
    out = tmp_path / "kept.pt"
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o", out,
                           "--steps", "100000", *TRAIN_FAST, "--scheduler", address)
    assert received.is_set() and scheduler.wait(30) == -signal.SIGKILL
    assert_one_line_error(code, err)
    assert "lost the dask scheduler" in err and f"the dask scheduler at {address} was lost" in err
    assert f"exported {out}" in err
    run = load_checkpoint(out).metadata["run"]  # on disk, and it loads
    assert run["ended"].startswith("lost the dask scheduler at step ")
    assert 5 <= run["steps_done"] < 100_000
