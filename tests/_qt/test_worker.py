"""The widget's worker threads (napari's ``thread_worker``): what a job yields, returns and
raises reaches the main thread through napari's signals.

(That jobs overlapping on worker threads keep torch's thread count right: the
Session's tests, stepping the same jobs by hand.)
"""

from __future__ import annotations

from napari_finetune._qt import worker


def test_jobs_report_results_through_returned_and_failures_through_errored(qtbot):
    """napari's worker protocol: a torch-style RuntimeError is a failure, not a lost worker."""
    from napari_finetune.session.events import JobError, Progress

    def failing():
        yield Progress(1, 2, "test")
        raise RuntimeError("boom")

    def answering():
        yield Progress(1, 1, "test")
        return 42

    got: dict[str, list] = {"events": [], "errors": [], "results": []}
    workers = [worker.start_job(job, on_event=got["events"].append, on_error=got["errors"].append,
                              on_result=got["results"].append) for job in (failing, answering)]
    qtbot.waitUntil(lambda: len(got["errors"]) + len(got["results"]) == 2, timeout=20_000)
    assert [type(e) for e in got["errors"]] == [JobError] and "boom" in str(got["errors"][0])
    assert got["results"] == [42] and len(got["events"]) == 2
    assert all(worker.wait(5.0) for worker in workers)
