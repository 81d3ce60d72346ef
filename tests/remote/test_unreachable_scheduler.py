"""A scheduler that does not answer is one line within the connect timeout: a bound on wall
time, so `serial` (alone, after the parallel run), and no cluster is needed."""

from __future__ import annotations

import time

import pytest
import torch
from test_remote_run import config, volume

from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.preflight import RemoteError

pytestmark = pytest.mark.serial  # a bound on wall time


def test_an_unreachable_scheduler_is_one_line_and_fast(tmp_path):
    torch.manual_seed(0)
    start = save_checkpoint(tmp_path / "start.pt", UNet(dims=3, depth=2, features=4,
                                                         out_channels=2), {})
    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(start), image, corrections, config(),
                                    "tcp://127.0.0.1:9")
    remote.connect_timeout_s = 1.0
    began = time.monotonic()
    with pytest.raises(RemoteError) as failed:
        list(remote.run())
    assert time.monotonic() - began < 5
    line = str(failed.value)
    assert "\n" not in line and "cannot reach the dask scheduler at tcp://127.0.0.1:9" in line


def test_a_server_that_is_not_a_dask_scheduler_is_one_line(tmp_path):
    """An HTTP server (a proxy, a web app) at the address: its answer, read as a dask frame,
    asks for exabytes; one line instead of a MemoryError's traceback."""
    import socket
    import threading

    from napari_finetune.remote.preflight import connect

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test ended
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(RemoteError) as failed:
            connect(f"tcp://127.0.0.1:{port}", timeout_s=2.0)
    finally:
        server.close()
    line = str(failed.value)
    assert "\n" not in line and f"tcp://127.0.0.1:{port}" in line
    assert "answered, but not as a dask scheduler" in line
