"""Fault injection: out-of-memory, non-finite and finite-but-wrong values, on any device.

``torch.OutOfMemoryError`` can be raised on the CPU, so every recovery path
is testable without a GPU. Each injector returns a :class:`Fault` handle with
``.count`` (how often it fired) and ``.remove()``. :class:`MemoryBudget` is
the strongest test of the ladder: it counts the bytes of every live storage
allocated inside it and fails an allocation above the budget, the way a GPU
allocator does, so halving the batch really does make the step fit.

:class:`MemoryBudget` also answers the questions autobatch asks a device
(free bytes, the peak of a measured stretch), so the memory-aware start runs
against it on the CPU exactly as it runs against CUDA's allocator.

Re-exported by :mod:`napari_finetune.testing`; import them from there.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from napari_finetune.trainer.loop import Finetuner


def _oom(message: str) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"CUDA out of memory. {message} (injected)")


class Fault:
    """Handle of an injected fault: ``count`` of times fired, ``remove()``."""

    def __init__(self) -> None:
        self.count = 0
        self._removers: list[Callable[[], None]] = []

    def fire(self, exc: BaseException) -> None:
        self.count += 1
        raise exc

    def remove(self) -> None:
        for remover in self._removers:
            remover()
        self._removers.clear()


def oom_above_batch(module: torch.nn.Module, max_batch: int, times: int | None = None) -> Fault:
    """Forward pre-hook: OOM when ``module`` gets more than ``max_batch`` samples.

    ``times`` limits how often it fires (None: always).
    """
    fault = Fault()

    def hook(_module: torch.nn.Module, args: tuple) -> None:
        batch = args[0].shape[0]
        if batch > max_batch and (times is None or fault.count < times):
            fault.fire(_oom(f"Tried a batch of {batch}, the budget holds {max_batch}."))

    fault._removers.append(module.register_forward_pre_hook(hook).remove)
    return fault


def oom_in_backward_above_batch(
    module: torch.nn.Module, max_batch: int, times: int | None = None
) -> Fault:
    """OOM during the backward pass through ``module`` above ``max_batch`` samples."""
    fault = Fault()

    def on_grad(grad: torch.Tensor) -> None:
        if grad.shape[0] > max_batch and (times is None or fault.count < times):
            fault.fire(_oom(f"Backward of a batch of {grad.shape[0]} > {max_batch}."))

    def hook(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> None:
        if torch.is_grad_enabled() and output.requires_grad:
            output.register_hook(on_grad)

    fault._removers.append(module.register_forward_hook(hook).remove)
    return fault


def always_oom(module: torch.nn.Module) -> Fault:
    """Every forward of ``module`` runs out of memory."""
    return oom_above_batch(module, 0)


def oom_in_teacher(trainer: Finetuner, max_batch: int = 0, times: int | None = None) -> Fault:
    """OOM in the teacher's forward only (above ``max_batch``); needs a built trainer."""
    teacher = trainer.teacher
    if teacher is None:
        raise ValueError("the trainer has no teacher yet: call trainer.build() first.")
    fault = Fault()
    original = teacher.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        # The teacher's public forward is the seam: the student's forward runs unhooked.
        if x.shape[0] > max_batch and (times is None or fault.count < times):
            fault.fire(_oom(f"Teacher forward of a batch of {x.shape[0]}."))
        return original(x)

    # An instance attribute shadows the method, as the other hooks here do with step.
    teacher.forward = forward  # type: ignore[method-assign]
    fault._removers.append(lambda: setattr(teacher, "forward", original))
    return fault


def oom_in_optimizer_step(
    optimizer: torch.optim.Optimizer, times: int = 1, after: bool = False
) -> Fault:
    """The next ``times`` calls of ``optimizer.step`` run out of memory.

    ``after=False``: before anything is updated; ``after=True``: once the
    update has been applied (the worst case of an OOM half-way through).
    """
    fault = Fault()
    original = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        if fault.count < times:
            if after:
                original(*args, **kwargs)
            fault.fire(_oom("Optimizer state allocation."))
        return original(*args, **kwargs)

    optimizer.step = step  # type: ignore[method-assign]
    fault._removers.append(lambda: setattr(optimizer, "step", original))
    return fault


def nan_in_forward(
    module: torch.nn.Module, when: Callable[[], bool] | None = None, value: float = float("nan")
) -> Fault:
    """Forward hook putting ``value`` (NaN by default) into ``module``'s output.

    ``when`` decides per call; default: only while autocast is on, which is how
    a real fp16/bf16 overflow behaves (fp32 then runs clean).
    """
    fault = Fault()

    def active() -> bool:
        if when is not None:
            return when()
        return any(
            torch.is_autocast_enabled(device) for device in ("cpu", "cuda")
        )

    def hook(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        if active():
            fault.count += 1
            return output + value
        return output

    fault._removers.append(module.register_forward_hook(hook).remove)
    return fault


def wrong_under_autocast(
    module: torch.nn.Module, how: str = "negate", noise: float = 1.0,
    device_type: str | None = None,
) -> Fault:
    """Forward hook making ``module``'s output finite but wrong, only under autocast.

    The failure the precision probe's fp32 comparison is for: a reduced-precision
    kernel (cuDNN's bf16/fp16 conv3d, pytorch#163539 and #40275) that returns
    plausible numbers, no NaN nor inf, that are not the convolution asked for.
    fp32 passes run clean.

    Parameters
    ----------
    module : torch.nn.Module
        Typically the first ``Conv3d`` of the model.
    how : {"negate", "flip", "noise"}
        "negate": the output's sign flipped; "flip": its channels in reverse
        order (same values, wrong places); "noise": ``noise`` times the
        output's standard deviation of Gaussian noise added, from a generator
        of its own (the run's random states are not touched).
    noise : float
        The noise's scale for ``how="noise"``.
    device_type : str, optional
        Whose autocast turns the fault on; default the output's device. Under
        :class:`~napari_finetune.testing.cuda.FakeCuda` with ``tensors_on_host``
        a CUDA run computes on the CPU inside a CUDA autocast: pass "cuda".
    """
    if how not in ("negate", "flip", "noise"):
        raise ValueError(f"how must be 'negate', 'flip' or 'noise', got {how!r}")
    fault = Fault()

    def hook(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(device_type or output.device.type):
            return output
        fault.count += 1
        if how == "negate":
            return -output
        if how == "flip":
            return output.flip(1)
        generator = torch.Generator(device=output.device).manual_seed(fault.count)
        jitter = torch.randn(
            output.shape, generator=generator, device=output.device, dtype=output.dtype
        )
        return output + noise * output.detach().float().std().to(output.dtype) * jitter

    fault._removers.append(module.register_forward_hook(hook).remove)
    return fault


class MemoryBudget(TorchDispatchMode):
    """Fail allocations above a budget of live bytes, like a small GPU.

    Every tensor an operation returns inside the mode is checked: a storage
    not seen before is counted until it is freed (a weakref finalizer on the
    storage takes it off the books). An operation whose new storages would
    exceed ``budget_bytes`` raises ``torch.OutOfMemoryError``. Outputs sharing
    an input's storage (views, in-place updates) allocate nothing. Tensors
    created before the mode (weights) are not counted; optimizer state created
    inside is.

    It is also a memory-information provider for autobatch
    (:class:`~napari_finetune.trainer.autobatch.MemoryInfo`): ``free_bytes()``
    is the budget left, ``start_measure()`` / ``measured_peak()`` the peak
    of live bytes above where a measured stretch started. ``budget_bytes`` may
    be changed while the mode is active (a GPU that another program fills).

    Attributes
    ----------
    live_bytes, peak_bytes : int
        Bytes counted now and at most.
    oom_count : int
        Allocations refused.
    """

    name = "MemoryBudget"

    def __init__(self, budget_bytes: int) -> None:
        super().__init__()
        self.budget_bytes = int(budget_bytes)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.oom_count = 0
        self._live: dict[int, int] = {}
        self._measure_base = 0
        self._measure_peak = 0

    # --- the memory-information provider of autobatch ----------------------------

    def free_bytes(self) -> int:
        """Bytes that can still be allocated before the budget refuses."""
        return max(0, self.budget_bytes - self.live_bytes)

    def start_measure(self) -> None:
        """Start a measured stretch at the live bytes of now."""
        self._measure_base = self._measure_peak = self.live_bytes

    def observe(self) -> None:
        """Nothing to sample: every allocation updates the peak already."""

    def measured_peak(self) -> int:
        """Peak live bytes of the stretch, above where it started."""
        return max(0, self._measure_peak - self._measure_base)

    def _forget(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(
        self, func: Callable[..., object], types: tuple[type, ...],
        args: tuple[object, ...] = (), kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # Outputs that share an input's storage (views, in-place ops) allocate nothing.
        inputs = tree_leaves((args, kwargs))
        seen = {id(t.untyped_storage()) for t in inputs if isinstance(t, torch.Tensor)}
        new: list[tuple[int, Any, int]] = []
        for leaf in tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            storage = leaf.untyped_storage()
            key = id(storage)
            if key in self._live or key in seen:
                continue
            seen.add(key)
            new.append((key, storage, storage.nbytes()))
        total = sum(n for _, _, n in new)
        if total and self.live_bytes + total > self.budget_bytes:
            self.oom_count += 1
            del out, new
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {total} bytes; {self.live_bytes} of "
                f"{self.budget_bytes} bytes in use (MemoryBudget)."
            )
        for key, storage, nbytes in new:
            self._live[key] = nbytes
            self.live_bytes += nbytes
            weakref.finalize(storage, self._forget, key)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self._measure_peak = max(self._measure_peak, self.live_bytes)
        return out


class BuildHooks:
    """Fault injection for runs the widget starts (tests and benchmarks fill, then clear).

    The widget's training job calls each ``model`` hook on the loaded model before the
    trainer is built, and adds each ``trainer`` hook to ``Finetuner.after_build``.
    """

    def __init__(self) -> None:
        self.model: list[Callable[[torch.nn.Module], Any]] = []
        self.trainer: list[Callable[[Finetuner], None]] = []

    def clear(self) -> None:
        """Remove every hook."""
        self.model.clear()
        self.trainer.clear()


build_hooks = BuildHooks()
