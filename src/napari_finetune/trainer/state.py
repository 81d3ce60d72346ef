"""State that a failed attempt or the precision probe must leave exactly as it was.

A failed forward still updates BatchNorm running statistics, a backward OOM
leaves partial gradients, and the probe draws patches and random numbers:
these helpers copy that state cheaply and put it back.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn.modules.batchnorm import _BatchNorm

if TYPE_CHECKING:
    from napari_finetune.data.sampling import PatchSampler

BATCHNORM_TYPES = (_BatchNorm,)

BatchNormState = list[tuple[torch.nn.Module, dict[str, torch.Tensor]]]


def batchnorm_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """BatchNorm layers of ``model`` that track running statistics."""
    return [
        m for m in model.modules() if isinstance(m, BATCHNORM_TYPES) and m.track_running_stats
    ]


def batchnorm_state(
    model: torch.nn.Module, modules: list[torch.nn.Module] | None = None
) -> BatchNormState:
    """Copies of the running statistics (and batch counters) of every BatchNorm."""
    modules = batchnorm_modules(model) if modules is None else modules
    return [
        (m, {k: v.detach().clone() for k, v in m.named_buffers(recurse=False)}) for m in modules
    ]


def restore_batchnorm(saved: BatchNormState) -> None:
    """Undo the running-statistics updates made since :func:`batchnorm_state`."""
    with torch.no_grad():
        for module, buffers in saved:
            for name, value in buffers.items():
                getattr(module, name).copy_(value)


def grad_state(model: torch.nn.Module) -> list[tuple[torch.nn.Parameter, torch.Tensor | None]]:
    """The ``.grad`` of every parameter (copied), ``None`` where there is none."""
    return [
        (p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()
    ]


def restore_grads(saved: list[tuple[torch.nn.Parameter, torch.Tensor | None]]) -> None:
    """Put the gradients saved by :func:`grad_state` back."""
    for param, grad in saved:
        param.grad = grad


def rng_state(sampler: PatchSampler | None) -> dict[str, Any]:
    """Every random state a training step consumes: torch (CPU, CUDA), numpy,
    Python's ``random`` and the patch sampler's generator."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the global state is what we guard
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if sampler is not None:
        state["sampler"] = sampler.get_state()
    return state


def restore_rng(sampler: PatchSampler | None, state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if sampler is not None and "sampler" in state:
        sampler.set_state(state["sampler"])


@contextmanager
def left_as_it_was(
    model: torch.nn.Module, sampler: PatchSampler | None
) -> Iterator[BatchNormState]:
    """Random states, BatchNorm statistics and gradients as on entry, however the block ends.

    For the measurements before step 1 (autobatch's profile, the precision
    probe), which run real training micro-steps that must change nothing.
    Yields the saved BatchNorm state, so a block that runs several attempts
    can put the statistics back between them.
    """
    rng = rng_state(sampler)
    bn = batchnorm_state(model)
    grads = grad_state(model)
    try:
        yield bn
    finally:
        restore_rng(sampler, rng)
        restore_batchnorm(bn)
        restore_grads(grads)
