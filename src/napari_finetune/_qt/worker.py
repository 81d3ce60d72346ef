"""Thread-worker glue: the jobs the widget runs off the main thread.

Each job is a generator run by napari's generator worker: it yields typed
events (:mod:`napari_finetune._qt.events`) that arrive on the main thread
through ``yielded``, returns its result through ``returned`` and fails
through ``errored`` (napari marks the task failed; the widget shows the
engine's own message once and is back to a usable state). ``worker.quit()``
ends a job at its next yield. Every heavy object (checkpoint, model,
trainer) is built inside the job, in the worker thread: a click never waits
for it.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from napari_finetune._qt.events import (
    Event,
    JobError,
    Preview,
    Progress,
    RunStatus,
    Saved,
    TrainerReady,
)
from napari_finetune.data.patch_shape import fit_patch_shape

if TYPE_CHECKING:
    from napari_finetune._qt.shutdown import JobWorker

R = TypeVar("R")
Job = Generator[Event, None, R]


def start_job(
    job: Callable[..., Job], *args: Any, on_error: Callable[[Exception], None],
    on_event: Callable[[Event], None] | None = None,
    on_result: Callable[[Any], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    on_aborted: Callable[[], None] | None = None, **kwargs: Any,
) -> JobWorker:
    """Run ``job(*args, **kwargs)`` in a napari generator worker and start it.

    Events go to ``on_event``, the job's return value to ``on_result``, a
    failure to ``on_error`` (napari's task status shows it failed),
    ``quit()`` taking effect to ``on_aborted``; ``on_finished`` comes last
    whichever way it ended. Returns the
    :class:`~napari_finetune._qt.shutdown.JobWorker`, which a closing widget
    can wait for.
    """
    from napari.qt.threading import create_worker

    from napari_finetune._qt.shutdown import JobWorker

    worker = create_worker(guarded(job), *args, _start_thread=False, _worker_class=JobWorker,
                           _connect={"errored": on_error}, **kwargs)
    for signal, slot in ((worker.yielded, on_event), (worker.returned, on_result),
                         (worker.aborted, on_aborted), (worker.finished, on_finished)):
        if slot is not None:
            signal.connect(slot)
    worker.start()
    return worker


def call_job(fn: Callable[..., R], *args: Any) -> Job[R]:
    """``fn(*args)`` as a job that yields nothing and returns its result."""
    yield from ()  # a generator, so the worker honours quit() before it begins
    return fn(*args)


def start_call(
    fn: Callable[..., Any], *args: Any, on_done: Callable[[Any], None],
    on_error: Callable[[Exception], None],
) -> JobWorker:
    """Run a plain function in a worker: ``on_done(result)`` or ``on_error(exc)``."""
    return start_job(call_job, fn, *args, on_result=on_done, on_error=on_error)


def guarded(job: Callable[..., Job]) -> Callable[..., Job]:
    """``job`` that gives device memory back however it ends and never fails with a
    ``RuntimeError`` (napari's worker would take it for a deleted worker)."""

    @functools.wraps(job)
    def run(*args: Any, **kwargs: Any) -> Job:
        try:
            return (yield from job(*args, **kwargs))
        except RuntimeError as exc:
            raise JobError(str(exc)) from exc
        finally:
            release_memory()

    return run


class _CoreForTheUi:
    """The process-wide torch thread count while computing jobs run, counted across jobs.

    ``torch.set_num_threads`` is process-wide. Measured on 2 shared cores:
    torch on both starved Qt and Xvfb (1.1 s stalls) and was slower too
    (oversubscribed). So the first computing job to begin (a run, a
    prediction, a package's test) leaves one core to the UI and the last to
    end gives it back: however the jobs overlap, none hands another every
    core, and none leaves the process a core short for good. Jobs that only
    save or read (the autosave, a checkpoint's channels) never touch it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._computing = 0
        self._before = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        import torch

        with self._lock:
            if self._computing == 0:
                self._before = torch.get_num_threads()
                torch.set_num_threads(max(1, min(self._before, (os.cpu_count() or 2) - 1)))
            self._computing += 1
        try:
            yield
        finally:
            with self._lock:
                self._computing -= 1
                if self._computing == 0:
                    torch.set_num_threads(self._before)


_core_for_the_ui = _CoreForTheUi()


def core_left_for_the_ui() -> AbstractContextManager[None]:
    """Run torch on all cores but one while this computing job runs (see ``_CoreForTheUi``)."""
    return _core_for_the_ui.held()


def release_memory() -> None:
    """Return cached accelerator memory to the driver (after a collection).

    Only when an accelerator holds memory: a full ``gc.collect()`` in a
    process with napari loaded holds the GIL for up to a second (measured:
    a 940 ms UI stall at the end of a CPU run), and on the CPU freed tensors
    go back at once by reference counting anyway.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.memory_reserved() > 0:
        gc.collect()
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        gc.collect()
        mps.empty_cache()


def with_progress(fn: Callable[[Callable[[int, int], None]], Any], what: str) -> Job:
    """Run ``fn(progress)`` in a helper thread and yield its ``progress(done, total)`` calls.

    ``predict_volume`` reports progress through a callback; a generator cannot
    yield from inside a callback, so the computation runs beside the
    generator and the progress crosses over a queue.
    """
    events: queue.Queue = queue.Queue()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = fn(lambda done, total: events.put((done, total)))
        except BaseException as exc:  # re-raised in the generator's thread
            outcome["error"] = exc
        finally:
            events.put(None)

    thread = threading.Thread(target=target, name=f"napari-finetune-{what}", daemon=True)
    thread.start()
    while (item := events.get()) is not None:
        yield Progress(item[0], item[1], what)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def warm_up_job() -> Job[None]:
    """Import the engine and PEFT (~6 s) in the background while the user looks and paints.

    An import holds the GIL in bursts (~250 ms UI stalls measured), so it is
    better paid here, once, than between the Fine-tune click and the first step.
    """
    import napari_finetune.model.lora  # noqa: F401
    import napari_finetune.trainer.loop  # noqa: F401

    try:
        import peft  # noqa: F401
    except ImportError:  # a full fine-tune works without it
        pass
    yield from ()


def model_to_predict(
    checkpoint_path: str, image: Any, channel_count: int | None, model: Any = None,
    normalization: dict | None = None, trust: Sequence[str] = (),
) -> tuple[Any, tuple[float, float], int | None]:
    """(model, intensity range of ``image``, channels): the given model (a fine-tuned one,
    with the checkpoint's normalisation) or the checkpoint's, loaded here in the worker."""
    from napari_finetune.data.normalization import intensity_range

    if model is None:
        from napari_finetune.model.checkpoint import load_checkpoint

        ckpt = load_checkpoint(checkpoint_path, trust=tuple(trust))
        model, normalization = ckpt.model, ckpt.normalization
        channel_count = len(ckpt.channel_names)
    return model, intensity_range(image, normalization or {}), channel_count


def predict_job(
    checkpoint_path: str, image: Any, channel_count: int | None, device: str,
    model: Any = None, normalization: dict | None = None, trust: Sequence[str] = (),
) -> Job[list[np.ndarray]]:
    """Whole-volume prediction, blockwise, returning one uint8 mask per channel;
    ``model`` (a fine-tuned one) skips loading."""
    from napari_finetune.config import PredictConfig
    from napari_finetune.predict import predict_volume

    model, low_high, channel_count = model_to_predict(
        checkpoint_path, image, channel_count, model, normalization, trust
    )
    shape = tuple(int(s) for s in image.shape)
    masks = [np.zeros(shape, dtype=np.uint8) for _ in range(channel_count or 1)]
    config = PredictConfig(device=device)
    with core_left_for_the_ui():
        yield from with_progress(
            lambda progress: predict_volume(model, image, low_high, config, out=masks,
                                            progress=progress),
            "predict",
        )
    return masks


def train_job(
    checkpoint_path: str, image: Any, corrections: np.ndarray, store_path: str | None,
    channel_names: Sequence[str], config: Any, preview_interval_s: float,
    region: Callable[[], tuple[slice, ...] | None], trust: Sequence[str] = (),
    snapshot: int | None = None,
) -> Job[None]:
    """Save the corrections, build model and trainer here, run, yield previews between steps.

    The first preview comes after the first optimizer step (the user sees the
    model move at once), then every ``preview_interval_s`` seconds (0: never).
    ``worker.quit()`` ends the run at its next event: every event comes after
    a whole optimizer step or a recovery, so the weights are those of the
    last completed step.
    """
    if store_path:
        from napari_finetune._qt.corrections import save_corrections_locked

        # Before anything can fail; ``snapshot`` keeps a later, newer save from being undone.
        save_corrections_locked(store_path, corrections, channel_names, snapshot)
        yield Saved(store_path)
    with core_left_for_the_ui():  # from the build to the end of the run, whatever else runs
        yield from _build_and_run(checkpoint_path, image, corrections, config,
                                  preview_interval_s, region, trust)


def _build_and_run(
    checkpoint_path: str, image: Any, corrections: np.ndarray, config: Any,
    preview_interval_s: float, region: Callable[[], tuple[slice, ...] | None],
    trust: Sequence[str],
) -> Job[None]:
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.predict import shape_multiple
    from napari_finetune.testing import build_hooks
    from napari_finetune.trainer.loop import Finetuner

    ckpt = load_checkpoint(checkpoint_path, trust=tuple(trust))  # as the user answered
    for hook in build_hooks.model:
        hook(ckpt.model)  # fault injection of the tests and the benchmark
    multiple = shape_multiple(ckpt.model, image.ndim)
    config = dataclasses.replace(
        config, patch_shape=fit_patch_shape(config.patch_shape, image.shape, multiple)
    )
    trainer = Finetuner(ckpt.model, image, corrections, config, metadata=ckpt.metadata,
                        source_sha256=ckpt.sha256)
    del ckpt
    trainer.after_build.extend(build_hooks.trainer)  # e.g. an OOM in the teacher
    yield TrainerReady(trainer)
    last_preview: float | None = None
    run = trainer.run()
    try:
        for status in run:
            yield RunStatus(status)
            now = time.monotonic()
            due = last_preview is None or now - last_preview >= preview_interval_s
            if preview_interval_s > 0 and status.kind == "step" and due:
                where = region()
                if where is not None:
                    yield Preview(where, np.asarray(trainer.predict(where)))
                last_preview = time.monotonic()
    finally:
        # However the run ended (a quit() included), close the run here, in this thread
        # (its sample feed), and give back the optimizer state and the teacher; the
        # weights stay for Export and Predict.
        run.close()
        trainer.release()


def export_job(trainer: Any, path: str) -> Job[str]:
    """``trainer.export(path)`` off the main thread; returns where it was written."""
    yield from ()
    return str(trainer.export(path))


def save_predictions_job(
    store_path: str, arrays: Sequence[tuple[str, np.ndarray]],
) -> Job[list[str]]:
    """Write each ``(name, mask)`` into ``<store>/labels/<name>``; returns the names."""
    from napari_finetune.io.omezarr import write_labels

    names = []
    for i, (name, array) in enumerate(arrays):
        write_labels(store_path, name, array)
        names.append(name)
        yield Progress(i + 1, len(arrays), "save predictions")
    return names
