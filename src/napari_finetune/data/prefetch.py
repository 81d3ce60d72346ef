"""Draw the next optimizer steps' samples in a background thread.

Reading patches from a zarr/dask store and augmenting them costs tens of
milliseconds per step; on a GPU that is longer than the step itself. The
:class:`SampleFeed` owns the sampler while a run trains: one producer thread
calls ``sampler.sample(n)`` ahead of the training thread, a bounded buffer of
``depth`` steps. The sequence of samples is exactly the one the training
thread would have drawn itself, because only the producer touches the
sampler's generator and it draws in order. Each buffered step remembers the
generator state from before its draw, so :meth:`SampleFeed.close` can put the
sampler back to where a feed without prefetch would have left it (the drawn
but unused steps are given back), and a change of the step size restarts the
producer from the first unused step.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

Samples = tuple[np.ndarray, np.ndarray]
Stage = Callable[[np.ndarray], np.ndarray]


class Sampler(Protocol):
    """What the feed needs of a sampler (``PatchSampler`` has it)."""

    def sample(self, n: int) -> Samples: ...  # noqa: D102
    def get_state(self) -> dict[str, Any]: ...  # noqa: D102
    def set_state(self, state: dict[str, Any]) -> None: ...  # noqa: D102


def pinned_copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in page-locked (pinned) memory, as a numpy view.

    Host-to-device copies from pinned memory with ``non_blocking=True`` run
    asynchronously; the training step keeps the array alive until its loss is
    read back, which synchronises the copies.
    """
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).pin_memory().numpy()


def stage_for(device: torch.device | str) -> Stage | None:
    """:func:`pinned_copy` for a CUDA device, None (no staging) elsewhere."""
    return pinned_copy if getattr(device, "type", str(device)).startswith("cuda") else None


class SampleFeed:
    """The training thread's source of per-step samples, prefetched or not.

    Parameters
    ----------
    sampler : Sampler
        Owned by the feed from the first :meth:`next` until :meth:`close`.
    depth : int
        Steps drawn ahead (a bounded buffer); 0 draws on the calling thread.
    stage : callable, optional
        Applied to every array in the producer thread (e.g. :func:`pinned_copy`).

    Attributes
    ----------
    wait_s : float
        Time :meth:`next` spent waiting for (or, with depth 0, drawing) samples.
    steps : int
        Steps handed out.
    """

    def __init__(self, sampler: Sampler, depth: int = 2, stage: Stage | None = None) -> None:
        self.sampler = sampler
        self.depth = max(0, int(depth))
        self.stage = stage
        self.wait_s = 0.0
        self.steps = 0
        self._cond = threading.Condition()
        # (generator state before the draw, samples or the exception it raised)
        self._buffer: collections.deque[tuple[dict[str, Any], Samples | BaseException]] = (
            collections.deque()
        )
        self._thread: threading.Thread | None = None
        self._closing = False
        self._n = 0

    def __enter__(self) -> SampleFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next(self, n: int) -> Samples:
        """The next step's ``n`` samples: ``(images, labels)`` as ``sampler.sample(n)``."""
        started = time.perf_counter()
        try:
            if self.depth == 0:
                return self._staged(self.sampler.sample(n))
            if self._thread is None or n != self._n:
                self._stop_producer()
                self._start_producer(n)
            with self._cond:
                while not self._buffer:
                    self._cond.wait()
                _, item = self._buffer.popleft()
                self._cond.notify_all()
            if isinstance(item, BaseException):
                self._stop_producer()
                raise item
            return item
        finally:
            self.wait_s += time.perf_counter() - started
            self.steps += 1

    def close(self) -> None:
        """Stop the producer and give back the steps drawn but not used; idempotent."""
        self._stop_producer()

    @property
    def running(self) -> bool:
        """True while the producer thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # --- producer ------------------------------------------------------------------

    def _staged(self, samples: Samples) -> Samples:
        if self.stage is None:
            return samples
        images, labels = samples
        return self.stage(images), self.stage(labels)

    def _start_producer(self, n: int) -> None:
        self._n = n
        self._closing = False
        self._thread = threading.Thread(
            target=self._produce, args=(n,), name="napari-finetune-prefetch", daemon=True
        )
        self._thread.start()

    def _stop_producer(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        thread.join()
        self._thread = None
        # Give back what was drawn and not used: the sampler continues exactly
        # where the training thread's own draws would have left it.
        if self._buffer:
            self.sampler.set_state(self._buffer[0][0])
            self._buffer.clear()

    def _produce(self, n: int) -> None:
        while True:
            with self._cond:
                while len(self._buffer) >= self.depth and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
            state = self.sampler.get_state()
            item: Samples | BaseException
            try:
                item = self._staged(self.sampler.sample(n))
            except BaseException as exc:  # handed to the training thread, raised there
                item = exc
            with self._cond:
                if self._closing:
                    # Drawn after the run stopped asking: undo the draw.
                    self.sampler.set_state(state)
                    return
                self._buffer.append((state, item))
                self._cond.notify_all()
            if isinstance(item, BaseException):
                return
