"""A :class:`Finetuner` whose run happens on a dask.distributed worker; its weights come back.

:class:`RemoteFinetuner` is built like a local run (``RemoteFinetuner.remote``
mirrors ``Finetuner.from_checkpoint``, the patch fitted the same way) and used
like one: :meth:`~RemoteFinetuner.run` yields the worker's
:class:`~napari_finetune.trainer.status.Status` events, :meth:`stop` ends the
run after the step in progress, :meth:`predict` and :meth:`export` use the last
weights the worker sent (adapters merged there, so no PEFT here) with the
worker's run record, which names the host and device that trained. A front
end swaps ``Finetuner.from_checkpoint`` for ``RemoteFinetuner.remote``, nothing else.

Before anything is sent, :mod:`~napari_finetune.remote.preflight` checks the
scheduler, the resources and the versions (one line each). Then one task
(:func:`~napari_finetune.remote.worker.train_on_worker`) gets the checkpoint's
bytes, the painting and the image tiles the patches can reach; the first
status says how many MB that was against the volume's size.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.errors import RecoveryError
from napari_finetune.remote.kept import KEPT_KEY, kept_path, kept_stamp
from napari_finetune.remote.messages import (
    BEST,
    DONE,
    FAILED,
    KEPT,
    LOST,
    PLACED,
    PREVIEW,
    STARTED,
    STATUS,
    WEIGHTS,
    RunInputs,
    RunNames,
    encode,
    region_from_plain,
    region_to_plain,
    status_from_plain,
    weights_from_bytes,
)
from napari_finetune.remote.preflight import (
    CONNECT_TIMEOUT_S,
    RemoteError,
    asked,
    connect,
    eligible_workers,
    matching_versions,
    resources_for,
)
from napari_finetune.trainer import record
from napari_finetune.trainer.loop import Finetuner
from napari_finetune.trainer.status import Status

if TYPE_CHECKING:
    import os

    from distributed import Client, Future, Queue, Security

    from napari_finetune.arrays import AxesImage, VolumeArray
    from napari_finetune.model.checkpoint_format import Checkpoint
    from napari_finetune.remote.channel import MessageChannel
    from napari_finetune.remote.tiles import StoredImage

logger = logging.getLogger(__name__)

# The queue is read without waiting (a get that times out is logged as an error with
# its traceback by the scheduler, several times a second): this often while it is empty.
POLL_S = 0.05
# After this long without a message, whether the worker is still there is asked.
QUIET_S = 1.0
# While a run is queued, how often the scheduler is asked again how many runs are ahead.
RECHECK_QUEUE_S = 5.0
# How long a re-attached run may take to answer (the worker reads requests between steps).
ATTACH_WAIT_S = 60.0


class RemoteWorkerLost(RemoteError):
    """The worker running the fine-tune died or left; the last weights received are kept."""


class SchedulerLost(RemoteError):
    """The dask scheduler stopped answering mid-run; the weights received are kept."""


class RemoteFinetuner(Finetuner):
    """Fine-tunes on a dask worker; holds the last weights and run record it sent back.

    Parameters
    ----------
    model, image, corrections, config, metadata, source_sha256
        As for :class:`~napari_finetune.trainer.loop.Finetuner`; ``config`` is
        the run's, its ``device`` the worker's (this process predicts on its own).
    scheduler : str or distributed.Client
        The scheduler's address (connected when the run starts, closed when it
        ends) or a client to use.
    checkpoint : bytes
        The starting checkpoint file's bytes, ``suffix`` its file suffix.
    trust : sequence of str
        The factories trusted to build the model (as for a local load).
    security : distributed.Security, optional
        TLS for the connection to the scheduler (dask's own).
    weights_every : int
        The worker sends its weights back every this many steps and at the end.
    stop_wait_s : float
        When the run is closed before its end, how long to wait for the
        worker's last weights after asking it to stop.
    connect_timeout_s : float
        How long the scheduler may take to answer before the run is refused.
    store_path : str or path-like, optional
        The store ``image`` was opened from; the workers that open it as the
        same image read it themselves (see :meth:`remote`).
    attach_to : str, optional
        The id of a run already on the scheduler (its client gone): :meth:`run`
        re-attaches to it (:meth:`attach`) instead of sending a new one.

    Attributes
    ----------
    run_record : dict or None
        The worker's record of the weights held (None before the first ones).
    validator.best : BestWeights
        The best validation weights the worker sent (adapters merged), their
        step and score, as a local run keeps its own; the model holds the last.
    worker, bytes_sent, volume_bytes
        The worker that trains; what the inputs weighed against the image.
    placement : str or None
        Where the run is, for a front end: "the dask worker ADDRESS (host H, device
        D)" once the worker built it, or what it waits for while queued ("waiting for
        a worker with a GPU (GPU=1), k runs ahead"); None before either.
    run_id : str or None
        Names the last run's queues and events on the scheduler (None before one).
    store_used : bool
        Whether the worker read the image from ``store_path`` (no tiles sent).
    worker_tuning : dict or None
        How the worker's process trained (``threads``, ``cpus``, ``task_threads``,
        ``allocator``: see :mod:`~napari_finetune.remote.process`).
    preview_step : int or None
        The step whose weights made the preview :meth:`take_preview` returned last.
    status_latency_s : list of float
        Per status, from the worker's put to its arrival here (wall clocks: only
        meaningful when both run on one machine, as in the benchmark).
    """

    def __init__(
        self, model: torch.nn.Module, image: VolumeArray | AxesImage, corrections: VolumeArray,
        config: FinetuneConfig,
        metadata: dict[str, Any] | None = None, source_sha256: str | None = None, *,
        scheduler: str | Client, checkpoint: bytes, suffix: str = ".pt",
        trust: tuple[str, ...] = (), security: Security | None = None,
        weights_every: int = 5, stop_wait_s: float = 60.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        store_path: str | os.PathLike | None = None, attach_to: str | None = None,
    ) -> None:
        # This process only predicts with the weights that come back, on its own device.
        super().__init__(model, image, corrections, dataclasses.replace(config, device="auto"),
                         metadata=metadata, source_sha256=source_sha256)
        self.remote_config = config
        self.scheduler = scheduler
        self.checkpoint = checkpoint
        self.suffix = suffix
        self.trust = tuple(trust)
        self.security = security
        self.weights_every = weights_every
        self.stop_wait_s = stop_wait_s
        self.connect_timeout_s = connect_timeout_s
        # Resolved here, on the laptop: the workers run in other directories, where a
        # relative path names nothing (or another store).
        self.store_path = None if store_path is None else str(Path(store_path).resolve())
        self.store_used = False
        self.run_record: dict[str, Any] | None = None
        self.worker: str | None = None
        self.run_id: str | None = None
        self.bytes_sent = 0
        self.volume_bytes = 0
        self.status_latency_s: list[float] = []
        self.worker_tuning: dict[str, Any] | None = None
        # Preview requests (any thread) wait here for the run's thread to send them;
        # the answers wait for take_preview.
        self._previews_lock = threading.Lock()
        self._preview_asked: tuple[slice, ...] | None = None
        self._preview: tuple[tuple[slice, ...], np.ndarray] | None = None
        self.preview_step: int | None = None
        self._preview_answer_step = 0
        self._preview_failure: str | None = None
        self._kept_on: str | None = None  # the worker holding the run's kept end
        self.placement: str | None = None
        self.attach_to = attach_to

    @classmethod
    def remote(
        cls, checkpoint: Checkpoint, image: VolumeArray | AxesImage, corrections: VolumeArray,
        config: FinetuneConfig,
        scheduler: str | Client, *, trust: tuple[str, ...] = (),
        security: Security | None = None, fit_patch: bool = True, weights_every: int = 5,
        store_path: str | os.PathLike | None = None, attach_to: str | None = None,
    ) -> RemoteFinetuner:
        """The run of ``checkpoint`` on ``image`` on the scheduler's worker (patch fitted as
        :meth:`Finetuner.from_checkpoint` fits it); nothing is sent before :meth:`run`.

        ``image`` with channels or time points comes as an
        :class:`~napari_finetune.arrays.AxesImage` (the model's channels, e.g.
        ``volume.input.for_model(...)``), as for a local run; the worker trains on the
        same channels and the painted time points.

        ``store_path`` is the OME-Zarr store ``image`` was opened from (what
        ``open_volume`` was given): when the workers open that path as an image of
        the same shape, dtype and axes (a shared filesystem), they read it themselves
        (a channel taken of it taken there too) and no tiles are sent; otherwise the
        tiles are sent as without it.

        ``attach_to``: the id of a run whose client went away; :meth:`run` then
        follows it (:meth:`attach`) and sends nothing of its own. ``checkpoint`` must
        be the run's starting checkpoint (its weights come back into its model).
        """
        if fit_patch:
            config = cls.fitted_config(checkpoint.model, image, config)
        path = checkpoint.path
        if path is None or not Path(path).is_file():
            raise ValueError(
                f"the checkpoint {path} is not a file; a remote run sends the file itself: "
                "export the model to a .pt file first."
            )
        return cls(checkpoint.model, image, corrections, config, metadata=checkpoint.metadata,
                   source_sha256=checkpoint.sha256, scheduler=scheduler,
                   checkpoint=Path(path).read_bytes(), suffix=Path(path).suffix or ".pt",
                   trust=trust, security=security, weights_every=weights_every,
                   store_path=store_path, attach_to=attach_to)

    # --- the run -----------------------------------------------------------------------

    def run(self) -> Generator[Status, None, None]:
        """Check, send, then yield the worker's statuses until its run ends (with
        :attr:`attach_to`: re-attach to that run and yield its statuses from where it is).

        Raises
        ------
        RemoteError
            The scheduler, the workers or their versions do not allow the run,
            or the worker failed (its one line); :class:`RemoteWorkerLost` when
            it died (the weights it sent last are kept).
        RecoveryError, FloatingPointError
            As a local run raises them, with the worker's line.
        """
        if self._released:
            raise RuntimeError("this Finetuner was released; build a new one to train again.")
        if self.attach_to is not None:  # a front end runs it as any run: statuses, weights
            yield from self.attach(self.attach_to)
            return
        self._start_time = time.perf_counter()
        if isinstance(self.scheduler, str):
            address = self.scheduler
            client = connect(address, self.security, self.connect_timeout_s)
        else:
            address, client = str(self.scheduler.scheduler.address), self.scheduler
        try:
            resources = resources_for(self.remote_config.device)
            workers = eligible_workers(client, resources, address)
            from napari_finetune.remote.build import versions

            if workers:  # else the run waits for one; the task checks the versions itself
                workers = matching_versions(client, workers, versions())
            stored, workers, image_line = self._image_on(client, workers)
            self._check_size(stored, address)
            inputs = self.inputs(stored)
            self.store_used = stored is not None
            self.bytes_sent = inputs.nbytes
            self.volume_bytes = int(np.prod(self.image.shape)) * np.dtype(self.image.dtype).itemsize
            yield self.status("probe", (
                f"sending {self.bytes_sent / 1e6:.1f} MB to the dask scheduler at {address} "
                f"(the volume is {self.volume_bytes / 1e6:.1f} MB; {image_line}); "
                f"{len(workers)} worker(s) can train it"
                + (f" ({asked(resources)})" if resources else "")
                # Said first: a client that goes away re-attaches to the run by it.
                + f"; run id {inputs.run_id}"))
            yield from self._relay(client, inputs, workers, resources)
        finally:
            if client is not self.scheduler:
                client.close()

    def _image_on(self, client: Client, workers: list[str]
                  ) -> tuple[StoredImage | None, list[str], str]:
        """The stored image when some of ``workers`` open ``store_path`` as this image (then
        only they train), else None; the workers, and how the image gets there in words."""
        from napari_finetune.remote.tiles import StoredImage

        if self.store_path is None or not workers:
            return None, workers, "its tiles around the painting are sent"
        stored = StoredImage.of(self.store_path, self.axes_image)
        answers = client.run(stored.mismatch, workers=workers)
        readers = [w for w in workers if w in answers and answers[w] is None]
        if readers:
            return stored, readers, f"the worker reads it from {self.store_path}"
        why = next((str(a) for a in answers.values() if a), "no worker answered")
        return None, workers, (f"{self.store_path} is not readable on the workers ({why}): "
                               "its tiles around the painting are sent")

    def planned_bytes(self, stored: StoredImage | None = None) -> dict[str, int]:
        """What :meth:`inputs` would send, in bytes, without reading the image: the
        ``checkpoint``, the ``painting`` and the ``image`` tiles (0 when the worker reads
        ``stored`` itself)."""
        from napari_finetune.remote.tiles import ImageTiles, Painting

        painting = Painting.of(self.corrections)
        tiles = 0 if stored is not None else ImageTiles.planned_nbytes(
            self.axes_image, painting, tuple(self.remote_config.patch_shape))
        return {"checkpoint": len(self.checkpoint), "painting": painting.nbytes,
                "image": tiles}

    def _check_size(self, stored: StoredImage | None, address: str) -> None:
        """:class:`RemoteError` (one line) when the run would send more than the config's
        ``max_send_bytes``; nothing was sent yet."""
        cap = int(self.remote_config.max_send_bytes)
        parts = self.planned_bytes(stored)
        total = sum(parts.values())
        if total <= cap:
            return
        volume = int(np.prod(self.image.shape)) * np.dtype(self.image.dtype).itemsize
        raise RemoteError(
            f"the run would send {total / 1e6:.1f} MB to the dask scheduler at {address} "
            f"(checkpoint {parts['checkpoint'] / 1e6:.1f} MB, painting "
            f"{parts['painting'] / 1e6:.1f} MB, image tiles around the painting "
            f"{parts['image'] / 1e6:.1f} MB of a {volume / 1e6:.1f} MB volume), over the cap "
            f"of {cap / 1e6:.1f} MB (max_send_bytes, --max-send-bytes); nothing was sent: "
            "put the store where the workers see it (a shared filesystem; the panel and "
            "train --scheduler pass its path, from Python store_path=), paint in fewer "
            "regions, or raise the cap.")

    def inputs(self, stored: StoredImage | None = None) -> RunInputs:
        """What this run sends (the image tiles are read now, unless the worker reads
        ``stored`` itself): a new run id each call."""
        from napari_finetune.remote.build import versions
        from napari_finetune.remote.tiles import ImageTiles, Painting

        painting = Painting.of(self.corrections)
        tiles = stored if stored is not None else ImageTiles.read(
            self.axes_image, painting, tuple(self.remote_config.patch_shape))
        return RunInputs(
            run_id=uuid.uuid4().hex, checkpoint=self.checkpoint, suffix=self.suffix,
            trust=self.trust, config=self.remote_config,
            # Measured here on the whole image: the worker's tiles would give other ranges.
            normalization_ranges=tuple(self.normalization_ranges), painting=painting,
            image=tiles,
            weights_every=self.weights_every, versions=versions(),
        )

    def _relay(self, client: Client, inputs: RunInputs, workers: list[str],
               resources: Mapping[str, float]) -> Iterator[Status]:
        from distributed import Queue

        from napari_finetune.remote.worker import train_on_worker

        self.run_id = inputs.run_id
        Queue(inputs.queue_name(), client=client)  # made before the task puts on it
        [shipped] = client.scatter([inputs], workers=workers or None)
        future = client.submit(
            train_on_worker, shipped, key=f"napari-finetune-train-{inputs.run_id}",
            resources=dict(resources) or None, workers=workers or None,
            allow_other_workers=False, pure=False,
        )
        yield from self._follow(client, inputs, future, workers, resources)

    def attach(self, run_id: str) -> Generator[Status, None, None]:
        """Re-attach to the run ``run_id`` (its :attr:`run_id`), whose client is gone (a
        laptop that slept, a napari that was killed), and yield its statuses from where
        it is.

        Nothing is sent but the request: this client is the run's reader from now
        on. A run still within its grace period (the config's ``remote_grace_s``)
        answers with where it is and its weights so far, then goes on as a run of
        this client would (:meth:`stop`, previews, the weights at its end); a run
        that stopped when its grace ran out sends the last weights its worker kept.

        Parameters
        ----------
        run_id : str
            The run's id, as its first client held it (:attr:`run_id`).

        Raises
        ------
        RemoteError
            The scheduler knows no such run (it ended and its end was read, or the
            scheduler restarted), or nothing answered in time.
        """
        from distributed import Queue

        from napari_finetune.remote.messages import RunNames
        from napari_finetune.remote.worker import run_leftovers

        if self._released:
            raise RuntimeError("this Finetuner was released; build a new one to re-attach.")
        self.run_id = str(run_id)
        self._start_time = time.perf_counter()
        if isinstance(self.scheduler, str):
            address = self.scheduler
            client = connect(address, self.security, self.connect_timeout_s)
        else:
            address, client = str(self.scheduler.scheduler.address), self.scheduler
        try:
            names = RunNames(self.run_id)
            held = client.run_on_scheduler(run_leftovers, run_id=self.run_id)
            if not isinstance(held, list) or names.queue_name() not in held:
                raise RemoteError(
                    f"the dask scheduler at {address} holds no run {self.run_id}: it ended "
                    "and its end was read already, or the scheduler restarted (a run's kept "
                    "weights are found through the scheduler).")
            Queue(names.attach_name(), client=client).put(encode({"client": str(client.id)}))
            yield self.status("probe", f"re-attaching to the run {self.run_id} on the dask "
                                       f"scheduler at {address}")
            yield from self._follow(client, names, None, [], {})
        finally:
            if client is not self.scheduler:
                client.close()

    def _follow(self, client: Client, names: RunNames, future: Future | None,
                workers: list[str], resources: Mapping[str, float]) -> Iterator[Status]:
        """Read the run's queue until its end: the statuses yielded, the weights held.

        ``future`` is the run's task (None for a client that re-attached: the task
        is no longer its to watch)."""
        from distributed import Event, Queue

        from napari_finetune.remote.channel import MessageChannel

        messages = MessageChannel(client)
        name = names.queue_name()
        previews = Queue(names.preview_name(), client=client)
        stop = Event(names.stop_name(), client=client)
        fetching: Future | None = None  # the task that sends kept weights on (held: a
        # released future's task is cancelled)
        ended = stop_sent = lost = said_waiting = False
        heard = submitted = asked_at = time.monotonic()
        wait_s = float(self.remote_config.queue_timeout_s) if future is not None else ATTACH_WAIT_S
        pending: deque[dict[str, Any]] = deque()  # taken from the queue, not yet applied
        self._kept_on = None
        try:
            while not ended:
                if self.worker is None and not pending:  # queued: no worker took it yet
                    if self._stop.is_set():
                        ended = True  # Stop or Ctrl-C while queued ends it at once
                        break
                    waited = time.monotonic() - submitted
                    if future is not None and not said_waiting and (not workers or (
                            waited > QUIET_S and self._queued(client, future))):
                        said_waiting, asked_at = True, time.monotonic()
                        line = self._waiting_line(client, resources, wait_s, future)
                        self.placement = line.split(", on the dask scheduler")[0]
                        yield self.status("probe", line)
                    elif said_waiting and future is not None \
                            and time.monotonic() - asked_at > RECHECK_QUEUE_S \
                            and self._queued(client, future):
                        # Runs ahead end or stop: the wait is said anew when it changed.
                        asked_at = time.monotonic()
                        line = self._waiting_line(client, resources, wait_s, future)
                        if line.split(", on the dask scheduler")[0] != self.placement:
                            self.placement = line.split(", on the dask scheduler")[0]
                            yield self.status("probe", line)
                    if waited > wait_s:
                        raise RemoteError(
                            self._queue_timeout_line(client, resources, wait_s)
                            if future is not None else
                            f"the run {names.run_id} did not answer within {wait_s:g} s: its "
                            "dask worker is gone or busy with a step.")
                if self._stop.is_set() and not stop_sent:
                    stop.set()  # read by the worker after the step in progress
                    stop_sent = True
                self._send_preview_request(previews)
                if self._kept_on is not None and fetching is None:
                    fetching = self._fetch(client, names, self._kept_on)
                if not pending:
                    pending.extend(messages.take(name))  # maybe nothing
                if not pending:
                    if time.monotonic() - heard > QUIET_S:
                        self._check_alive(client, future)
                        heard = time.monotonic()
                    time.sleep(POLL_S)
                    continue
                heard = time.monotonic()
                message = pending.popleft()
                ended = self._take(message)
                if message["kind"] == STATUS:
                    self.status_latency_s.append(time.time() - message["sent"])
                    yield status_from_plain(message["status"])
                elif message["kind"] == PLACED:
                    yield self.status("probe", f"training on {self.placement}")
        except (OSError, TimeoutError) as exc:  # dask's CommClosedError is an OSError
            lost = True
            raise SchedulerLost(self._scheduler_lost_line(messages.address, exc)) from None
        except GeneratorExit:
            # Closed before the end (napari's Stop, the viewer closing): the worker
            # stops after its step and its last weights still come back.
            stop.set()
            self._drain(messages, name, pending, time.monotonic() + self.stop_wait_s)
            ended = True
            raise
        finally:
            if not ended and not lost:
                try:
                    stop.set()  # a running task cannot be cancelled: it stops itself
                except Exception:  # the scheduler may be gone: nothing else to tell it
                    pass
            messages.close()
            if not lost:
                self._forget(client, future, names)

    def _fetch(self, client: Client, names: RunNames, worker: str) -> Future:
        """Ask ``worker``, which kept the run's last messages, to send them on."""
        from napari_finetune.remote.worker import fetch_kept

        if worker not in client.scheduler_info(n_workers=-1)["workers"]:
            raise RemoteWorkerLost(
                f"the dask worker {worker} that kept the weights of the run {names.run_id} "
                "is gone: they went with it.")
        return client.submit(fetch_kept, names.run_id, workers=[worker],
                             allow_other_workers=False, pure=False,
                             key=f"napari-finetune-fetch-{names.run_id}-{uuid.uuid4().hex[:8]}")

    @staticmethod
    def _forget(client: Client, future: Future | None, names: RunNames) -> None:
        """However the run ended: no retry of its task, and its queues and events are
        deleted on the scheduler (a task still running ends at its next message)."""
        from napari_finetune.remote.worker import forget_run

        try:
            if future is not None:  # a running task goes on; a retry not started never starts
                future.cancel()
            client.run_on_scheduler(forget_run, queues=names.queue_names(),
                                    events=names.event_names())
        except Exception:  # the scheduler went away meanwhile: nothing is left there
            pass

    def _check_alive(self, client: Client, future: Future | None) -> None:
        """:class:`RemoteError` with the worker's exception when the task failed (read on
        the scheduler as text), :class:`RemoteWorkerLost` when its worker left."""
        if future is not None and future.status == "error":
            from napari_finetune.remote.worker import task_error

            text = client.run_on_scheduler(task_error, key=str(future.key))
            if isinstance(text, str) and text.strip():
                raise RemoteError(self._failed_line(text.strip().splitlines()[0], None))
        if (future is not None and future.status in ("error", "cancelled", "lost")) or (
            self.worker is not None
            and self.worker not in client.scheduler_info(n_workers=-1)["workers"]
        ):
            raise RemoteWorkerLost(self._lost_line())

    def _take(self, message: dict[str, Any]) -> bool:
        """Apply one message; True when it ended the run (an error raises)."""
        kind = message["kind"]
        if kind == STARTED:
            self.worker = message["worker"]
            self.worker_tuning = dict(message["tuning"])
        elif kind == PLACED:
            self.worker = message["worker"]
            self.placement = (f"the dask worker {message['worker']} (host {message['host']}, "
                              f"device {message['device']})")
        elif kind == WEIGHTS:
            self._receive(message)
        elif kind == BEST:
            self._receive_best(message)
        elif kind == PREVIEW:
            with self._previews_lock:
                if "error" in message:
                    self._preview_failure = str(message["error"])
                else:
                    self._preview = (region_from_plain(message["region"]),
                                     np.asarray(message["probabilities"], dtype=np.float32))
                    self._preview_answer_step = int(message["step"])
        elif kind == FAILED:
            kinds: dict[str, type[Exception]] = {
                "RecoveryError": RecoveryError, "FloatingPointError": FloatingPointError,
            }
            kind_of = kinds.get(message["type"])
            if kind_of is not None:  # the command line names these failures itself
                raise kind_of(message["line"])
            raise RemoteError(self._failed_line(f"{message['type']}: {message['line']}",
                                                message.get("worker")))
        elif kind == LOST:
            raise RemoteWorkerLost(self._lost_line())
        elif kind == KEPT:  # the run ended unread: its worker sends the kept end on asking
            self._kept_on = str(message["worker"])
        return kind == DONE

    def _drain(self, messages: MessageChannel, name: str, pending: deque[dict[str, Any]],
               deadline: float) -> None:
        """Apply ``pending``, then the queue's messages, until the run's end or ``deadline``
        (no statuses are shown)."""
        while time.monotonic() < deadline:
            if not pending:
                try:
                    pending.extend(messages.take(name))
                except Exception:  # the scheduler went away, a refused message: keep what came
                    return
            if not pending:
                time.sleep(POLL_S)
                continue
            try:
                if self._take(pending.popleft()):
                    return
            except Exception:  # a failure or a lost worker: the weights received stay
                return

    def _receive(self, message: dict[str, Any]) -> None:
        weights = weights_from_bytes(message["weights"])
        with self.lock:
            self.model.load_state_dict(weights)
            self.state.steps_done = int(message["steps_done"])
            self.state.last_loss = message["loss"]
            self.run_record = message["record"]
            self.ended = message["ended"]

    # --- previews on the worker --------------------------------------------------------

    def request_preview(self, region: tuple[slice, ...]) -> None:
        """Ask the worker for ``region``'s probabilities after its next optimizer step.

        Returns at once (safe on napari's main thread): the run's own thread
        sends the request, with the region's raw pixels when the worker has not
        the store to read them from. A newer request replaces one not sent yet;
        :meth:`take_preview` gives the answer.

        Parameters
        ----------
        region : tuple of slice
            A box of the image (unit steps), as for :meth:`predict`.
        """
        # A region indexes the painting: an image's axes without channels (a time point
        # first), as for a local run's predict.
        shape = self.axes_image.labels_shape
        if not (isinstance(region, tuple) and len(region) == len(shape)
                and all(isinstance(r, slice) and r.step in (None, 1) for r in region)):
            raise ValueError(
                f"a preview region is {len(shape)} unit-step slices of the image's painting "
                f"{shape}, not {region!r}; pass e.g. (slice(0, 8),) * {len(shape)}.")
        box = tuple(slice(*r.indices(n)[:2]) for r, n in zip(region, shape, strict=True))
        if any(b.stop <= b.start for b in box):
            raise ValueError(f"the preview region {region!r} is empty in the image's painting "
                             f"{shape}; ask for a box inside it.")
        with self._previews_lock:
            self._preview_asked = box

    def take_preview(self) -> tuple[tuple[slice, ...], np.ndarray] | None:
        """The latest preview that came back, once: its region and the ``(C, *region)``
        float32 probabilities :meth:`predict` would give with the weights of step
        :attr:`preview_step`; None when none came since the last call."""
        with self._previews_lock:
            preview, self._preview = self._preview, None
            if preview is not None:
                self.preview_step = self._preview_answer_step
            return preview

    def take_preview_failure(self) -> str | None:
        """Why the worker could not compute the preview asked last (its error's type and
        first line), once; None when none failed since the last call. The run goes on."""
        with self._previews_lock:
            failure, self._preview_failure = self._preview_failure, None
            return failure

    def _send_preview_request(self, previews: Queue) -> None:
        """Send the request waiting, if any (in the run's thread: it reads and sends)."""
        with self._previews_lock:
            region, self._preview_asked = self._preview_asked, None
        if region is None:
            return
        request: dict[str, Any] = {"region": region_to_plain(region)}
        if not self.store_used:  # the worker has only the tiles around the painting
            # (C, *spatial) of one time point, as a local run's predict reads it.
            request["crop"] = (np.asarray(self.image[region]) if self.axes_image.is_plain
                               else self.axes_image.read(region))
        previews.put(encode(request))

    def _receive_best(self, message: dict[str, Any]) -> None:
        """Hold the worker's best validation weights where a local run holds its own."""
        best = self.validator.best
        with self.lock:
            best.state = weights_from_bytes(message["weights"])
            best.step, best.score = int(message["step"]), float(message["score"])

    def _failed_line(self, what: str, worker: str | None) -> str:
        where = worker or self.worker or "(not started)"
        kept = (f"; the weights of step {self.steps_done} it sent last are kept"
                if self.run_record is not None else "")
        return f"the fine-tune failed on the dask worker {where}: {what}{kept}"

    @staticmethod
    def _queued(client: Client, future: Future) -> bool:
        """Whether the scheduler holds the task for want of a worker (not on one yet)."""
        from napari_finetune.remote.worker import waits_for_a_worker

        return client.run_on_scheduler(waits_for_a_worker, key=str(future.key)) is True

    def _waiting_line(self, client: Client, resources: Mapping[str, float],
                      wait_s: float, future: Future) -> str:
        from napari_finetune.remote.worker import runs_ahead

        what = "a worker with a GPU" if "GPU" in resources else "a free worker"
        ahead = client.run_on_scheduler(runs_ahead, key=str(future.key))
        ahead = int(ahead) if isinstance(ahead, int) else 0
        return (f"waiting for {what} ({asked(resources) or 'no resources'}), {ahead} "
                f"run{'' if ahead == 1 else 's'} ahead, on the dask "
                f"scheduler at {client.scheduler.address}: none is free yet; up to {wait_s:g} s "
                "(--queue-timeout-s), Ctrl-C or Stop ends the wait")

    def _queue_timeout_line(self, client: Client, resources: Mapping[str, float],
                            wait_s: float) -> str:
        address = client.scheduler.address
        if "GPU" in resources:
            return (f"no worker with a free GPU ({asked(resources)}) of the dask scheduler at "
                    f"{address} took the run within {wait_s:g} s; start one (dask worker "
                    f"{address} --resources {asked(resources)}), wait longer "
                    "(--queue-timeout-s) or train on a worker's CPU with --device cpu.")
        return (f"no worker of the dask scheduler at {address} took the run within "
                f"{wait_s:g} s (all busy); wait longer (--queue-timeout-s) or start one.")

    def _scheduler_lost_line(self, address: str, exc: BaseException) -> str:
        from napari_finetune.errors import first_line

        # A dropped connection is not a dead scheduler: the worker trains on for the
        # grace period, and the run's id is what re-attaches to it.
        grace = float(self.remote_config.remote_grace_s)
        again = (f"; if the scheduler is still up, the worker trains on for {grace:g} s "
                 f"(remote_grace_s): re-attach to the run {self.run_id} for its weights "
                 f"(the same train command with --attach {self.run_id}, or "
                 "RemoteFinetuner.attach)" if grace > 0 and self.run_id else "")
        return (
            f"the dask scheduler at {address} was lost ({type(exc).__name__}: "
            f"{first_line(exc) or 'no answer'}); the weights of step {self.steps_done} "
            f"received last are kept: export them and fine-tune from them to continue{again}."
        )

    def _lost_line(self) -> str:
        return (
            f"the dask worker {self.worker or '(not started)'} running the fine-tune was lost; "
            f"the weights of step {self.steps_done} it sent last are kept: export them and "
            "fine-tune from them to continue."
        )

    # --- using the weights -------------------------------------------------------------

    def keep_beside(self, store: str | os.PathLike) -> Path | None:
        """After a run that ended before its last step (Stop, napari closed, the worker or
        the scheduler lost, a failure): write the weights received last beside ``store``,
        as :func:`kept_path` names it, so they outlive the process; the path, or None when
        the run finished, none came back, or the file could not be written (logged)."""
        if self.run_record is None or self.steps_done >= self.remote_config.steps:
            return None
        path = kept_path(store)
        try:
            # Stamped with its store and run: the next start offers it for that store only.
            self.export(path, metadata={KEPT_KEY: kept_stamp(store, self.run_id)})
        except (OSError, RuntimeError) as exc:  # a store on a URL, a full disk: logged
            logger.warning("the remote run's last weights were not kept at %s: %s", path, exc)
            return None
        logger.info("the remote run's weights of step %d kept at %s", self.steps_done, path)
        return path

    def export(
        self, path: str | os.PathLike, ended: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> os.PathLike:
        """Write the weights received last with the worker's run record (as a local export)."""
        if self.run_record is None:
            raise RuntimeError("no weights came back from the dask worker yet: nothing to export.")
        with self.lock:
            return record.write_export(self.model, self.metadata, self.out_channels,
                                       self.run_record, path, ended or self.ended, metadata)

    def export_best(self, path: str | os.PathLike, ended: str) -> os.PathLike | None:
        """Write the best validation weights received (their step in the record), when
        they are not the last ones held; None when there are none to write.

        Parameters
        ----------
        path : path-like
            Destination file.
        ended : str
            How the run ended (the record's ``"ended"`` names the best step besides).
        """
        import copy

        best = self.validator.best
        if self.run_record is None or best.step is None or not best.state \
                or best.step == self.steps_done:
            return None
        with self.lock:
            model = copy.deepcopy(self.model)
            model.load_state_dict(best.state)
            run = {**self.run_record, "steps_done": int(best.step)}
            return record.write_export(
                model, self.metadata, self.out_channels, run, path,
                f"best validation weights (step {best.step}, score {best.score:.3f}) of a run: "
                f"{ended}")


__all__ = ["RemoteFinetuner", "RemoteWorkerLost", "SchedulerLost", "kept_path"]
