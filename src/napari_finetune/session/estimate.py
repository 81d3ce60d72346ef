"""How long a run will take on this machine, and what would be faster (no Qt, no torch).

A :class:`StepTimes` keeps the seconds one optimizer step took, per device
and mode ("full" or "lora"), from the last run's statuses or from a step
someone timed (a warm-up). :func:`estimate` turns one into a
:class:`RunEstimate` for the run about to start; its :attr:`RunEstimate.text`
is the line a front end shows before the click.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A run longer than this on the CPU gets the advice on what would be faster.
LONG_RUN_S = 120.0
# A timing says little before a few steps: the first ones include set-up.
MIN_STEPS_TIMED = 2


def duration_words(seconds: float) -> str:
    """``40`` -> "under a minute"; ``170`` -> "about 3 min"; ``5400`` -> "about 1 h 30 min"."""
    if seconds < 60:
        return "under a minute"
    minutes = int(round(seconds / 60))
    if minutes < 60:
        return f"about {minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"about {hours} h {rest} min" if rest else f"about {hours} h"


@dataclass(frozen=True)
class RunEstimate:
    """The expected length of a run of ``steps`` steps, and the faster ways.

    Attributes
    ----------
    steps : int
        The steps of the run asked for.
    seconds_per_step : float
        The time of one step on this machine, as measured.
    source : str
        Where that time came from ("the last run", "a timed step").
    on_cpu : bool
        Whether the step was timed on the CPU (a GPU is then the fastest way).
    faster_mode : str or None
        The other mode ("full" or "lora") when it was measured faster here.
    faster_mode_seconds : float
        Its seconds per step (0 when ``faster_mode`` is None).
    """

    steps: int
    seconds_per_step: float
    source: str
    on_cpu: bool
    faster_mode: str | None = None
    faster_mode_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        """The whole run's expected seconds."""
        return self.steps * self.seconds_per_step

    @property
    def long(self) -> bool:
        """Whether the run is long enough to say what would be faster."""
        return self.seconds >= LONG_RUN_S

    def faster(self) -> list[str]:
        """The faster ways, in words: fewer steps, the other mode if faster here, a GPU."""
        ways: list[str] = []
        if self.steps > 50:
            ways.append(f"{self.steps // 4} steps take "
                        f"{duration_words(self.seconds / 4)}")
        if self.faster_mode is not None:
            name = "LoRA on" if self.faster_mode == "lora" else "LoRA off (full fine-tune)"
            ways.append(f"{name}: {duration_words(self.steps * self.faster_mode_seconds)}")
        if self.on_cpu:
            ways.append("a GPU (Device, or Run on) is many times faster")
        return ways

    @property
    def text(self) -> str:
        """"200 steps: about 17 min on this computer's CPU (5.1 s a step, from the last run).
        Faster: 50 steps take about 4 min; a GPU ..." (the advice only for a long run)."""
        where = "on this computer's CPU" if self.on_cpu else "on this machine"
        line = (f"{self.steps} steps: {duration_words(self.seconds)} {where} "
                f"({self.seconds_per_step:.1f} s a step, from {self.source}).")
        if self.long and (ways := self.faster()):
            line += " Faster: " + "; ".join(ways) + "."
        return line


@dataclass
class StepTimes:
    """Seconds per optimizer step measured here, by (device, mode).

    ``device`` is the device the run resolved to ("cpu", "cuda", "mps"), and
    also the one asked for ("auto"), so a run asked the same way finds it.
    """

    seconds: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)
    on_cpu: dict[str, bool] = field(default_factory=dict)  # the device asked -> was the CPU

    def record(self, device: str, mode: str, seconds_per_step: float, source: str,
               resolved: str | None = None) -> None:
        """Keep one timing: ``device`` as asked, ``resolved`` as run (same when None)."""
        if seconds_per_step <= 0:
            return
        resolved = resolved or device
        for name in {device, resolved}:
            self.seconds[(name, mode)] = (seconds_per_step, source)
            self.on_cpu[name] = resolved == "cpu"

    def record_run(self, device: str, mode: str, step: int, elapsed_s: float,
                   resolved: str | None = None) -> None:
        """A run's status: ``step`` steps done ``elapsed_s`` seconds after its start."""
        if step >= MIN_STEPS_TIMED and elapsed_s > 0:
            self.record(device, mode, elapsed_s / step, "the last run", resolved)


def estimate(times: StepTimes, steps: int, device: str, mode: str) -> RunEstimate | None:
    """The estimate of a run of ``steps`` on ``device`` in ``mode``; None when no step of
    that device and mode was timed yet."""
    found = times.seconds.get((device, mode))
    if found is None:
        return None
    per_step, source = found
    other = "lora" if mode == "full" else "full"
    faster = times.seconds.get((device, other))
    quicker = faster is not None and faster[0] < 0.8 * per_step
    return RunEstimate(
        steps=steps, seconds_per_step=per_step, source=source,
        on_cpu=times.on_cpu.get(device, device == "cpu"),
        faster_mode=other if quicker else None,
        faster_mode_seconds=faster[0] if quicker and faster is not None else 0.0)


def unknown_text(steps: int, device: str) -> str:
    """The line before any step was timed here (the first run's steps tell)."""
    if device in ("cuda", "mps"):
        return f"{steps} steps: the time is shown once the first steps have run."
    return (f"{steps} steps: the time is shown once the first steps have run; on a laptop's "
            "CPU 200 steps take about 15-20 min (fewer steps or a GPU are faster).")
