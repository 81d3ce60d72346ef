"""Build a model from its architecture record, running only code that is allowed.

A checkpoint names how to rebuild its model: ``{"factory": "package.module:callable",
"kwargs": {...}}``. The factory is imported and called only when it is on the
allow-list of :mod:`napari_finetune.model.architectures` or trusted by the
user: a file must never make the loader run code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from napari_finetune.model.architectures import FactoryNotAllowed, Trust, resolve_factory
from napari_finetune.model.plain_kwargs import from_plain


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt or does not match its architecture."""


def build_model(architecture: dict[str, Any], trust: Trust = None) -> nn.Module:
    """Call ``architecture["factory"]`` (``"module:callable"``) with its kwargs.

    Only factories on the allow-list (or in ``trust``) are imported and called;
    the classes or functions named under ``callable_kwargs`` pass the same check.
    """
    factory = str(architecture.get("factory", ""))
    kwargs = architecture.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise CheckpointError(
            f"the architecture's 'kwargs' must be a dict of named arguments, got {kwargs!r}"
        )
    try:
        fn = resolve_factory(factory, trust)
        kwargs = from_plain(kwargs, list(architecture.get("callable_kwargs") or ()), trust)
    except FactoryNotAllowed as exc:
        raise CheckpointError(str(exc)) from None
    except (ImportError, AttributeError, ValueError) as exc:
        raise CheckpointError(
            f"cannot import the model factory {factory!r} ({exc}); install the package "
            "that defines it."
        ) from None
    return call_factory(fn, factory, kwargs)


def call_factory(fn: Callable[..., object], factory: str, kwargs: dict[str, Any]) -> nn.Module:
    """``fn(**kwargs)``, checked to be a module and marked with how to build it again.

    The model gets ``init_kwargs`` (unless it records its own) and ``factory``,
    which :func:`architecture_of` reads back at export. A factory that rejects
    its arguments or returns something else is a one-line :class:`CheckpointError`.
    """
    try:
        model = fn(**kwargs)
    except TypeError as exc:
        raise CheckpointError(
            f"the model factory {factory!r} rejected its arguments: {exc}"
        ) from None
    if not isinstance(model, nn.Module):
        raise CheckpointError(
            f"the model factory {factory!r} returned a {type(model).__name__}, "
            "not a torch.nn.Module."
        )
    # torch types Module.__setattr__'s value as Tensor | Module; plain values work too.
    if not hasattr(model, "init_kwargs"):
        model.init_kwargs = dict(kwargs)  # type: ignore[assignment]
    model.factory = factory  # type: ignore[assignment]
    return model
