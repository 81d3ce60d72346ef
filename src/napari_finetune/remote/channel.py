"""The client's own connection for a run's messages: it reads the scheduler's answer as
msgpack and refuses a pickled frame before anything unpickles it.

dask's protocol unpickles a ``__Pickled__`` frame whatever a client's
``deserializers`` say (a worker's message that msgpack cannot carry falls back
to pickle), so the run's queue is not read through a :class:`distributed.Client`:
:class:`MessageChannel` sends the scheduler's ``queue_get`` on a comm of its own
and decodes the reply's frames itself. The messages are ``bytes``
(:func:`~napari_finetune.remote.messages.encode`), which msgpack carries as they
are; anything else in the reply is refused with one line.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from napari_finetune.remote.preflight import RemoteError

if TYPE_CHECKING:
    from distributed import Client


class UnsafeMessage(RemoteError):
    """A message of the run came as a pickled (or otherwise serialized) frame: refused."""


def refuse_serialized(frames: list[Any]) -> Any:
    """The scheduler's reply decoded from its ``frames`` with msgpack alone.

    Raises
    ------
    UnsafeMessage
        A frame is pickled or serialized (dask's ``__Pickled__``/``__Serialized__``)
        or a msgpack extension: it is not opened.
    """

    import msgpack  # type: ignore[import-untyped]  # dask.distributed's own dependency

    def hook(obj: dict[Any, Any]) -> dict[Any, Any]:
        if "__Pickled__" in obj or "__Serialized__" in obj:
            raise UnsafeMessage(
                "refused a message of the remote run: it came pickled (only plain data is "
                "read from the cluster); the worker runs another napari-finetune or "
                "something else writes to the run's queue."
            )
        return obj

    def ext(code: int, data: bytes) -> Any:
        raise UnsafeMessage(f"refused a message of the remote run: a msgpack extension ({code}).")

    return msgpack.loads(bytes(frames[0]), object_hook=hook, ext_hook=ext, raw=False,
                         use_list=True, strict_map_key=False)


async def _read_frames(comm: Any) -> list[Any]:
    """The frames of one message on a TCP or TLS comm, not decoded (as dask's read reads
    them, without its ``from_frames``)."""
    from distributed.comm.core import CommClosedError
    from distributed.comm.tcp import read_bytes_rw
    from distributed.protocol.utils import unpack_frames
    from tornado.iostream import StreamClosedError

    stream = getattr(comm, "stream", None)
    if stream is None:
        raise CommClosedError("the connection to the dask scheduler is closed")
    try:
        (size,) = struct.unpack("Q", await stream.read_bytes(8))
        frames, buffers = unpack_frames(await read_bytes_rw(stream, size), partial=True)
        for nbytes in buffers:
            frames.append(await read_bytes_rw(stream, nbytes))
    except StreamClosedError as exc:
        comm.abort()
        raise CommClosedError(f"the dask scheduler closed the connection ({exc})") from None
    return list(frames)


class MessageChannel:
    """Reads a run's queue on the scheduler of ``client`` over a TCP/TLS comm of its own.

    Parameters
    ----------
    client : distributed.Client
        Gives the scheduler's address, its security and its event loop.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.address = str(client.scheduler.address)
        self._comm: Any = None
        self._opened = False

    async def _connect(self) -> Any:
        from distributed.comm import connect

        if not self.address.startswith(("tcp://", "tls://")):
            raise RemoteError(
                f"the run's messages are read over tcp:// or tls:// only, not {self.address}; "
                "start the cluster with worker processes (LocalCluster(processes=True))."
            )
        args = self.client.security.get_connection_args("client")
        comm = await connect(self.address, deserialize=False, **args)
        comm.name = "napari-finetune messages"
        return comm

    async def _take(self, name: str) -> list[bytes]:
        if self._comm is None or self._comm.closed():
            if self._opened:  # closed under it: the scheduler is gone (no 30 s reconnect)
                from distributed.comm.core import CommClosedError

                raise CommClosedError(f"the connection to the dask scheduler at "
                                      f"{self.address} closed")
            self._comm = await self._connect()
            self._opened = True
        await self._comm.write({"op": "queue_get", "name": name, "batch": True,
                                "reply": True}, serializers=("msgpack",))
        reply = refuse_serialized(await _read_frames(self._comm))
        if isinstance(reply, dict) and reply.get("status") not in (None, "OK"):
            raise RemoteError(f"the dask scheduler could not read the run's queue {name} "
                              f"({reply.get('text') or reply.get('status')}).")
        if not isinstance(reply, list):
            raise UnsafeMessage(f"refused the scheduler's answer for the queue {name}: "
                                f"a {type(reply).__name__}, not a list of messages.")
        values = []
        for record in reply:
            value = record.get("value") if isinstance(record, dict) else None
            if not isinstance(value, bytes):
                raise UnsafeMessage(
                    "refused a message of the remote run: "
                    f"a {type(value).__name__}, not the bytes of a plain message.")
            values.append(value)
        return values

    def take(self, name: str) -> list[dict[str, Any]]:
        """What the queue ``name`` holds now (maybe nothing), each message decoded by
        :func:`~napari_finetune.remote.messages.decode`.

        Raises
        ------
        UnsafeMessage
            Something in the reply is pickled or not plain data (nothing is unpickled).
        OSError, TimeoutError
            The scheduler is gone (dask's ``CommClosedError`` is an ``OSError``).
        """
        from napari_finetune.remote.messages import PlainDataError, decode

        try:
            return [decode(data) for data in self.client.sync(self._take, name)]
        except PlainDataError as exc:
            raise UnsafeMessage(f"refused a message of the remote run: {exc}.") from None

    def close(self) -> None:
        """Close the comm (the scheduler may be gone already)."""
        comm, self._comm = self._comm, None
        if comm is not None and not comm.closed():
            comm.abort()


__all__ = ["MessageChannel", "UnsafeMessage", "refuse_serialized"]
