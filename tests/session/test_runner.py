"""The inline runner: every callback, in order, in the calling thread; stop at the next event."""

from __future__ import annotations

from napari_finetune.session.events import JobError, Progress
from napari_finetune.session.runner import InlineRunner, JobCallbacks


def _recorder() -> tuple[list, JobCallbacks]:
    calls: list = []
    return calls, JobCallbacks(
        on_event=lambda e: calls.append(("event", e.done)),
        on_result=lambda r: calls.append(("result", r)),
        on_error=lambda exc: calls.append(("error", type(exc).__name__, str(exc))),
        on_finished=lambda stopped: calls.append(("finished", stopped)),
    )


def _counting(total: int, closed: list[bool]):
    try:
        for i in range(total):
            yield Progress(i + 1, total, "count")
        return "all counted"
    finally:
        closed.append(True)


def test_a_job_runs_to_its_end_before_start_returns():
    calls, callbacks = _recorder()
    InlineRunner().start(_counting(2, []), callbacks)
    assert calls == [("event", 1), ("event", 2), ("result", "all counted"), ("finished", False)]


def test_a_torch_style_runtime_error_arrives_as_a_job_error():
    def failing():
        yield Progress(1, 2, "count")
        raise RuntimeError("CUDA error: boom")

    calls, callbacks = _recorder()
    InlineRunner().start(failing(), callbacks)
    assert calls == [("event", 1), ("error", JobError.__name__, "CUDA error: boom"),
                     ("finished", False)]


def test_stop_from_a_callback_closes_the_job_at_its_next_event():
    closed: list[bool] = []
    calls, callbacks = _recorder()
    handles: list = []
    callbacks.on_started = handles.append

    def on_event(event):
        calls.append(("event", event.done))
        if event.done == 2:
            handles[0].stop()

    callbacks.on_event = on_event
    InlineRunner().start(_counting(5, closed), callbacks)
    assert calls == [("event", 1), ("event", 2), ("finished", True)]
    assert closed == [True]  # the job's finally ran (it was closed, not dropped)
