"""What a model needs from its input and what it gives back: output channels, spatial multiple.

A UNet only runs on sizes its poolings divide (MONAI ``UNet`` with strides
(2, 2, 2) needs multiples of 8, torch-em ``AnisotropicUNet`` with scale factors
[[1, 2, 2], [2, 2, 2]] needs 4 in z and 8 in y and x). Blockwise prediction pads
and aligns its blocks to that multiple, and a training patch must be one.

The answer comes, in this order, from

1. the model itself: a ``shape_multiple`` attribute (int, or one per axis) with
   ``out_channels`` in its ``init_kwargs`` (napari-finetune's UNet);
2. an architecture adapter (:mod:`~napari_finetune.model.adapters`), which knows
   it from the constructor arguments;
3. forward passes at sizes grown from a starting shape (the training patch): a
   size ``2**k * odd`` on every axis, ``k`` = 0, 1, ... until the output has the
   input's shape, then each axis alone lowered to its own smallest ``k``. Never a
   1x1x1 input (MONAI refuses "Expected more than 1 spatial element when
   training"); the passes run in eval mode under ``no_grad`` with every module's
   mode restored, so BatchNorm statistics and gradients are untouched.

Results are cached per model object (weakly: a model that is dropped is forgotten).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from napari_finetune.model.modes import evaluating

MAX_LEVEL = 6  # multiples up to 2**6 = 64 are found by probing
DEFAULT_PROBE_SIZE = 32


class ModelShapeError(ValueError):
    """The model cannot run on the given size (the message names the sizes)."""


@dataclass(frozen=True)
class ModelGeometry:
    """Output channels and the per-axis divisor a model's input sizes must have.

    Attributes
    ----------
    out_channels : int
    multiple : tuple of int
        One divisor per spatial axis (ZYX or YX).
    source : str
        "model", "adapter <name>" or "probe", for messages.
    """

    out_channels: int
    multiple: tuple[int, ...]
    source: str


_CACHE: weakref.WeakKeyDictionary[nn.Module, dict[int, ModelGeometry]] = (
    weakref.WeakKeyDictionary()
)


def fmt(shape: Sequence[int]) -> str:
    """``(30, 100, 100)`` -> ``"30x100x100"``."""
    return "x".join(str(int(s)) for s in shape)


def _unwrapped(model: nn.Module) -> nn.Module:
    # A PEFT wrapper answers for the user's module inside it (the same object, so
    # the cache of the unwrapped model serves both).
    from napari_finetune.model.lora import base_model

    return base_model(model)


def model_geometry(
    model: nn.Module, ndim: int, start_shape: Sequence[int] | None = None
) -> ModelGeometry:
    """Output channels and spatial multiple of ``model`` for ``ndim`` spatial axes.

    Parameters
    ----------
    model : torch.nn.Module
        Any module taking ``(N, 1, *spatial)`` and returning ``(N, C, *spatial)``.
    ndim : int
        Spatial axes (2 or 3).
    start_shape : sequence of int, optional
        Where probing starts growing (the training patch); 32 per axis by default.

    Raises
    ------
    ModelShapeError
        When no probed size gives an output of the input's shape.
    """
    inner = _unwrapped(model)
    known = _CACHE.get(inner, {}).get(ndim)
    if known is not None:
        return known
    found = _declared(inner, ndim) or _from_adapter(inner, ndim)
    if found is None:
        start = tuple(start_shape) if start_shape is not None else (DEFAULT_PROBE_SIZE,) * ndim
        found = probe_geometry(model, start)
    _CACHE.setdefault(inner, {})[ndim] = found
    return found


def spatial_multiple(model: nn.Module, ndim: int) -> tuple[int, ...]:
    """Per-axis divisor the model's input sizes need (see :func:`model_geometry`)."""
    return model_geometry(model, ndim).multiple


def shape_multiple(model: nn.Module, ndim: int | None = None) -> int:
    """One divisor that suits every axis (the least common multiple of the per-axis ones).

    ``ndim`` defaults to the model's ``dims`` (3 when it does not say).
    """
    return math.lcm(*spatial_multiple(model, ndim or int(getattr(model, "dims", 0) or 3)))


def fit_patch(model: nn.Module, patch_shape: Sequence[int]) -> ModelGeometry:
    """The model's geometry, after checking that it runs on ``patch_shape``.

    Raises
    ------
    ModelShapeError
        One line naming the patch, the multiple the model needs and a patch that fits.
    """
    patch = tuple(int(s) for s in patch_shape)
    geometry = model_geometry(model, len(patch), start_shape=patch)
    if any(p % m for p, m in zip(patch, geometry.multiple, strict=True)):
        fitting = tuple(-(-p // m) * m for p, m in zip(patch, geometry.multiple, strict=True))
        raise ModelShapeError(
            f"{type(_unwrapped(model)).__name__} cannot run on patches of {fmt(patch)}: its "
            f"input sizes must be multiples of {fmt(geometry.multiple)} (found by "
            f"{geometry.source}); use --patch-shape {' '.join(map(str, fitting))}."
        )
    _check_instance_norms(model, patch)
    return geometry


_INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


def _check_instance_norms(model: nn.Module, patch: tuple[int, ...]) -> None:
    """Refuse a patch at which an InstanceNorm layer would see one voxel per channel.

    In training mode torch refuses that ("Expected more than 1 spatial element
    when training") at the first step; one eval, no-grad pass at the patch with
    hooks on those layers finds it before (MONAI BasicUNet at 16x16x16).
    """
    # Keyed by Module: the hook receives its module as one.
    names: dict[nn.Module, str] = {
        m: n for n, m in model.named_modules() if isinstance(m, _INSTANCE_NORMS)
    }
    if not names:
        return
    single: list[str] = []

    def record(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if args[0][0, 0].numel() <= 1:
            single.append(names[module])

    handles = [m.register_forward_pre_hook(record) for m in names]
    try:
        with evaluating(model):
            _run(model, patch)
    finally:
        for handle in handles:
            handle.remove()
    if single:
        larger = " ".join(str(2 * s) for s in patch)
        raise ModelShapeError(
            f"{type(_unwrapped(model)).__name__} cannot train on patches of {fmt(patch)}: its "
            f"InstanceNorm layer {single[0]} sees one voxel per channel there, which torch "
            f"refuses in training; use a larger patch such as --patch-shape {larger}."
        )


def _declared(model: nn.Module, ndim: int) -> ModelGeometry | None:
    declared = getattr(model, "shape_multiple", None)
    channels = (getattr(model, "init_kwargs", None) or {}).get("out_channels")
    if declared is None or channels is None:
        return None
    multiple = _per_axis(declared, ndim)
    return ModelGeometry(int(channels), multiple, "model")


def _from_adapter(model: nn.Module, ndim: int) -> ModelGeometry | None:
    from napari_finetune.model.adapters import adapter_for, constructor_kwargs

    adapter = adapter_for(model)
    if adapter is None:
        return None
    kwargs = constructor_kwargs(model, adapter)
    if kwargs is None:
        return None
    multiple = _per_axis(adapter.spatial_multiple(kwargs, ndim), ndim)
    return ModelGeometry(int(adapter.out_channels(kwargs)), multiple, f"adapter {adapter.name}")


def _per_axis(value: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (max(1, value),) * ndim
    values = tuple(max(1, int(v)) for v in value)
    return values[-ndim:] if len(values) >= ndim else (values[0],) * ndim


def _size_at(start: int, level: int) -> int:
    """The smallest ``2**level * odd`` that is at least ``start`` (and at least 2)."""
    step = 2**level
    odd = max(1, -(-max(start, 2) // step))
    if odd % 2 == 0:
        odd += 1
    return step * odd


def _run(model: nn.Module, shape: tuple[int, ...]) -> tuple[int | None, str]:
    """(output channels, "") when ``model`` maps ``shape`` to ``shape``, else (None, why)."""
    from napari_finetune.devices import model_device, model_in_channels
    from napari_finetune.errors import is_oom_error

    x = torch.zeros((1, model_in_channels(model), *shape), device=model_device(model))
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as exc:  # noqa: BLE001 - a model says "wrong size" in many ways
        if is_oom_error(exc):
            raise
        text = " ".join(str(exc).split()) or type(exc).__name__
        return None, f"{type(exc).__name__}: {text[:160]}"
    if not isinstance(out, torch.Tensor) or out.ndim != len(shape) + 2:
        return None, f"returned {type(out).__name__}, not one (N, C, *spatial) tensor"
    if tuple(out.shape[2:]) != shape:
        return None, f"output {fmt(out.shape[2:])} for input {fmt(shape)}"
    return int(out.shape[1]), ""


def probe_geometry(model: nn.Module, start_shape: Sequence[int]) -> ModelGeometry:
    """Find the geometry by forward passes grown from ``start_shape`` (see module doc).

    The model's per-module train/eval modes are restored and nothing is recorded
    in BatchNorm statistics (eval mode, ``no_grad``).
    """
    start = tuple(int(s) for s in start_shape)
    tried: list[str] = []
    with evaluating(model):
        level, channels, why = None, None, ""
        for k in range(MAX_LEVEL + 1):
            shape = tuple(_size_at(s, k) for s in start)
            channels, why = _run(model, shape)
            tried.append(fmt(shape))
            if channels is not None:
                level = k
                break
        if level is None or channels is None:
            raise ModelShapeError(
                f"{type(_unwrapped(model)).__name__} did not return one channel map of the "
                f"input's size for any of the inputs {', '.join(tried)} (grown from "
                f"{fmt(start)}); last: {why}. It must take (N, 1, *spatial) and return "
                "(N, C, *spatial)."
            )
        multiple = []
        for axis in range(len(start)):
            own = level
            for k in range(level):  # the smallest level this axis alone accepts
                shape = tuple(
                    _size_at(s, k if a == axis else level) for a, s in enumerate(start)
                )
                if _run(model, shape)[0] is not None:
                    own = k
                    break
            multiple.append(2**own)
    return ModelGeometry(channels, tuple(multiple), "probe")

