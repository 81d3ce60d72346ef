"""PyTorch's allocator history, dumped at the first out-of-memory and at the end of a run.

With ``memory_snapshot`` set, a CUDA run records every allocation and free
(with its Python stack) from the start; the history is written at the first
out-of-memory (``<name>.oom<suffix>``, the state that failed) and at the end
(``memory_snapshot`` itself). https://pytorch.org/memory_viz opens both files
in the browser, locally. Other devices have no such API: one line says so and
the run goes on.

The two torch functions are looked up at call time, so a test can replace them
(``torch.cuda.memory._record_memory_history`` and ``_dump_snapshot``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from napari_finetune.errors import first_line

VIEWER = "https://pytorch.org/memory_viz"
# Allocation events kept (a ring buffer): enough for many steps of a UNet,
# a few hundred MB of host memory at most.
MAX_ENTRIES = 200_000


def oom_path(path: Path) -> Path:
    """Where the first out-of-memory's snapshot goes: ``memory.pickle`` -> ``memory.oom.pickle``."""
    return path.with_name(f"{path.stem}.oom{path.suffix or '.pickle'}")


class MemoryHistory:
    """The run's allocator history: started with the run, dumped at the first OOM and the end.

    Parameters
    ----------
    path : str or None
        ``FinetuneConfig.memory_snapshot``; None records nothing.
    device : torch.device
        The run's device; only CUDA records a history.

    Attributes
    ----------
    written : list of str
        Snapshot files written so far.
    lines : list of str
        Every log line this object produced.
    """

    def __init__(self, path: str | None, device: torch.device) -> None:
        self.path = Path(path) if path else None
        self.device = torch.device(device)
        self.recording = False
        self.oom_dumped = False
        self.written: list[str] = []
        self.lines: list[str] = []

    def start(self) -> str:
        """Start recording (CUDA); the line for the log ("" when no snapshot was asked for)."""
        if self.path is None or self.recording:
            return ""
        if self.device.type != "cuda":
            return self._say(
                f"memory snapshot: the allocator history exists on CUDA only; nothing is "
                f"written to {self.path} on {self.device.type}"
            )
        try:
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
        except (AttributeError, RuntimeError, TypeError) as exc:
            return self._say(
                f"memory snapshot: this PyTorch ({torch.__version__}) cannot record the "
                f"allocator history ({first_line(exc)}); nothing is written to {self.path}"
            )
        self.recording = True
        return self._say(
            f"memory snapshot: recording the CUDA allocator history; written to "
            f"{oom_path(self.path)} at the first out-of-memory and to {self.path} at the end"
        )

    def dump_first_oom(self) -> str:
        """Write the snapshot of the first out-of-memory; "" after the first or when off."""
        if not self.recording or self.oom_dumped or self.path is None:
            return ""
        self.oom_dumped = True
        return self._dump(oom_path(self.path), "of the first out-of-memory")

    def finish(self) -> str:
        """Write the end-of-run snapshot and stop recording; "" when off."""
        if not self.recording or self.path is None:
            return ""
        line = self._dump(self.path, "at the end of the run")
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except (AttributeError, RuntimeError, TypeError):
            pass  # recording stays on in this process; nothing else depends on it
        self.recording = False
        return line

    def _dump(self, target: Path, when: str) -> str:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(target))
        except (OSError, RuntimeError, AttributeError) as exc:
            return self._say(f"memory snapshot {when}: could not write {target} ({exc})")
        self.written.append(str(target))
        return self._say(f"memory snapshot {when} written to {target}: open it at {VIEWER}")

    def _say(self, line: str) -> str:
        self.lines.append(line)
        return line
