"""Mixed precision of a run: bf16 where the hardware has it, else fp16 + GradScaler.

Re-exported by :mod:`napari_finetune.trainer.recovery` (the public API).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# A single non-finite step under bf16/fp16 is redone in fp32 and the next step
# is mixed again; mixed precision is given up for good only when bad steps
# come this often. Measured on torch 2.13's CPU bf16 kernels
# (benchmarks/bench_bf16_cpu.py): a glitch now and then in a healthy run, not
# a run whose numbers are wrong; a model that really overflows in bf16/fp16
# fails step after step and reaches the limit within a few steps.
BAD_STEP_LIMIT = 3
BAD_STEP_WINDOW = 50


def precision_words(dtype_name: str, grad_scaler: bool) -> str:
    """What a dtype means, in the words the panel, the CLI and the log use.

    "bf16", "fp16 with loss scaling" or "fp32 (mixed precision off)".
    """
    if dtype_name == "bfloat16":
        return "bf16"
    if dtype_name == "float16":
        return "fp16 with loss scaling" if grad_scaler else "fp16"
    return "fp32 (mixed precision off)"


def _cuda_bf16_native(device: torch.device) -> bool:
    """Whether ``device`` has bf16 in hardware: ``torch.cuda.is_bf16_supported``'s
    answer without emulation, asked of the run's GPU.

    That function answers for the current device only (GPU 0 unless set), so
    on a host with mixed cards a run on cuda:1 would get the answer of cuda:0.
    Its test is repeated here for ``device``: every ROCm GPU has bf16, a CUDA
    one from compute capability 8.0 (Ampere) on.
    """
    if torch.version.hip:
        return True
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def choose_precision(
    device: torch.device, enabled: bool, cpu_bf16: bool = False
) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, whether a GradScaler is needed) for ``device``."""
    if not enabled:
        return None, False
    if device.type == "cuda":
        if _cuda_bf16_native(device):
            return torch.bfloat16, False
        return torch.float16, True
    if device.type == "cpu" and cpu_bf16:
        return torch.bfloat16, False
    return None, False  # MPS autocast is not reliable for training yet


class Precision:
    """Autocast dtype and GradScaler of a run, with a one-way fall-back to fp32.

    Parameters
    ----------
    device : str or torch.device
        Where the run trains.
    enabled : bool
        Whether mixed precision was asked for.
    cpu_bf16 : bool
        Allow bf16 autocast on the CPU.
    """

    def __init__(self, device: str | torch.device, enabled: bool, cpu_bf16: bool = False):
        self.device = torch.device(device)
        self.requested = bool(enabled)
        self.fell_back = False
        # Why mixed precision was given up for good ("" while it was not).
        self.fell_back_why = ""
        self.dtype, use_scaler = choose_precision(self.device, bool(enabled), cpu_bf16)
        # The mixed dtype of the run ("bfloat16"/"float16"; "float32" if none):
        # kept when a step is redone in fp32 or mixed precision is given up.
        self.mixed_dtype_name = str(self.dtype or torch.float32).replace("torch.", "")
        # Steps (0: the probe) whose mixed-precision result was non-finite and
        # that were redone in fp32.
        self.bad_steps: list[int] = []
        self._paused: torch.dtype | None = None
        # One code path for every dtype: a GradScaler that is a no-op unless fp16.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=use_scaler)

    @property
    def enabled(self) -> bool:
        """Whether autocast is on."""
        return self.dtype is not None

    @property
    def grad_scaler(self) -> bool:
        """Whether fp16 losses are scaled."""
        return self.scaler.is_enabled()

    @property
    def dtype_name(self) -> str:
        """"bfloat16", "float16" or "float32"."""
        return str(self.dtype or torch.float32).replace("torch.", "")

    @property
    def mixed_words(self) -> str:
        """The run's mixed precision in words ("bf16", "fp16 with loss scaling")."""
        return precision_words(self.mixed_dtype_name, self.grad_scaler)

    def describe(self) -> str:
        """The precision in words: "bf16", "fp16 with loss scaling", or why fp32.

        "fp32 (mixed precision off)" when it was not asked for; "fp32 (no mixed
        precision on the CPU)" when the device has none the run may use; "fp32
        (bf16 given up: ...)" after a fall-back, saying why.
        """
        if self.enabled or self.paused:
            return self.mixed_words
        if self.fell_back:
            return f"fp32 ({self.mixed_words} given up: {self.fell_back_why})"
        if self.requested:
            where = {"cpu": "the CPU", "mps": "Apple MPS"}.get(self.device.type, "this device")
            return f"fp32 (no mixed precision on {where})"
        return precision_words("float32", False)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast context for forward passes (a no-op in fp32)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def fall_back_to_fp32(self, why: str = "it disagreed with fp32") -> None:
        """Turn mixed precision off for the rest of the run; ``why`` for the words."""
        if self.dtype is None and self._paused is None:
            return  # already fp32: nothing to give up
        self.dtype = None
        self._paused = None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.fell_back = True
        self.fell_back_why = why

    # --- a single bad step, redone in fp32 ----------------------------------------

    @property
    def paused(self) -> bool:
        """Whether this step is being redone in fp32 (mixed again at the next)."""
        return self._paused is not None

    def bad_step(self, step: int) -> bool:
        """Count a non-finite mixed-precision step; True when that gives mixed precision up.

        The step is then redone in fp32 (:meth:`pause` until :meth:`resume`);
        the :data:`BAD_STEP_LIMIT`-th bad step within :data:`BAD_STEP_WINDOW`
        steps turns mixed precision off for good instead.

        Parameters
        ----------
        step : int
            The optimizer step that went bad (0: the precision probe).
        """
        self.bad_steps.append(int(step))
        recent = [s for s in self.bad_steps if s > step - BAD_STEP_WINDOW]
        if len(recent) >= BAD_STEP_LIMIT:
            self.fall_back_to_fp32(
                f"{len(recent)} steps with non-finite values within {BAD_STEP_WINDOW}"
            )
            return True
        self.pause()
        return False

    def pause(self) -> None:
        """Run in fp32 until :meth:`resume` (a bad step's redo); the scaler is kept."""
        if self.dtype is not None:
            self._paused, self.dtype = self.dtype, None

    def resume(self) -> None:
        """Back to the mixed dtype after a step redone in fp32 (no-op otherwise)."""
        if self._paused is not None:
            self.dtype, self._paused = self._paused, None

    @contextlib.contextmanager
    def paused_for(self) -> Iterator[None]:
        """fp32 inside, the mixed dtype again after (however the block ends)."""
        was = self.paused
        self.pause()
        try:
            yield
        finally:
            if not was:
                self.resume()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass through the GradScaler (which scales only under fp16)."""
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide fp16 gradients by the scale, so they can be measured and clipped."""
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> tuple[bool, float, float]:
        """Apply the optimizer step; returns (applied, scale before, scale after).

        With a GradScaler a step whose gradients overflowed is skipped by the
        scaler, which lowers its scale: detected by the scale going down.
        """
        before = float(self.scaler.get_scale())
        self.scaler.step(optimizer)
        self.scaler.update()
        after = float(self.scaler.get_scale())
        return after >= before, before, after

    def reset_step_state(self, saved: dict[str, float | int] | None = None) -> None:
        """Forget a half-done scaler step (an OOM after ``unscale``), so it can be redone.

        A fresh scaler with the old one's scale and growth tracker (or those of
        ``saved``, a ``scaler.state_dict()`` from before the step): the scaler
        has no public way to drop the per-optimizer record of an unscale.
        """
        if self.scaler.is_enabled():
            fresh = torch.amp.GradScaler(self.device.type, enabled=True)
            fresh.load_state_dict(saved or self.scaler.state_dict())
            self.scaler = fresh

    @staticmethod
    def gradients_finite(model: torch.nn.Module) -> bool:
        """Whether the total gradient norm, summed in fp32, is finite (one device sync).

        Finite is not enough: measured on torch 2.13 CPU, bf16 at a 2x4x4
        bottleneck gave gradients of 2.9e35 (fp32: 0.007) and filled AdamW's
        second moments with inf. Squared and summed in fp32, any gradient
        above ~1.8e19 overflows, so such garbage counts as non-finite (and a
        NaN or inf anywhere does too).
        """
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return True
        return bool(torch.isfinite(total_squared_norm(grads)))


def total_squared_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Sum of the squares of every gradient, computed in fp32 without rescaling.

    One fused norm kernel per device and dtype (``torch._foreach_norm``, as
    ``clip_grad_norm_`` uses), not a square and a sum per parameter: on a GPU
    the per-parameter kernels cost more than the check itself. The norms are
    squared again in fp32, so the sum overflows exactly where the per-parameter
    sums of squares would (any gradient norm above ~1.8e19).
    """
    fp32 = [g.detach() if g.dtype == torch.float32 else g.detach().float() for g in grads]
    foreach_norm = getattr(torch, "_foreach_norm", None)
    if foreach_norm is None:  # a torch without the fused kernel: one norm per tensor
        norms = [torch.linalg.vector_norm(g) for g in fp32]
    else:
        norms = list(foreach_norm(fp32, 2))
    devices = {n.device for n in norms}
    if len(devices) > 1:  # a model split over devices: add up on the first one
        first = norms[0].device
        norms = [n.to(first) for n in norms]
    return torch.stack(norms).square().sum()


def clip_gradients(model: torch.nn.Module, max_norm: float) -> None:
    """Scale the gradients down so their total norm is at most ``max_norm``."""
    params = [p for p in model.parameters() if p.grad is not None]
    if params:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
