"""The Session's jobs that are no action (the engine's warm-up, a run's memory given back):
through its runner, never busy, a failure's one line through ``events.failed``."""

from __future__ import annotations

import threading

from napari_finetune.session import jobs, work
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Session


class CountingRunner(InlineRunner):
    """The inline runner, counting the jobs it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def start(self, job, callbacks):
        self.started += 1
        return super().start(job, callbacks)


def test_the_warm_up_runs_through_the_sessions_runner_and_says_when_it_ended():
    runner = CountingRunner()
    session = Session(runner)
    seen = []
    session.events.warmed.connect(lambda: seen.append(session.warming))
    session.events.busy.connect(lambda busy: seen.append(busy))
    session.warm_up(lora=False)
    assert runner.started == 1 and seen == [0]  # ended; never busy
    assert session.warming == 0 and session.busy is None


def test_a_failed_warm_up_is_one_line_and_the_session_goes_on(monkeypatch):
    def broken(lora):
        raise ImportError("no module named torch")
        yield  # a job

    monkeypatch.setattr(jobs, "warm_up_job", broken)
    session = Session(InlineRunner())
    failed, warmed = [], []
    session.events.failed.connect(failed.append)
    session.events.warmed.connect(lambda: warmed.append(True))
    session.warm_up(lora=True)
    assert failed == ["Loading the fine-tuning engine failed: no module named torch"]
    assert warmed == [True] and session.warming == 0


def test_the_trainer_is_released_in_the_runners_job(monkeypatch):
    """Its ``gc.collect()`` (0.3 s with the sample open) is the runner's, not the click's."""
    released = []
    monkeypatch.setattr(work, "release_memory",
                        lambda: released.append(threading.current_thread().name))
    runner = CountingRunner()
    session = Session(runner)
    session.release_trainer()
    assert runner.started == 0  # nothing to release
    session.trainer = object()  # type: ignore[assignment]
    session.release_trainer()
    assert session.trainer is None and runner.started == 1 and len(released) == 1
