"""Thread-worker glue: the jobs the widget runs off the main thread.

Each job is a generator of events (tuples whose first item names them) that
napari's ``thread_worker`` machinery delivers to the main thread:

``("progress", done, total, what)``  a block of a prediction was computed
``("prediction", masks)``            one uint8 mask per channel, whole volume
``("saved", store_path)``            corrections written into the store
``("untrusted", path, factory)``   the checkpoint's factory needs the user's trust
``("trainer", trainer)``             the Finetuner exists (the widget may stop it)
``("status", Status)``               one event of ``Finetuner.run()``
``("preview", region, probs)``       probabilities of ``region`` with the current weights
``("exported", path)`` / ``("written", names)``
``("error", exc)``                   the job failed; the message is the engine's

Errors are turned into an event (not raised) so the widget shows the
engine's own message once, and is back to a usable state, instead of a
traceback dialog. Every heavy object (checkpoint, model, trainer) is built
inside the job, in the worker thread: a click never waits for it.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from napari_finetune.data.patch_shape import fit_patch_shape

Event = tuple
Job = Generator[Event, None, Any]


def start_job(
    job: Callable[..., Job], *args: Any, on_event: Callable[[Event], None],
    on_finished: Callable[[], None] | None = None, **kwargs: Any,
):
    """Run ``job(*args, **kwargs)`` in a napari ``thread_worker``; events go to ``on_event``.

    Returns the :class:`~napari_finetune._qt.shutdown.JobWorker`, which a
    closing widget can wait for.
    """
    from napari.qt.threading import create_worker

    from napari_finetune._qt.shutdown import JobWorker

    worker = create_worker(_guarded, job, *args, _start_thread=False, _worker_class=JobWorker,
                           **kwargs)
    worker.yielded.connect(on_event)
    if on_finished is not None:
        worker.finished.connect(on_finished)
    worker.start()
    return worker


def call_job(fn: Callable[..., Any], *args: Any) -> Job:
    """``fn(*args)`` as a job: one ``("done", result)`` event."""
    yield ("done", fn(*args))


def start_call(
    fn: Callable[..., Any], *args: Any, on_done: Callable[[Any], None],
    on_error: Callable[[Exception], None],
):
    """Run a plain function in a worker: ``on_done(result)`` or ``on_error(exc)``."""

    def relay(event: Event) -> None:
        (on_done if event[0] == "done" else on_error)(event[1])

    return start_job(call_job, fn, *args, on_event=relay)


def _guarded(job: Callable[..., Job], *args: Any, **kwargs: Any) -> Job:
    try:
        return (yield from job(*args, **kwargs))
    except Exception as exc:  # every failure becomes one notification
        yield ("error", exc)
        return None
    finally:
        release_memory()


@contextmanager
def core_left_for_the_ui() -> Iterator[None]:
    """Run torch on all cores but one for the duration of a computing job.

    Measured on 2 shared cores: torch on both starved Qt and Xvfb (1.1 s
    stalls) and was slower too (oversubscribed). ``torch.set_num_threads`` is
    process-wide, so only the jobs that compute (a run, a prediction; the
    widget runs one at a time) set and restore it: a save or a checkpoint
    read that began or ended meanwhile would otherwise hand the run all
    cores back, or keep one from it for good.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(before, (os.cpu_count() or 2) - 1)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
        yield ("progress", item[0], item[1], what)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def warm_up_job() -> Job:
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
    yield ("warm", True)


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
) -> Job:
    """Whole-volume prediction, blockwise; ``model`` (a fine-tuned one) skips loading."""
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
    yield ("prediction", masks)


def train_job(
    checkpoint_path: str, image: Any, corrections: np.ndarray, store_path: str | None,
    channel_names: Sequence[str], config: Any, preview_interval_s: float,
    region: Callable[[], tuple[slice, ...] | None],
    model_hook: Callable[[Any], Any] | None = None,
    trainer_hook: Callable[[Any], Any] | None = None, trust: Sequence[str] = (),
    snapshot: int | None = None,
) -> Job:
    """Save the corrections, build model and trainer here, run, yield previews between steps.

    The first preview comes after the first optimizer step (the user sees the
    model move at once), then every ``preview_interval_s`` seconds (0: never).
    """
    if store_path:
        from napari_finetune._qt.corrections import save_corrections_locked

        # Before anything can fail; ``snapshot`` keeps a later, newer save from being undone.
        save_corrections_locked(store_path, corrections, channel_names, snapshot)
        yield ("saved", store_path)
    with core_left_for_the_ui():  # from the build to the end of the run, whatever else runs
        yield from _build_and_run(checkpoint_path, image, corrections, config,
                                  preview_interval_s, region, model_hook, trainer_hook, trust)


def _build_and_run(
    checkpoint_path: str, image: Any, corrections: np.ndarray, config: Any,
    preview_interval_s: float, region: Callable[[], tuple[slice, ...] | None],
    model_hook: Callable[[Any], Any] | None, trainer_hook: Callable[[Any], Any] | None,
    trust: Sequence[str],
) -> Job:
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.predict import shape_multiple
    from napari_finetune.trainer.loop import Finetuner

    ckpt = load_checkpoint(checkpoint_path, trust=tuple(trust))  # as the user answered
    if model_hook is not None:
        model_hook(ckpt.model)  # fault injection for the tests and the benchmark
    multiple = shape_multiple(ckpt.model, image.ndim)
    config = dataclasses.replace(
        config, patch_shape=fit_patch_shape(config.patch_shape, image.shape, multiple)
    )
    trainer = Finetuner(ckpt.model, image, corrections, config, metadata=ckpt.metadata,
                        source_sha256=ckpt.sha256)
    del ckpt
    if trainer_hook is not None:
        trainer.after_build.append(trainer_hook)  # e.g. an OOM in the teacher
    yield ("trainer", trainer)
    last_preview: float | None = None
    try:
        for status in _statuses(trainer):
            yield ("status", status)
            now = time.monotonic()
            due = last_preview is None or now - last_preview >= preview_interval_s
            if preview_interval_s > 0 and status.kind == "step" and due:
                where = region()
                if where is not None:
                    yield ("preview", where, np.asarray(trainer.predict(where)))
                last_preview = time.monotonic()
    finally:
        # However the run ended, give back the optimizer state and the teacher;
        # the weights stay for Export and Predict.
        trainer.release()


def _statuses(trainer: Any) -> Iterator[Any]:
    yield from trainer.run()


def export_job(trainer: Any, path: str) -> Job:
    """``trainer.export(path)`` off the main thread."""
    yield ("exported", str(trainer.export(path)))


def save_predictions_job(store_path: str, arrays: Sequence[tuple[str, np.ndarray]]) -> Job:
    """Write each ``(name, mask)`` into ``<store>/labels/<name>``."""
    from napari_finetune.io.omezarr import write_labels

    names = []
    for i, (name, array) in enumerate(arrays):
        write_labels(store_path, name, array)
        names.append(name)
        yield ("progress", i + 1, len(arrays), "save predictions")
    yield ("written", names)
