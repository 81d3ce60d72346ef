"""However a ``train`` run ends, finished training is not thrown away.

A run that ends early (out of memory with nothing left, a NaN loss, Ctrl-C,
SIGTERM, SIGHUP) after at least one applied step writes its last good weights
to ``--out`` with the record saying how it ended, prints one line, and exits
non-zero. Faults are injected through ``Finetuner.after_build``; the signal
cases run the real command in a subprocess.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.trainer.loop import Finetuner
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli


@pytest.fixture
def setup(painted_store, checkpoint):
    """(painted store, starting checkpoint): the shared fixtures of tests/conftest.py."""
    return painted_store, checkpoint


def _after_build(monkeypatch, hook):
    """Install ``hook(trainer)`` on every Finetuner the CLI builds."""
    original = Finetuner.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.after_build.append(hook)

    monkeypatch.setattr(Finetuner, "__init__", init)


def _fail_from_step(trainer, first_failing_step: int, make_output):
    """A forward hook on the student that replaces its output from a given step on."""

    def hook(_module, _args, output):
        if trainer.steps_done + 1 >= first_failing_step:
            return make_output(output)
        return output

    trainer.model.register_forward_hook(hook)


def _oom(_output):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


def _train_with_fault(monkeypatch, capsys, setup, out, first_failing_step, make_output, *extra):
    """``train`` 10 steps with the student's output replaced from a given step on."""
    _after_build(monkeypatch, lambda t: _fail_from_step(t, first_failing_step, make_output))
    store, ckpt = setup
    code, _, err = run_cli(
        capsys, "train", store, "-c", ckpt, "-o", out, "--steps", "10", *extra, *TRAIN_FAST
    )
    return code, err


def test_out_of_memory_late_exports_the_last_good_weights(monkeypatch, capsys, tmp_path, setup):
    out = tmp_path / "tuned.pt"
    code, err = _train_with_fault(monkeypatch, capsys, setup, out, 4, _oom)
    assert_one_line_error(code, err)
    assert "out of memory" in err and str(out) in err
    run = load_checkpoint(out).metadata["run"]
    assert run["steps_done"] == 3
    assert run["ended"].startswith("out of memory at step 4")


def test_nan_loss_late_exports_the_last_good_weights(monkeypatch, capsys, tmp_path, setup):
    out = tmp_path / "tuned.pt"
    nan = lambda o: o * float("nan")  # noqa: E731
    code, err = _train_with_fault(monkeypatch, capsys, setup, out, 5, nan, "--no-mixed-precision")
    assert_one_line_error(code, err)
    tuned = load_checkpoint(out)
    run = tuned.metadata["run"]
    assert run["steps_done"] == 4
    assert run["ended"].startswith("non-finite loss at step 5")
    assert all(torch.isfinite(v).all() for v in tuned.model.state_dict().values())


def test_failure_before_any_step_writes_nothing(monkeypatch, capsys, tmp_path, setup):
    out = tmp_path / "tuned.pt"
    code, err = _train_with_fault(monkeypatch, capsys, setup, out, 1, _oom)
    assert_one_line_error(code, err)
    assert "nothing was exported" in err
    assert not out.exists()


def _train_process(out, store, ckpt, steps="500"):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "napari_finetune.cli",
            "train",
            str(store),
            "-c",
            str(ckpt),
            "-o",
            str(out),
            "--steps",
            steps,
            "--mode",
            "full",
            # Not quiet: the tests wait on the step bar.
            *(arg for arg in TRAIN_FAST if arg != "-q"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


class _Stderr:
    """Collects a process's stderr in a thread, so a test can wait on the step bar."""

    def __init__(self, proc):
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        # os.read returns what is there; a text stream's read(n) may wait for a full buffer.
        while chunk := os.read(stream.fileno(), 4096):
            self.text += chunk.decode(errors="replace")

    def steps(self) -> int:
        """The largest step count the tqdm bar has shown (``"  3/500"``)."""
        return max((int(n) for n in re.findall(r"(\d+)/500", self.text)), default=0)

    def rest(self) -> str:
        self._thread.join(timeout=30)
        return self.text


def _wait_for_steps(proc, n=2, timeout=120.0):
    """Wait until the run's bar shows ``n`` applied steps (not a guessed time: under load
    a step can take seconds, and a signal before step 1 leaves nothing to export)."""
    err = _Stderr(proc)
    deadline = time.monotonic() + timeout
    while err.steps() < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert err.steps() >= n, f"the run showed {err.steps()} steps: {err.text[-2000:]}"
    return err


@pytest.mark.resource  # signals to a training process, waits on its steps
@pytest.mark.parametrize(
    ("signum", "name"),
    [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")],
)
def test_ctrl_c_sigterm_and_sighup_stop_after_a_whole_step_and_export(
    tmp_path, setup, signum, name
):
    out = tmp_path / "tuned.pt"
    proc = _train_process(out, *setup)
    try:
        err = _wait_for_steps(proc)
        proc.send_signal(signum)
        stdout, late = proc.communicate(timeout=120)
        # Two readers share the pipe: communicate() gets whatever the thread did not.
        stderr = err.rest() + late
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in late and "Traceback" not in stderr, stderr
    assert "error" not in stderr, stderr  # a stop is no error
    assert f"stopped by {name}" in stdout and f"exported {out}" in stdout
    run = load_checkpoint(out).metadata["run"]
    assert 2 <= run["steps_done"] < 500  # the bar had shown 2 applied steps
    assert run["ended"] == f"stopped by {name} after step {run['steps_done']}"


@pytest.mark.resource
def test_ctrl_c_storm_never_leaves_a_traceback_or_half_file(tmp_path, setup):
    """Ctrl-C, then Ctrl-C again and again until the process ends (during the export too)."""
    out = tmp_path / "tuned.pt"
    proc = _train_process(out, *setup)
    try:
        err = _wait_for_steps(proc)
        while proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        stdout, late = proc.communicate(timeout=60)
        # Two readers share the pipe: communicate() gets whatever the thread did not.
        stderr = err.rest() + late
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in late and "Traceback" not in stderr, stderr
    assert "error" not in stderr, stderr
    run = load_checkpoint(out).metadata["run"]
    assert run["steps_done"] >= 1 and run["ended"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
