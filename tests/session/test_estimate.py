"""How long the next run takes here: measured by a real run, said before the next click."""

from __future__ import annotations

from dataclasses import replace

import pytest

from napari_finetune.session.estimate import (
    RunEstimate,
    StepTimes,
    duration_words,
    estimate,
    unknown_text,
)


def test_a_real_run_times_its_steps_and_the_next_run_is_estimated(session, record):
    session.config = replace(session.config, steps=3)
    assert session.run_estimate() is None  # nothing timed yet
    assert session.finetune()
    last = session.history[-1]
    assert last.kind == "finished" and last.step == 3
    got = session.run_estimate(steps=200)
    assert got is not None and got.source == "the last run" and got.on_cpu
    assert got.seconds_per_step == pytest.approx(last.elapsed_s / 3)
    assert got.seconds == pytest.approx(200 * last.elapsed_s / 3)
    # Another mode was not timed: no estimate rather than a guess.
    session.config = replace(session.config, mode="lora")
    assert session.run_estimate() is None


def test_a_timed_step_serves_the_settings_it_was_timed_with(session):
    session.config = replace(session.config, device="auto", mode="full", steps=200)
    session.record_step_time(5.0, resolved="cpu")
    got = session.run_estimate()
    assert got is not None and got.on_cpu and got.seconds == 1000
    assert got.source == "a timed step"
    session.config = replace(session.config, device="cpu")  # the resolved device too
    assert session.run_estimate() is not None


def test_a_long_cpu_run_says_how_long_and_what_is_faster():
    times = StepTimes()
    times.record("auto", "full", 5.0, "the last run", resolved="cpu")
    times.record("auto", "lora", 3.0, "a timed step", resolved="cpu")
    got = estimate(times, 200, "auto", "full")
    assert got is not None and got.long and got.faster_mode == "lora"
    assert got.text.startswith("200 steps: about 17 min on this computer's CPU (5.0 s a step")
    assert "50 steps take about 4 min" in got.text
    assert "LoRA on: about 10 min" in got.text
    assert "a GPU" in got.text
    # LoRA is the slower one here: no advice to switch to it from full.
    assert estimate(times, 200, "auto", "lora").faster_mode is None


def test_a_short_run_or_a_gpu_gets_no_cpu_advice():
    short = RunEstimate(steps=20, seconds_per_step=2.0, source="the last run", on_cpu=True)
    assert not short.long and "Faster" not in short.text
    gpu = RunEstimate(steps=200, seconds_per_step=1.0, source="the last run", on_cpu=False)
    assert "GPU" not in gpu.text and "on this machine" in gpu.text


def test_words_and_the_line_before_any_timing():
    assert duration_words(30) == "under a minute"
    assert duration_words(170) == "about 3 min"
    assert duration_words(5400) == "about 1 h 30 min"
    assert "15-20 min" in unknown_text(200, "auto")
    assert "15-20" not in unknown_text(200, "cuda")


def test_the_line_before_the_click_follows_the_settings_asked(session):
    session.record_step_time(6.0, device="cpu", mode="full")
    assert session.estimate_line(200, "cpu", "full").startswith("200 steps: about 20 min")
    assert "the first steps" in session.estimate_line(200, "cpu", "lora")
    assert "the first steps" in session.estimate_line(200, "scheduler", "full")
