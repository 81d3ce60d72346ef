"""Constructor arguments as plain data, and back.

A checkpoint must load with ``torch.load(..., weights_only=True)``, which reads
plain types only: a class among the constructor arguments (torch-em keeps
``conv_block_impl=ConvBlock3d`` in its ``init_kwargs``) made every export of such
a model unreadable. Here a class or function argument becomes its importable
``"module:qualname"`` string and its key is listed; on load the listed strings
are resolved through the allow-list of
:mod:`~napari_finetune.model.architectures`, exactly like the factory itself,
so a file can never make the loader import what no one allowed.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping

from napari_finetune.model.architectures import (
    FactoryNotAllowed,
    Trust,
    factory_name,
    resolve_factory,
)

Plain = str | int | float | bool | None | list["Plain"] | tuple["Plain", ...] | dict[str, "Plain"]


class NotPlainError(ValueError):
    """A constructor argument that cannot be written as plain data."""


def _plain(value: object, where: str) -> Plain:
    if value is None or type(value) in (str, int, float, bool):
        return value  # type: ignore[return-value]
    if isinstance(value, enum.Enum):  # MONAI passes StrEnum members (Norm.INSTANCE)
        return _plain(value.value, where)
    if isinstance(value, (str, bool, int, float)):  # subclasses: numpy scalars, str enums
        for kind in (bool, int, float, str):
            if isinstance(value, kind):
                return kind(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return _plain(value.item(), where)
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise NotPlainError(
        f"the constructor argument {where} is a {type(value).__name__}, which a checkpoint "
        "cannot store as plain data; pass a class, a string or numbers instead."
    )


def to_plain(kwargs: Mapping[str, object]) -> tuple[dict[str, Plain], list[str]]:
    """Plain-data kwargs, and the keys whose class/function became a ``"module:qualname"``.

    Raises
    ------
    NotPlainError
        An argument that is neither plain data nor a top-level class or function
        (a module instance, an open file...); the message names it.
    """
    plain: dict[str, Plain] = {}
    callables: list[str] = []
    for key, value in kwargs.items():
        if inspect.isclass(value) or inspect.isfunction(value):
            if "<locals>" in value.__qualname__:
                raise NotPlainError(
                    f"the constructor argument {key!r} is {value.__qualname__}, defined inside "
                    "a function, so it cannot be imported by name; define it at module level."
                )
            plain[key] = factory_name(value)
            callables.append(key)
        else:
            plain[key] = _plain(value, repr(key))
    return plain, callables


def from_plain(
    kwargs: Mapping[str, object], callables: list[str] | tuple[str, ...], trust: Trust = None
) -> dict[str, object]:
    """kwargs with the listed keys resolved to their class or function (allow-listed only).

    Raises
    ------
    FactoryNotAllowed
        A listed name that is on no allow-list and not trusted.
    """
    resolved = dict(kwargs)
    for key in callables:
        if key not in resolved:
            continue
        name = str(resolved[key])
        try:
            resolved[key] = resolve_factory(name, trust)
        except FactoryNotAllowed:
            raise FactoryNotAllowed(
                f"the checkpoint passes {name!r} as the model's argument {key!r}, which is "
                "not a class napari-finetune knows (its own, those of MONAI/torch-em models, "
                "or one an installed package registered); importing it could run any code. If "
                f"you trust the file and that package, load it with --trust-factory {name} "
                f"(Python: load_checkpoint(path, trust=[..., {name!r}]))."
            ) from None
    return resolved
