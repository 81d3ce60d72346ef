"""Mixed precision compared with fp32: right, not only finite.

A finite loss and finite gradients under bf16/fp16 do not make the numbers
right: cuDNN's reduced-precision 3D convolutions have returned finite but
wrong results (pytorch#163539, conv3d bf16 on cuDNN 9.10.2; pytorch#40275,
Conv3d fp16 on a V100 with a cosine of 0.75-0.83 to fp32). The precision probe
(:func:`~napari_finetune.trainer.oom_recovery.iter_probe`) therefore runs its
first batch once more in fp32, with the same weights, inputs and random
states, and compares the two here: the model's output (cosine and relative
error) and the direction of the gradient (cosine).

This module only measures and judges; it imports nothing of the trainer, so
the run state can hold a :class:`PrecisionCheck` without an import circle.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from napari_finetune.trainer.precision import precision_words

__all__ = [
    "MIN_GRAD_COSINE",
    "MIN_OUTPUT_COSINE",
    "PrecisionCheck",
    "captured_outputs",
    "cosine",
    "judge",
    "not_compared",
    "relative_error",
]

# The output threshold, by measurement (torch 2.13 CPU, bf16 autocast against
# an fp32 pass of the same weights and inputs with the run's loss,
# benchmarks/bench_probe.py): healthy bf16 gave output cosines of 0.99987 to
# 0.999985 (relative errors 0.005 to 0.016): the sample model at 32^3 0.999985
# (0.0054), UNet(dims=3) depth 2 x 4 features 0.99996 (0.0093), depth 3 x 16
# features 0.99994 (0.011), with BatchNorm 0.99987 (0.016). The bugs reported
# sit at cosines of 0.75-0.83, relative errors 0.17-0.55. A cosine of 0.99
# (the common practice) leaves ~80x in 1 - cosine above the worst healthy
# figure and still catches any relative error above ~0.14 (1 - cosine ~
# error^2 / 2), below the smallest bug. An error bound of a few times fp32's
# own (fp32 against fp64 measured 3e-7 to 1.2e-6 here) would reject every
# healthy bf16 run: bf16 keeps 8 bits of mantissa, fp32 24.
MIN_OUTPUT_COSINE = 0.99

# The gradient's direction is noisier than the output: the backward rounds
# once more per layer, and near the starting weights the gradient is small.
# Healthy bf16 measured 0.995-0.9999 on the models above, 0.97 on the tests'
# depth 2 x 4 features UNet at a 4x8x8 patch (its lowest); 0.9 keeps that
# margin while a direction lost to a wrong layer (the tests' sign flip)
# falls far below it.
MIN_GRAD_COSINE = 0.9


@dataclass(frozen=True)
class PrecisionCheck:
    """Mixed precision against fp32 on the probe's first batch.

    Attributes
    ----------
    dtype : str
        The mixed-precision dtype compared ("bfloat16" or "float16").
    output_cosine : float or None
        Cosine between the mixed-precision and the fp32 output (None: not compared).
    output_rel_error : float or None
        ``||mixed - fp32|| / ||fp32||`` of the output.
    grad_cosine : float or None
        Cosine between the two gradients, all trainable parameters as one vector.
    agree : bool
        Whether the run may keep the mixed precision (on every rank).
    verdict : str
        One line for the log and the record.
    """

    dtype: str
    output_cosine: float | None
    output_rel_error: float | None
    grad_cosine: float | None
    agree: bool
    verdict: str

    @property
    def compared(self) -> bool:
        """Whether the fp32 pass ran (False: "not compared", kept on finiteness alone)."""
        return self.output_cosine is not None

    def to_dict(self) -> dict[str, str | float | bool | None]:
        """Plain types for the run record (``weights_only`` loading)."""
        return {
            "dtype": self.dtype,
            "output_cosine": self.output_cosine,
            "output_rel_error": self.output_rel_error,
            "grad_cosine": self.grad_cosine,
            "agree": self.agree,
            "verdict": self.verdict,
        }

    def disagreed_elsewhere(self) -> PrecisionCheck:
        """This rank agreed, another did not: the run falls back all the same."""
        return PrecisionCheck(
            self.dtype, self.output_cosine, self.output_rel_error, self.grad_cosine, False,
            f"{_words(self.dtype)} disagrees with fp32 on another rank (here output cosine "
            f"{_figure(self.output_cosine)}): training in fp32",
        )


def _pairs_dot(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float, float]:
    """(a.b, a.a, b.b) summed over the pairs, in float64 so the measure adds no error."""
    dot = aa = bb = 0.0
    for a, b in pairs:
        a64, b64 = a.detach().reshape(-1).double(), b.detach().reshape(-1).double()
        dot += float(torch.dot(a64, b64))
        aa += float(torch.dot(a64, a64))
        bb += float(torch.dot(b64, b64))
    return dot, aa, bb


def cosine(
    a: torch.Tensor | Sequence[torch.Tensor], b: torch.Tensor | Sequence[torch.Tensor]
) -> float:
    """Cosine between ``a`` and ``b``, each a tensor or tensors taken as one vector.

    1.0 for two zero vectors (they agree), 0.0 when only one is zero, NaN when
    a value is not finite.
    """
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        pairs = [(a, b)]
    elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        raise TypeError("cosine compares two tensors or two sequences of tensors, not one of each")
    else:
        pairs = list(zip(a, b, strict=True))
    dot, aa, bb = _pairs_dot(pairs)
    if aa == 0.0 or bb == 0.0:
        return 1.0 if aa == bb else 0.0
    return dot / math.sqrt(aa * bb)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """``||value - reference|| / ||reference||`` in float64 (0.0 when both are zero)."""
    diff = value.detach().double() - reference.detach().double()
    num = float(torch.linalg.vector_norm(diff))
    den = float(torch.linalg.vector_norm(reference.detach().double()))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


@contextmanager
def captured_outputs(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect a detached copy of every tensor ``model``'s forward returns, while inside.

    Forwards under ``no_grad`` are left out: an adapters-off teacher is the
    student's own module run under ``no_grad``, and its output is not the one
    trained. A copy, not the tensor: the training code frees its outputs
    between micro-batches, and an in-place op after the hook would change a view.
    """
    outputs: list[torch.Tensor] = []

    def hook(_module: torch.nn.Module, _args: tuple, output: object) -> None:
        if not torch.is_grad_enabled():
            return
        tensors = output if isinstance(output, (list, tuple)) else [output]
        outputs.extend(t.detach().clone() for t in tensors if isinstance(t, torch.Tensor))

    handle = model.register_forward_hook(hook)
    try:
        yield outputs
    finally:
        handle.remove()


def _words(dtype: str) -> str:
    """"bf16" or "fp16": the dtype compared, without the loss scaling (not compared)."""
    return precision_words(dtype, False)


def _figure(value: float | None) -> str:
    # Enough digits to tell 0.99998 from 0.99 in a log line.
    return "n/a" if value is None else f"{value:.5g}"


def judge(
    dtype: str,
    mixed_outputs: Sequence[torch.Tensor],
    fp32_outputs: Sequence[torch.Tensor],
    mixed_grads: Sequence[torch.Tensor],
    fp32_grads: Sequence[torch.Tensor],
) -> PrecisionCheck:
    """Compare one mixed-precision pass with the fp32 pass of the same batch.

    Parameters
    ----------
    dtype : str
        The mixed-precision dtype, for the verdict.
    mixed_outputs, fp32_outputs : sequence of torch.Tensor
        The model's outputs of the two passes, in the same order.
    mixed_grads, fp32_grads : sequence of torch.Tensor
        The trainable parameters' gradients of the two passes, in the same order.

    Returns
    -------
    PrecisionCheck
        ``agree`` when the output cosine is at least :data:`MIN_OUTPUT_COSINE`
        and the gradient cosine at least :data:`MIN_GRAD_COSINE`.
    """
    if len(mixed_outputs) != len(fp32_outputs) or not fp32_outputs:
        raise ValueError(
            f"the two passes gave {len(mixed_outputs)} and {len(fp32_outputs)} outputs"
        )
    out_cos = cosine(list(mixed_outputs), list(fp32_outputs))
    mixed_flat = torch.cat([t.detach().reshape(-1).double() for t in mixed_outputs])
    fp32_flat = torch.cat([t.detach().reshape(-1).double() for t in fp32_outputs])
    rel = relative_error(mixed_flat, fp32_flat)
    grad_cos = cosine(list(mixed_grads), list(fp32_grads)) if fp32_grads else 1.0
    # NaN compares False: a NaN figure never agrees.
    agree = out_cos >= MIN_OUTPUT_COSINE and grad_cos >= MIN_GRAD_COSINE
    figures = f"output cosine {_figure(out_cos)}, relative error {_figure(rel)}, " \
        f"gradient cosine {_figure(grad_cos)}"
    words = _words(dtype)
    if agree:
        verdict = f"{words} agrees with fp32 on this model ({figures})"
    else:
        # What disagreed first, by how much, against what bound: the output is
        # the figure the bug reports compare.
        wrong = []
        if not out_cos >= MIN_OUTPUT_COSINE:
            wrong.append(
                f"output cosine {_figure(out_cos)} (at least {MIN_OUTPUT_COSINE} expected; "
                f"relative error {_figure(rel)})"
            )
        if not grad_cos >= MIN_GRAD_COSINE:
            wrong.append(
                f"gradient cosine {_figure(grad_cos)} (at least {MIN_GRAD_COSINE} expected)"
            )
        verdict = f"{words} disagrees with fp32 on this model: {', '.join(wrong)}; training in fp32"
    return PrecisionCheck(dtype, out_cos, rel, grad_cos, agree, verdict)


def not_compared(dtype: str, why: str) -> PrecisionCheck:
    """A check that could not be made (the fp32 pass ran out of memory): kept as it was.

    "Not compared" is not "agrees": the verdict says so, and that the run keeps
    mixed precision on the finiteness check alone.
    """
    words = _words(dtype)
    return PrecisionCheck(
        dtype, None, None, None, True,
        f"{words} not compared with fp32 (out of memory: {why}); keeping {words} on the "
        "finiteness check alone",
    )
