"""Run a :class:`Finetuner` from the command line so that no finished step is lost.

However a run ends after at least one applied step (all steps done, Ctrl-C,
SIGTERM or SIGHUP from a scheduler or a closed terminal, out of memory with
nothing left, a NaN loss in fp32, a second Ctrl-C), the last good weights are
exported to ``--out`` and the run record's ``"ended"`` says how. The optimizer
step is all or nothing (:func:`~napari_finetune.trainer.step.guarded_optimizer_step`),
so the weights after any interruption are those of the last completed step.

Signals: the first SIGINT/SIGTERM/SIGHUP asks the trainer to stop after the
step in progress; a second one interrupts at once. While the checkpoint is
being written every signal is only acknowledged, so the file is never left
half written and no traceback appears.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.cli.options import StatusPrinter
from napari_finetune.config import FinetuneConfig
from napari_finetune.errors import first_line

if TYPE_CHECKING:
    from napari_finetune.arrays import AxesImage, VolumeArray
    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.sync import LocalSync

# The signals that end a run the way Ctrl-C does (SIGHUP does not exist on Windows).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
# Keyed by int: a handler receives the signal's number (Signals is an int).
SIGNAL_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C"}


class InterruptedRun(BaseException):
    """A second stop signal: leave the step in progress at once (like KeyboardInterrupt)."""


@dataclass(frozen=True)
class RunOutcome:
    """How a command-line run ended.

    Attributes
    ----------
    steps_done : int
        Optimizer steps applied.
    ended : str
        ``"finished"`` or how the run ended early (also in the record's ``"ended"``).
    exit_code : int
        0 when finished; 128 + the signal's number when a signal stopped it;
        1 after a failure.
    exported : pathlib.Path or None
        The checkpoint written (None when no step was applied).
    error : str or None
        The failure's one-line message (out of memory, NaN), if any.
    exported_best : pathlib.Path or None
        A remote run that failed: the best validation weights received, when
        they are not the last (``--out`` with ``-best`` before its suffix).
    speaks : bool
        Whether this process prints the outcome (only rank 0 of several does,
        unless another rank is lost).
    """

    steps_done: int
    ended: str
    exit_code: int
    exported: Path | None
    error: str | None = None
    speaks: bool = True  # False on the ranks other than 0, which leave the talking to it
    exported_best: Path | None = None

    @property
    def stopped(self) -> bool:
        """Whether a signal (Ctrl-C, SIGTERM, SIGHUP) ended the run early."""
        return self.exit_code > 128


def signal_name(signum: int) -> str:
    """``"Ctrl-C"`` for SIGINT, else the signal's name (``"SIGTERM"``)."""
    return SIGNAL_NAMES.get(signum, signal.Signals(signum).name)


class _SignalGuard:
    """First signal: stop after the step; second: interrupt; while exporting: wait."""

    def __init__(self, trainer: Finetuner, printer: StatusPrinter) -> None:
        self.trainer = trainer
        self.printer = printer
        self.received: int | None = None
        self.interrupted = False  # the run was interrupted once: later signals only wait
        self.exporting = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        name = signal_name(signum)
        if self.exporting or self.interrupted:
            # A third Ctrl-C must not interrupt the handling of the second one.
            self.printer.bar.write(f"{name}: still writing the checkpoint, one moment...")
            return
        if self.received is None:
            self.received = signum
            self.printer.bar.write(
                f"{name}: stopping after the current step (send it again to stop at once)"
            )
            self.trainer.stop()
            return
        self.interrupted = True
        raise InterruptedRun(name)

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, self)
        try:
            yield
        finally:
            # After a stop signal the process only exports and exits: the signals
            # stay ignored, or a storm of Ctrl-C would raise KeyboardInterrupt in
            # whatever runs next (a progress bar's __del__, the final print).
            stopping = self.received is not None
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_IGN if stopping else handler)


def run_finetune(
    ckpt: Checkpoint,
    image: VolumeArray | AxesImage,
    corrections: np.ndarray,
    config: FinetuneConfig,
    out: Path,
    quiet: bool = False,
    printer: StatusPrinter | None = None,
    sync: LocalSync | None = None,
    fit_patch: bool = False,
    trainer: Finetuner | None = None,
) -> RunOutcome:
    """Run a Finetuner to its end, print status lines, export the last good weights.

    With several ranks (``sync``) rank 0 alone prints and exports. ``fit_patch``
    fits the configured patch to the image and the model (the default patch;
    a patch the user gave is kept). ``trainer``: a run already assembled (a
    :class:`~napari_finetune.remote.finetuner.RemoteFinetuner`), used instead.

    Returns
    -------
    RunOutcome
        Steps done, how the run ended, the exit code for the command line.
    """
    from napari_finetune.remote.finetuner import (
        RemoteFinetuner,
        RemoteWorkerLost,
        SchedulerLost,
    )
    from napari_finetune.remote.preflight import RemoteError
    from napari_finetune.trainer.distributed import DistributedError
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.recovery import RecoveryError

    if trainer is None:
        trainer = Finetuner.from_checkpoint(ckpt, image, corrections, config, sync=sync,
                                            fit_patch=fit_patch)
    lead = trainer.sync.rank == 0
    printer = printer or StatusPrinter(config.steps, quiet=quiet, echo=lead)
    guard = _SignalGuard(trainer, printer)
    from napari_finetune.trainer.environment import describe_environment, run_environment

    if lead:
        ranks = trainer.sync.world_size
        if isinstance(trainer, RemoteFinetuner):  # the worker's environment goes in the record
            printer.bar.write(f"fine-tuning on a worker of the dask scheduler {trainer.scheduler}")
            device = config.device  # as asked: the worker resolves it
        else:
            printer.bar.write(describe_environment(run_environment(trainer.device)))
            device = str(trainer.device)
        printer.bar.write(
            f"fine-tuning {config.steps} steps ({config.mode}, device {device}"
            + (f", {ranks} processes × {config.samples_per_step} samples" if ranks > 1 else "")
            + f"); building the trainer ({'PEFT adapters, ' if config.mode == 'lora' else ''}"
            "optimizer, precision probe)..."
        )
    ended, code, error = "finished", 0, None
    with guard.installed():
        try:
            for status in trainer.run():
                printer(status)
        except RecoveryError as exc:
            ended, code, error = _failure(trainer, "out of memory", exc)
        except FloatingPointError as exc:
            ended, code, error = _failure(trainer, "non-finite loss", exc)
        except RemoteError as exc:
            if not isinstance(trainer, RemoteFinetuner) or trainer.run_record is None:
                raise  # nothing came back: the caller says why in one line
            what = ("lost the dask scheduler" if isinstance(exc, SchedulerLost)
                    else "lost the remote run" if isinstance(exc, RemoteWorkerLost)
                    else "failed on the worker")
            ended, code, error = _failure(trainer, what, exc)
        except DistributedError as exc:
            ended, code, error = _failure(trainer, "lost a process", exc)
            lead = True  # every rank that notices says so
        except (InterruptedRun, KeyboardInterrupt):
            name = signal_name(guard.received or signal.SIGINT)
            ended, code = (
                f"interrupted by {name} during step {trainer.steps_done + 1}",
                128 + (guard.received or signal.SIGINT),
            )
        finally:
            guard.exporting = True  # from here on a signal only waits for the file
            _say_snapshots(trainer, printer)
            printer.close()
        if code == 0 and guard.received is not None and trainer.steps_done < config.steps:
            ended = f"stopped by {signal_name(guard.received)} after step {trainer.steps_done}"
            code = 128 + guard.received
        exported = best = None
        if trainer.steps_done > 0 and trainer.sync.rank == 0:
            exported = Path(trainer.export(out, ended=ended))
            if isinstance(trainer, RemoteFinetuner) and error is not None:
                written = trainer.export_best(out.with_name(f"{out.stem}-best{out.suffix}"),
                                              ended)
                best = None if written is None else Path(written)
    return RunOutcome(trainer.steps_done, ended, code, exported, error, speaks=lead,
                      exported_best=best)


def _say_snapshots(trainer: Finetuner, printer: StatusPrinter) -> None:
    """Print the memory-snapshot lines no status carried (a run that failed or was cut)."""
    trainer.memory_history.finish()
    for line in trainer.memory_history.lines:
        if not any(line in shown for shown in printer.lines):
            printer.bar.write(line)


def _failure(trainer: Finetuner, what: str, exc: BaseException) -> tuple[str, int, str]:
    step = trainer.steps_done + 1
    line = first_line(exc)
    return f"{what} at step {step}: {line}", 1, line


def describe_outcome(outcome: RunOutcome, total_steps: int, out: Path) -> str:
    """The line the command prints at the end of a run."""
    done = f"{outcome.steps_done}/{total_steps} steps"
    if outcome.exported is None:
        kept = "nothing was exported (no step was completed)"
    else:
        kept = f"exported {out}"
    if outcome.exported_best is not None:
        kept += f" and the best validation weights to {outcome.exported_best}"
    if outcome.error is not None:
        where = outcome.ended.split(":", 1)[0]
        return f"{where} after {done}: {outcome.error}; {kept}"
    if outcome.ended == "finished":
        return f"finished after {done}; {kept}"
    return f"{outcome.ended.split(' after ')[0].split(' during ')[0]} after {done}; {kept}"
