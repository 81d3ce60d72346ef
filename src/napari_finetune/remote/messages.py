"""What travels between the client and the worker of a remote run, as plain data.

Every message is one ``bytes`` object, msgpack of plain types (:func:`encode`):
statuses as dicts (the worker's :class:`Status`, field by field), arrays as
their raw bytes with dtype and shape, weights as ``torch.save`` bytes of a state
dict, read back with ``torch.load(weights_only=True)`` like any checkpoint. The
client reads the run's queue over a connection of its own that refuses a
pickled frame (:mod:`~napari_finetune.remote.channel`) and decodes the bytes with
msgpack alone (:func:`decode`), so nothing the worker sends is unpickled here.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_finetune.config import FinetuneConfig
from napari_finetune.remote.tiles import ImageTiles, Painting, StoredImage
from napari_finetune.trainer.status import Status

# Message kinds on the run's queue, worker -> client.
STARTED, STATUS, WEIGHTS, FAILED, DONE, LOST = (
    "started", "status", "weights", "failed", "done", "lost"
)
BEST = "best"  # the best validation weights so far, their step and score
PREVIEW = "preview"  # probabilities of a region the client asked for, after a step
# The run ended with its client gone past the grace period; its last weights wait on the
# worker named here (fetch_kept sends them on).
KEPT = "kept"
PLACED = "placed"  # the run is built on the worker: its host and torch device


ARRAY = "__napari_finetune_array__"  # marks an array's dict: dtype, shape, raw bytes


class PlainDataError(ValueError):
    """A message is not plain data (a pickled object, an object array, an unknown type)."""


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars as msgpack-able values (tuples as lists)."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise PlainDataError(f"an array of {value.dtype} is not plain data")
        array = np.ascontiguousarray(value)
        return {ARRAY: True, "dtype": array.dtype.str, "shape": list(array.shape),
                "data": array.tobytes()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _array(plain: dict[str, Any]) -> Any:
    if plain.get(ARRAY) is not True:
        return plain
    dtype = np.dtype(plain["dtype"])
    if dtype.hasobject:
        raise PlainDataError(f"an array of {dtype} is not plain data")
    shape = tuple(int(n) for n in plain["shape"])
    return np.frombuffer(plain["data"], dtype=dtype).reshape(shape).copy()


def encode(message: dict[str, Any]) -> bytes:
    """``message`` as msgpack bytes: plain types, arrays as dtype, shape and raw bytes.

    Raises
    ------
    PlainDataError
        A value msgpack cannot carry without pickle.
    """
    import msgpack  # type: ignore[import-untyped]  # dask.distributed's own dependency

    try:
        return msgpack.packb(_plain(message), use_bin_type=True)
    except TypeError as exc:
        raise PlainDataError(f"a message of the run is not plain data ({exc})") from None


def decode(data: bytes) -> dict[str, Any]:
    """The message :func:`encode` wrote, read with msgpack alone (no extension types).

    Raises
    ------
    PlainDataError
        ``data`` is not a plain message.
    """
    import msgpack

    def ext(code: int, payload: bytes) -> Any:
        raise PlainDataError(f"a msgpack extension ({code}) is not plain data")

    try:
        message = msgpack.unpackb(data, raw=False, object_hook=_array, ext_hook=ext,
                                  strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        if isinstance(exc, PlainDataError):
            raise
        raise PlainDataError(f"a message of the run is not msgpack ({exc})") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind", ""), str):
        raise PlainDataError(f"a message of the run is a {type(message).__name__}, not a dict")
    return message


def status_to_plain(status: Status) -> dict[str, Any]:
    """``status`` as a dict of plain types."""
    return dataclasses.asdict(status)


def status_from_plain(plain: dict[str, Any]) -> Status:
    """The :class:`Status` a worker sent."""
    names = {f.name for f in dataclasses.fields(Status)}
    return Status(**{k: v for k, v in plain.items() if k in names})


def weights_to_bytes(state_dict: dict[str, Any]) -> bytes:
    """A state dict as ``torch.save`` bytes (tensors moved to the CPU)."""
    import torch

    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
    return buffer.getvalue()


def weights_from_bytes(data: bytes) -> dict[str, Any]:
    """A state dict from :func:`weights_to_bytes`'s bytes, read with ``weights_only=True``."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def region_to_plain(region: tuple[slice, ...]) -> list[list[int]]:
    """A box of unit-step slices as ``[[start, stop], ...]``."""
    return [[int(r.start), int(r.stop)] for r in region]


def region_from_plain(plain: list[list[int]]) -> tuple[slice, ...]:
    """The box :func:`region_to_plain` wrote."""
    return tuple(slice(start, stop) for start, stop in plain)


@dataclass(frozen=True)
class RunNames:
    """The names of one run's queues and events on the scheduler, from its id alone (a
    client that re-attaches to a run knows nothing else of it).

    Attributes
    ----------
    run_id : str
        The run's id (:attr:`RemoteFinetuner.run_id
        <napari_finetune.remote.finetuner.RemoteFinetuner.run_id>`).
    """

    run_id: str

    def queue_name(self) -> str:
        """The run's message queue, worker -> client."""
        return f"napari-finetune-{self.run_id}-messages"

    def stop_name(self) -> str:
        """The run's Stop event, client -> worker."""
        return f"napari-finetune-{self.run_id}-stop"

    def preview_name(self) -> str:
        """The run's preview requests, client -> worker."""
        return f"napari-finetune-{self.run_id}-previews"

    def attach_name(self) -> str:
        """The run's re-attach requests, client -> worker: the id of the client that reads
        the run from now on."""
        return f"napari-finetune-{self.run_id}-attach"

    def started_name(self) -> str:
        """Set by the task when it starts: a second start is a retry after a lost worker."""
        return f"napari-finetune-{self.run_id}-started"

    def queue_names(self) -> list[str]:
        """The run's queues on the scheduler."""
        return [self.queue_name(), self.preview_name(), self.attach_name()]

    def event_names(self) -> list[str]:
        """The run's events on the scheduler."""
        return [self.stop_name(), self.started_name()]


@dataclass(frozen=True)
class RunInputs(RunNames):
    """Everything one remote run needs, sent with its task.

    Attributes
    ----------
    run_id : str
        Names the run's queue and events on the scheduler.
    checkpoint : bytes
        The starting checkpoint file's bytes; ``suffix`` is its file suffix.
    trust : tuple of str
        The factories the user trusts (as for a local load).
    config : FinetuneConfig
        The run's settings, the patch already fitted on the client.
    normalization_ranges : tuple of (float, float)
        The image's intensity range per input channel (one pair for one channel),
        measured on the whole image on the client.
    painting : Painting
        The painted voxels.
    image : ImageTiles or StoredImage
        The image tiles the patches can reach, or the store path the worker
        reads the image from itself (checked there before the run is sent).
    weights_every : int
        Send the weights back every this many steps (and at the end, always).
    versions : dict
        The client's torch, napari-finetune and build (the task refuses to train
        with other ones; empty: not checked).
    """

    checkpoint: bytes
    suffix: str
    trust: tuple[str, ...]
    config: FinetuneConfig
    normalization_ranges: tuple[tuple[float, float], ...]
    painting: Painting
    image: ImageTiles | StoredImage
    weights_every: int = 5
    versions: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the payload (checkpoint, painting, image tiles or none)."""
        return len(self.checkpoint) + self.painting.nbytes + self.image.nbytes
