"""Architecture adapters: what napari-finetune knows about model libraries' classes.

An adapter names the factories it covers (``"module:qualname"``, as a checkpoint
records them), the classes or functions their constructor arguments may name
(torch-em's ``conv_block_impl=ConvBlock3d``), and, from the constructor
arguments, the spatial multiple and the output channels. For a model built
without a record of its arguments (``monai.networks.nets.UNet(...)`` made by the
user) it can also recover them from the built model; the recovered arguments
are checked by rebuilding the model and comparing the two structures.

Adapters for MONAI (``UNet``, ``BasicUNet``) and torch-em (``UNet2d``,
``UNet3d``, ``AnisotropicUNet``) are built in; nothing here imports those
libraries. Other packages register theirs in the entry-point group
``napari_finetune.adapters`` (``name = "package.module:ADAPTER"``, an
:class:`ArchitectureAdapter`), which also puts their names on the allow-list of
:mod:`~napari_finetune.model.architectures`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import SupportsInt

import torch
from torch import nn

ADAPTER_GROUP = "napari_finetune.adapters"

Kwargs = dict[str, object]


@dataclass(frozen=True)
class ArchitectureAdapter:
    """What napari-finetune needs to know about one family of model classes.

    Attributes
    ----------
    name : str
        For messages and the geometry's source ("MONAI UNet").
    factories : tuple of str
        ``"module:qualname"`` names of the classes (public and defining module).
    spatial_multiple : callable
        ``(kwargs, ndim) -> int or tuple of int``: the divisor input sizes need.
    out_channels : callable
        ``kwargs -> int``.
    argument_callables : tuple of str
        Classes or functions the constructor arguments may name; they are on the
        allow-list, so a checkpoint that names them rebuilds.
    kwargs_of : callable, optional
        ``model -> kwargs`` for a model that does not record its arguments.
    """

    name: str
    factories: tuple[str, ...]
    spatial_multiple: Callable[[Kwargs, int], int | Sequence[int]]
    out_channels: Callable[[Kwargs], int]
    argument_callables: tuple[str, ...] = ()
    kwargs_of: Callable[[nn.Module], Kwargs] | None = field(default=None)


def _int(value: object) -> int:
    """A constructor argument read back as an int (Python or numpy number, or a digit string)."""
    if not isinstance(value, (SupportsInt, str)):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def _strides_product(strides: object, ndim: int) -> tuple[int, ...]:
    """Per-axis product of MONAI UNet ``strides`` (each an int or one per axis)."""
    per_axis = [1] * ndim
    for stride in strides if isinstance(strides, (list, tuple)) else [strides]:
        values = list(stride) if isinstance(stride, (list, tuple)) else [stride] * ndim
        per_axis = [p * _int(v) for p, v in zip(per_axis, values[-ndim:], strict=True)]
    return tuple(per_axis)


def _monai_unet_kwargs(model: nn.Module) -> Kwargs:
    # MONAI's UNet keeps every constructor argument as an attribute.
    names = ("in_channels", "out_channels", "channels", "strides", "kernel_size",
             "up_kernel_size", "num_res_units", "act", "norm", "dropout", "bias",
             "adn_ordering")
    kwargs: Kwargs = {"spatial_dims": model.dimensions}
    kwargs.update({name: getattr(model, name) for name in names})
    return kwargs


def _monai_basic_unet_kwargs(model: nn.Module) -> Kwargs:
    # BasicUNet keeps nothing: read the sizes off its layers; the rest are the
    # defaults, which the rebuild check confirms.
    def convs(name: str) -> list[nn.Conv1d | nn.Conv2d | nn.Conv3d]:
        block = model.get_submodule(name)
        return [m for m in block.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Conv1d))]

    blocks = ["conv_0", "down_1", "down_2", "down_3", "down_4", "upcat_1"]
    features = [convs(b)[-1].out_channels for b in blocks]
    first = convs("conv_0")[0]
    return {
        "spatial_dims": first.weight.ndim - 2,
        "in_channels": first.in_channels,
        "out_channels": convs("final_conv")[-1].out_channels,
        "features": tuple(features),
        "bias": first.bias is not None,
    }


def _torch_em_multiple(kwargs: Kwargs, ndim: int) -> tuple[int, ...]:
    scale_factors = kwargs.get("scale_factors")
    if scale_factors is None:
        return (2 ** _int(kwargs.get("depth", 4)),) * ndim
    per_axis = [1] * ndim
    factors = scale_factors if isinstance(scale_factors, (list, tuple)) else [scale_factors]
    for factor in factors:
        values = list(factor) if isinstance(factor, (list, tuple)) else [factor] * ndim
        per_axis = [p * _int(v) for p, v in zip(per_axis, values[-ndim:], strict=True)]
    return tuple(per_axis)


_TORCH_EM_CALLABLES = tuple(
    f"torch_em.model.unet:{name}"
    for name in ("ConvBlock2d", "ConvBlock3d", "Upsampler2d", "Upsampler3d")
) + ("torch.nn.modules.pooling:MaxPool2d", "torch.nn.modules.pooling:MaxPool3d")


def _names(module: str, public: str, *classes: str) -> tuple[str, ...]:
    return tuple(f"{where}:{cls}" for cls in classes for where in (public, module))


BUILTIN_ADAPTERS: tuple[ArchitectureAdapter, ...] = (
    ArchitectureAdapter(
        name="MONAI UNet",
        factories=_names("monai.networks.nets.unet", "monai.networks.nets", "UNet", "Unet"),
        spatial_multiple=lambda kw, ndim: _strides_product(kw.get("strides", ()), ndim),
        out_channels=lambda kw: _int(kw["out_channels"]),
        kwargs_of=_monai_unet_kwargs,
    ),
    ArchitectureAdapter(
        name="MONAI BasicUNet",
        factories=_names(
            "monai.networks.nets.basic_unet", "monai.networks.nets", "BasicUNet", "BasicUnet"
        ),
        spatial_multiple=lambda kw, ndim: 16,  # four 2x max-poolings
        out_channels=lambda kw: _int(kw.get("out_channels", 2)),
        kwargs_of=_monai_basic_unet_kwargs,
    ),
    ArchitectureAdapter(
        name="torch-em UNet",
        factories=_names(
            "torch_em.model.unet", "torch_em.model", "UNet2d", "UNet3d", "AnisotropicUNet"
        ),
        spatial_multiple=_torch_em_multiple,
        out_channels=lambda kw: _int(kw["out_channels"]),
        argument_callables=_TORCH_EM_CALLABLES,
    ),
)


@functools.cache
def registered_adapters() -> tuple[ArchitectureAdapter, ...]:
    """Adapters installed packages registered in the ``napari_finetune.adapters`` group."""
    found = []
    for entry in metadata.entry_points(group=ADAPTER_GROUP):
        adapter = entry.load()
        if isinstance(adapter, ArchitectureAdapter):
            found.append(adapter)
    return tuple(found)


def all_adapters() -> tuple[ArchitectureAdapter, ...]:
    """Built-in adapters first, then the registered ones."""
    return BUILTIN_ADAPTERS + registered_adapters()


def factory_of(model: nn.Module) -> str:
    """The factory name a model is rebuilt with (``model.factory`` or its class)."""
    cls = type(model)
    return str(getattr(model, "factory", None) or f"{cls.__module__}:{cls.__qualname__}")


def adapter_for(model: nn.Module) -> ArchitectureAdapter | None:
    """The adapter covering ``model``'s class (or recorded factory), if any."""
    cls = type(model)
    names = {factory_of(model), f"{cls.__module__}:{cls.__qualname__}"}
    return next((a for a in all_adapters() if names & set(a.factories)), None)


def constructor_kwargs(
    model: nn.Module, adapter: ArchitectureAdapter | None = None
) -> Kwargs | None:
    """``init_kwargs`` of ``model``, or the arguments its adapter recovers (None if neither).

    Recovered arguments count only when rebuilding the model from them gives
    the same structure (module tree and parameter shapes).
    """
    recorded = getattr(model, "init_kwargs", None)
    if isinstance(recorded, dict):
        return dict(recorded)
    adapter = adapter or adapter_for(model)
    if adapter is None or adapter.kwargs_of is None:
        return None
    try:
        kwargs = adapter.kwargs_of(model)
        with torch.random.fork_rng(devices=[]):  # the rebuild's weight init draws numbers
            rebuilt = type(model)(**kwargs)
    except (AttributeError, TypeError, ValueError, IndexError):
        return None
    if repr(rebuilt) != repr(model) or _shapes(rebuilt) != _shapes(model):
        return None
    return kwargs


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def allowed_names() -> frozenset[str]:
    """Factories and argument callables every adapter puts on the allow-list."""
    names: set[str] = set()
    for adapter in all_adapters():
        names.update(adapter.factories)
        names.update(adapter.argument_callables)
    return frozenset(names)

