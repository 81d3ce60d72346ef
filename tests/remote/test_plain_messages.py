"""Nothing the cluster sends for a run is unpickled here: its messages are msgpack of plain
data, read over a connection of the run's own that refuses a pickled frame unopened."""

from __future__ import annotations

import os

import numpy as np
import pytest

from napari_finetune.remote.channel import MessageChannel, UnsafeMessage, refuse_serialized
from napari_finetune.remote.messages import PlainDataError, decode, encode

pytestmark = pytest.mark.resource  # a dask server on a port


class Booby:
    """Unpickling it creates a folder: the proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.makedirs, (self.path,))


def test_a_message_is_plain_bytes_and_comes_back_whole():
    probabilities = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    data = encode({"kind": "preview", "region": ((0, 3), (1, 5)), "probabilities": probabilities,
                   "step": np.int64(3), "weights": b"\x00\x01"})
    message = decode(data)
    assert message["region"] == [[0, 3], [1, 5]] and message["step"] == 3
    np.testing.assert_array_equal(message["probabilities"], probabilities)
    assert message["probabilities"].dtype == np.float32 and message["weights"] == b"\x00\x01"
    with pytest.raises(PlainDataError):
        encode({"kind": "x", "thing": Booby("/nonexistent")})
    with pytest.raises(PlainDataError):
        encode({"kind": "x", "objects": np.array([None, 1], dtype=object)})


def test_a_pickled_frame_is_refused_unopened(tmp_path):
    """A scheduler that answers the run's queue_get with a pickled object: one line, and the
    object's code never ran (a real dask server on a port, a real pickled frame)."""
    from distributed import Client, LocalCluster
    from distributed.core import Server
    from distributed.protocol.serialize import ToPickle

    touched = tmp_path / "touched"

    async def queue_get(name=None, batch=None, **kwargs):
        return [{"type": "msgpack", "value": ToPickle(Booby(str(touched)))}]

    async def serve() -> Server:
        server = Server({"queue_get": queue_get})
        await server.listen("tcp://127.0.0.1:0")
        return server

    cluster = LocalCluster(processes=False, n_workers=0, dashboard_address=":0")
    try:
        with Client(cluster) as client:
            server = client.sync(serve)
            channel = MessageChannel(client)
            channel.address = server.address
            try:
                with pytest.raises(UnsafeMessage) as refused:
                    channel.take("napari-finetune-x-messages")
            finally:
                channel.close()
                client.sync(server.close)
    finally:
        cluster.close()
    line = str(refused.value)
    assert "\n" not in line and "refused a message of the remote run: it came pickled" in line
    assert not touched.exists()


def test_the_guard_reads_plain_frames_and_refuses_pickled_ones(tmp_path):
    from distributed.protocol import dumps
    from distributed.protocol.serialize import ToPickle

    plain = dumps([{"type": "msgpack", "value": encode({"kind": "done"})}])
    assert decode(refuse_serialized(plain)[0]["value"]) == {"kind": "done"}
    touched = tmp_path / "touched"
    with pytest.raises(UnsafeMessage):
        refuse_serialized(dumps([{"value": ToPickle(Booby(str(touched)))}]))
    assert not touched.exists()
