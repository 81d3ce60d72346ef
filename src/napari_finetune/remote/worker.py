"""The worker side of a remote run: one dask task that trains and reports through a Queue.

:func:`train_on_worker` loads the shipped checkpoint, builds the run with
:class:`~napari_finetune.trainer.loop.Finetuner` on the painting and the image
tiles it was sent, and puts every :class:`Status` (as plain data) on the run's
``distributed.Queue``. Between steps it reads the run's ``distributed.Event``:
a running task cannot be cancelled, so Stop is cooperative and ends the run
after the step in progress. Every ``weights_every`` steps, and at the end
however the run ended, it sends the weights (adapters merged) and the run
record, which names the host and device that trained.

A worker whose client is gone (its process killed, a laptop asleep: the
scheduler released the task) trains on for the config's ``remote_grace_s``,
sending nothing meanwhile: a client that re-attaches to the run by its id (a
request on the run's attach queue) gets its status and weights at once and
reads the run from there. When the grace runs out, or the run ends with nobody
reading it, its last messages (status, weights, best weights, how it ended) are
kept in a file of the worker's local directory, a small ``kept`` note on the
run's queue names the worker, and :func:`fetch_kept` sends them to the client
that asks.

dask retries a task whose worker died from scratch; a retry of a run would
report steps the client already saw from another start, so a second start
only says the first worker was lost (the client keeps the last weights it
received, and a new run can continue from them).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_finetune.errors import first_line, one_line
from napari_finetune.remote.build import versions
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
    decode,
    encode,
    region_from_plain,
    status_to_plain,
    weights_to_bytes,
)

if TYPE_CHECKING:
    from pathlib import Path

    from distributed import Event, Queue

    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.status import Status

# How often the worker asks whether its client is still there (a scheduler round trip).
CHECK_CLIENT_S = 1.0


class Outbox:
    """The run's queue, worker -> client: each message goes as :func:`encode`'s bytes."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def put(self, message: dict[str, Any]) -> None:
        """Send ``message`` (plain data; a value that is not raises ``PlainDataError``)."""
        self.queue.put(encode(message))


class ClientLink:
    """Who reads the run, and since when nobody has.

    The client that submitted the task is there while the scheduler holds the task
    (a local check); a client that re-attached is there while the scheduler knows
    its id (a round trip, at most every :data:`CHECK_CLIENT_S`).

    Parameters
    ----------
    names : RunNames
        The run's queues (its attach requests are read here).
    grace_s : float
        How long the run goes on with nobody reading it.
    messages : Outbox
        The run's messages: emptied when nobody reads them (the scheduler holds them).
    """

    def __init__(self, names: RunNames, grace_s: float, messages: Outbox) -> None:
        from distributed import Queue

        self.messages = messages
        self.grace_s = float(grace_s)
        self.reader: str | None = None  # None: the client that submitted the task
        self.gone_since: float | None = None
        self.checked = -float("inf")
        self.requests = Queue(names.attach_name())

    @property
    def attached(self) -> bool:
        """Whether a client reads the run (as far as the last check knows)."""
        return self.gone_since is None

    def expired(self) -> bool:
        """Whether nobody has read the run for the grace period."""
        return self.gone_since is not None and time.monotonic() - self.gone_since >= self.grace_s

    def check(self, force: bool = False) -> bool:
        """Look for a re-attach request and for the reader; True when a client has just
        re-attached (it is owed the run's state)."""
        now = time.monotonic()
        if not force and now - self.checked < CHECK_CLIENT_S:
            return False
        self.checked = now
        requests = self.requests.get(batch=True)  # what is there now, maybe nothing
        if requests:
            self.reader = str(decode(requests[-1])["client"])
            self.gone_since = None
            return True
        if self.gone_since is None and not self._present():
            self.gone_since = now
            # Unread weights would sit in the scheduler's memory; a client that
            # re-attaches gets the run's state afresh.
            self.messages.queue.get(batch=True)
        return False

    def _present(self) -> bool:
        if self.reader is None:
            return not _abandoned()
        from distributed import get_client

        return get_client().run_on_scheduler(client_present, client_id=self.reader) is True


def client_present(dask_scheduler: Any, client_id: str) -> bool:
    """On the scheduler: whether the client ``client_id`` is connected."""
    return client_id in dask_scheduler.clients


def kept_file(run_id: str) -> Path:
    """Where this worker keeps the last messages of ``run_id`` when nobody read its end."""
    from pathlib import Path

    from distributed import get_worker

    return Path(get_worker().local_directory) / f"napari-finetune-kept-{run_id}.msgpack"


def fetch_kept(run_id: str) -> str:
    """On the worker that kept ``run_id``'s last messages: put them on the run's queue for
    the client that asked (and delete the file); how it went, in a word."""
    import msgpack  # type: ignore[import-untyped]  # dask.distributed's own dependency
    from distributed import Queue, get_worker

    queue = Queue(RunNames(run_id).queue_name())
    path = kept_file(run_id)
    try:
        kept = msgpack.unpackb(path.read_bytes(), raw=False)
    except FileNotFoundError:
        queue.put(encode({
            "kind": FAILED, "type": "RemoteError", "worker": get_worker().address,
            "line": f"the weights of the run {run_id} are no longer on the dask worker "
                    f"{get_worker().address} (it restarted, or another client fetched them)"}))
        return "missing"
    for message in kept:
        queue.put(message)
    path.unlink()
    return "fetched"


def forget_run(dask_scheduler: Any, queues: list[str], events: list[str]) -> None:
    """On the scheduler: delete the run's queues and events, whatever holds them.

    A queue lives until every handle that made it is closed, and a task whose
    worker died never closes its own, so they are taken from the scheduler's
    extensions by name (the queues hold plain messages only, no futures).
    """
    extensions = dask_scheduler.extensions
    queued = extensions.get("queues")
    for name in queues if queued is not None else ():
        queued.queues.pop(name, None)
        queued.client_refcount.pop(name, None)
    flagged = extensions.get("events")
    for name in events if flagged is not None else ():
        flagged._delete_event(name)  # what Event.clear does when nobody waits


def run_leftovers(dask_scheduler: Any, run_id: str) -> list[str]:
    """On the scheduler: the names of the queues and events of ``run_id`` still there."""
    extensions = dask_scheduler.extensions
    names = [*extensions["queues"].queues, *extensions["events"]._events]
    return sorted(str(n) for n in names if run_id in str(n))


def train_on_worker(inputs: RunInputs) -> str:
    """Run the fine-tune on this worker; returns how it ended (the messages said the rest)."""
    from distributed import Event, Queue, get_worker

    messages = Outbox(Queue(inputs.queue_name()))
    started = Event(inputs.started_name())
    address = get_worker().address
    if started.is_set():  # a retry after the first worker died: never train twice
        messages.put({"kind": LOST, "worker": address})
        return "lost"
    started.set()
    from napari_finetune.remote.preflight import version_mismatch

    mismatch = version_mismatch(f"the worker {address}", versions(), "the client",
                                dict(inputs.versions))
    if inputs.versions and mismatch is not None:  # the client's code is not this code
        messages.put({"kind": FAILED, "type": "RemoteError", "line": mismatch,
                      "worker": address})
        return "failed"
    from napari_finetune.remote.process import training_process

    try:
        with training_process(get_worker().state.nthreads) as tuning:
            hello = {"kind": STARTED, "worker": address, "host": socket.gethostname(),
                     "tuning": dataclasses.asdict(tuning)}
            messages.put(hello)
            link = ClientLink(inputs, float(inputs.config.remote_grace_s), messages)
            return _train(inputs, messages, Event(inputs.stop_name()), address,
                          Queue(inputs.preview_name()), link, hello)
    except Exception as exc:  # outside the training loop: its own type and line, not "lost"
        messages.put({**_failed(exc), "worker": address})
        if _abandoned():  # nobody reads the run any more: nothing of it stays behind
            _forget_from_worker(inputs.queue_names(), inputs.event_names())
        return "failed"


def runs_ahead(dask_scheduler: Any, key: str) -> int:
    """On the scheduler: how many other fine-tunes the task ``key`` waits behind (those
    running or submitted before it, not yet done)."""
    task = dask_scheduler.tasks.get(key)
    if task is None:
        return 0
    return sum(1 for other in dask_scheduler.tasks.values()
               if other is not task and str(other.key).startswith("napari-finetune-train-")
               and other.state in ("processing", "no-worker", "queued")
               and other.priority < task.priority)


def task_error(dask_scheduler: Any, key: str) -> str | None:
    """On the scheduler: the exception of the task ``key`` that erred, as dask's text
    (its type and message), or None (a string: nothing pickled comes back)."""
    task = dask_scheduler.tasks.get(key)
    if task is None or task.state != "erred":
        return None
    blame = task.exception_blame or task
    return str(blame.exception_text or "") or None


def waits_for_a_worker(dask_scheduler: Any, key: str) -> bool:
    """On the scheduler: whether the task ``key`` waits for a worker with its resources
    free: held by the scheduler ("no-worker", "queued"), or given to a worker whose
    resources its tasks oversubscribe (dask assigns a task before the worker's GPU is
    free, and the worker holds it until then)."""
    task = dask_scheduler.tasks.get(key)
    if task is None:
        return False
    if task.state in ("no-worker", "queued"):
        return True
    worker = task.processing_on
    if task.state != "processing" or worker is None:
        return False
    return any(worker.used_resources.get(name, 0) > worker.resources.get(name, 0)
               for name in (task.resource_restrictions or {}))


def _abandoned() -> bool:
    """Whether the scheduler released this task: its client left (or cancelled it)."""
    from distributed import get_worker

    worker = get_worker()
    task = worker.state.tasks.get(worker.get_current_task())
    return task is None or task.state in ("cancelled", "released", "forgotten")


def _forget_from_worker(queues: list[str], events: list[str]) -> None:
    from distributed import get_client

    try:
        get_client().run_on_scheduler(forget_run, queues=queues, events=events)
    except Exception:  # the scheduler is gone: nothing is left there
        pass


def _train(inputs: RunInputs, messages: Outbox, stop: Event, address: str,
           previews: Queue, link: ClientLink, hello: dict[str, Any]) -> str:
    """Build and run the fine-tune, sending its statuses and weights while a client reads
    them (else keeping them); how it ended."""
    try:
        trainer = _build(inputs)
    except Exception as exc:  # a bad input: one line, nothing trained
        messages.put(_failed(exc))
        return "failed"
    # Where it trains, for the panel; sent again to a client that re-attaches.
    placed = {**hello, "kind": PLACED, "device": str(trainer.device)}
    messages.put(placed)
    ended = "finished"
    every = max(1, inputs.weights_every)
    best_sent: int | None = None  # the step of the best weights sent last
    last: dict[str, Any] | None = None  # the last status, for a client that re-attaches
    try:
        for status in trainer.run():
            # When it left (wall clock): on one machine the client measures the latency.
            last = {"kind": STATUS, "status": status_to_plain(status), "sent": time.time()}
            if link.check():  # re-attached: the run's state first, then the run goes on
                _greet(trainer, messages, address, [hello, placed])
                best_sent = trainer.validator.best.step
            elif not link.attached:
                _gone(trainer, status, link)
                continue
            messages.put(last)
            if stop.is_set():
                trainer.stop()  # after this step: the run's next check ends it
            step = status.step
            if status.kind == "step" and step % every == 0:
                messages.put(_weights(trainer, address))
            if status.kind == "step":
                _answer_preview(trainer, previews, messages)
            best = trainer.validator.best.step
            # A better check's weights, at most one set per `every` steps (each is the
            # model's size): a killed worker leaves the best received besides the last.
            if best is not None and (best_sent is None or best - best_sent >= every):
                messages.put(_best(trainer))
                best_sent = best
    except Exception as exc:
        ended = "failed"
        trainer.ended = f"{type(exc).__name__} at step {trainer.steps_done + 1}: {first_line(exc)}"
        end = [_failed(exc)]
    else:
        end = [{"kind": DONE}]
    link.check(force=True)  # a client that left in the last second gets its end kept
    if not link.attached:
        _keep(inputs, trainer, messages, address, [hello, placed, *([last] if last else []),
                                                   *_last_weights(trainer, address), *end])
    else:
        if ended == "finished" or trainer.steps_done:
            _send_best_unsent(trainer, messages, best_sent)
            messages.put(_weights(trainer, address))
        for message in end:
            messages.put(message)
    trainer.release()
    return ended


def _gone(trainer: Finetuner, status: Status, link: ClientLink) -> None:
    """Nobody reads the run: nothing is sent; past the grace period it stops."""
    if link.expired() and status.kind == "step":
        trainer.stop()
        trainer.ended = (f"stopped after step {trainer.steps_done}: no client read the run "
                         f"for {link.grace_s:g} s (remote_grace_s)")


def _greet(trainer: Finetuner, messages: Outbox, address: str,
           where: list[dict[str, Any]]) -> None:
    """What a client that re-attached needs: where the run is (``where``: the started and
    placed messages), its weights so far."""
    messages.queue.get(batch=True)  # what nobody read: the state below replaces it
    for message in where:
        messages.put(message)
    for message in _last_weights(trainer, address):
        messages.put(message)


def _last_weights(trainer: Finetuner, address: str) -> list[dict[str, Any]]:
    """The best weights (when there are any) then the last ones, as messages."""
    if not trainer.steps_done:
        return []
    best = [_best(trainer)] if trainer.validator.best.step is not None else []
    return [*best, _weights(trainer, address)]


def _keep(inputs: RunInputs, trainer: Finetuner, messages: Outbox, address: str,
          kept: list[dict[str, Any]]) -> None:
    """Nobody read the run's end: keep its last messages in this worker's local
    directory, leave a note naming this worker on the run's queue, forget the rest."""
    import msgpack

    path = kept_file(inputs.run_id)
    partial = path.with_suffix(".partial")
    partial.write_bytes(msgpack.packb([encode(m) for m in kept], use_bin_type=True))
    partial.replace(path)  # a fetch never reads half a file
    messages.queue.get(batch=True)  # what nobody read: the file holds the end
    messages.put({"kind": KEPT, "worker": address, "steps_done": int(trainer.steps_done),
                  "ended": trainer.ended})
    _forget_from_worker([inputs.preview_name(), inputs.attach_name()], inputs.event_names())


def _failed(exc: BaseException) -> dict[str, Any]:
    """The message of a run that failed: its exception's type and first line."""
    return {"kind": FAILED, "type": type(exc).__name__, "line": first_line(exc)}


def _build(inputs: RunInputs) -> Finetuner:
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.remote.tiles import StoredImage
    from napari_finetune.trainer.loop import Finetuner

    # The checkpoint's own reader, from a file as it was on the client.
    handle, path = tempfile.mkstemp(suffix=inputs.suffix, prefix="napari-finetune-")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(inputs.checkpoint)
        ckpt = load_checkpoint(path, trust=inputs.trust)
    finally:
        os.unlink(path)
    shipped = inputs.image
    image = shipped.open() if isinstance(shipped, StoredImage) else shipped.volume()
    trainer = Finetuner.from_checkpoint(
        ckpt, image, inputs.painting.dense(), inputs.config, fit_patch=False
    )
    trainer.normalization_ranges = list(inputs.normalization_ranges)
    return trainer


def _answer_preview(trainer: Finetuner, previews: Queue, messages: Outbox) -> None:
    """Predict the latest region the client asked for (older requests are stale), if any."""
    requests = previews.get(batch=True)  # what is there now, maybe nothing
    if not requests:
        return
    request = decode(requests[-1])
    region = region_from_plain(request["region"])
    # Without the store here, the client sent the region's raw pixels along.
    crop = request.get("crop")
    answer: dict[str, Any] = {"kind": PREVIEW, "region": request["region"],
                              "step": int(trainer.steps_done)}
    try:
        probabilities = trainer.predict(region if crop is None else np.asarray(crop))
    except Exception as exc:  # a view of the run, not part of it: the run goes on
        answer["error"] = one_line(exc)
    else:
        answer["probabilities"] = probabilities.astype(np.float32, copy=False)
    messages.put(answer)


def _send_best_unsent(trainer: Finetuner, messages: Outbox, sent: int | None) -> None:
    """At the run's end: the best weights, when the last ones sent are not they."""
    best = trainer.validator.best.step
    if best is not None and best != sent:
        messages.put(_best(trainer))


def _best(trainer: Finetuner) -> dict[str, Any]:
    """The best validation weights so far (adapters merged), their step and score."""
    import copy

    from napari_finetune.model.lora import is_lora, merged_copy

    best = trainer.validator.best
    with trainer.lock:
        if is_lora(trainer.model):  # the kept state has the adapters: merge a copy of it
            clone = copy.deepcopy(trainer.model)
            clone.load_state_dict(best.state)
            state = merged_copy(clone).state_dict()
        else:
            state = best.state
        weights = weights_to_bytes(state)
    return {"kind": BEST, "weights": weights, "step": int(best.step or 0),
            "score": float(best.score)}


def _weights(trainer: Finetuner, address: str) -> dict[str, Any]:
    """The weights (adapters merged) and the run record, as a message."""
    from napari_finetune.model.lora import is_lora, merged_copy
    from napari_finetune.trainer.record import run_record

    with trainer.lock:
        model = merged_copy(trainer.model) if is_lora(trainer.model) else trainer.model
        weights = weights_to_bytes(model.state_dict())
        record = run_record(trainer)
    record["worker"] = address  # the record's environment names the host and device
    return {
        "kind": WEIGHTS,
        "weights": weights,
        "record": record,
        "ended": trainer.ended,
        "steps_done": int(trainer.steps_done),
        "loss": trainer.last_loss,
    }
