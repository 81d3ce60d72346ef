"""LoRA for the convolutions PEFT cannot merge: transposed and pointwise 3D ones.

PEFT 0.21.2 adapts ``Conv2d``/``Conv3d`` but merges a pointwise ``Conv3d``
wrongly (kernel 1x1x1 or (1, 1, k): "The size of tensor a (2) must match the
size of tensor b (4)", huggingface/peft #3768), and it has no LoRA for
``ConvTranspose2d``/``ConvTranspose3d``, so MONAI UNet's whole decoder and every
1x1x1 output head stayed frozen. :class:`ConvLora` adapts those layers itself:

    y = base(x) + scale * B(A(x))

``A`` is a convolution of the base layer's kind with ``rank`` output channels
and the base layer's kernel, stride, padding, dilation (and output padding);
``B`` a pointwise ``rank -> out`` convolution, zero at the start, so training
starts from the base model's output. Both are linear, so the merged weight is
the base weight plus ``scale * B @ A`` contracted over the rank. When the base
layer has a bias, ``B`` has one too (zero at the start, PEFT's ``lora_bias``):
an output head's bias sets each class's threshold, which a new microscope
shifts.

The layer takes part in PEFT's machinery: it is a PEFT ``BaseTunerLayer``, so
``disable_adapter()`` (the LoRA teacher) switches it off, and
``merge_and_unload()`` replaces it with its merged base layer
(``unload_and_optionally_merge_module``). This module imports PEFT (slow): it is
imported only when a model is wrapped.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torch.nn.modules.conv import _ConvNd

ADAPTER = "default"  # PEFT's name of the one adapter a run trains
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def needs_own_lora(module: nn.Module) -> bool:
    """Whether ``module`` is a convolution PEFT 0.21 cannot adapt and merge correctly.

    Transposed convolutions (no PEFT layer) and 3D convolutions whose first two
    kernel axes are 1 (PEFT treats them as a 2D 1x1 kernel when merging).
    """
    if isinstance(module, TRANSPOSED):
        return module.groups == 1
    return (
        isinstance(module, nn.Conv3d) and module.groups == 1 and module.kernel_size[:2] == (1, 1)
    )


class ConvLora(nn.Module, BaseTunerLayer):
    """LoRA around one convolution or transposed convolution (groups = 1).

    Parameters
    ----------
    base_layer : nn.Conv1d/2d/3d or nn.ConvTranspose1d/2d/3d
        Frozen here; its weight receives the update when merged.
    rank : int
    alpha : float
        The update is scaled by ``alpha / rank``, as PEFT does.
    bias : bool
        Give ``B`` a bias (zero at the start), merged into the base bias; only
        for a base layer that has one.
    """

    adapter_layer_names = ("lora_A", "lora_B")
    other_param_names = ("rank", "scaling")

    def __init__(
        self, base_layer: nn.Module, rank: int, alpha: float, bias: bool = False
    ) -> None:
        super().__init__()
        # _ConvNd: every convolution and transposed convolution (their weight, bias,
        # kernel and padding are typed there).
        if not isinstance(base_layer, _ConvNd) or not (
            needs_own_lora(base_layer) or isinstance(base_layer, (nn.Conv2d, nn.Conv3d))
        ):
            raise TypeError(f"ConvLora does not adapt {type(base_layer).__name__}")
        self.base_layer: _ConvNd = base_layer
        self.rank = int(rank)
        self.scaling = {ADAPTER: float(alpha) / self.rank}
        self._active_adapter = ADAPTER
        self._disable_adapters = False
        self.merged_adapters: list[str] = []
        self.transposed = isinstance(base_layer, TRANSPOSED)
        dims = base_layer.weight.ndim - 2
        # Keyword arguments of whichever convolution class the base layer is (Any: their
        # types differ per key and per class; the constructor checks them).
        geometry: dict[str, Any] = {
            "kernel_size": base_layer.kernel_size,
            "stride": base_layer.stride,
            "padding": base_layer.padding,
            "dilation": base_layer.dilation,
            "bias": False,
        }
        if self.transposed:
            geometry["output_padding"] = base_layer.output_padding
        down = type(base_layer)(base_layer.in_channels, self.rank, **geometry)
        if bias and base_layer.bias is None:
            raise ValueError("a LoRA bias needs a base layer with a bias, to merge into")
        up = _CONV[dims](self.rank, base_layer.out_channels, 1, bias=bias)
        # A as PEFT initialises it (Kaiming uniform), B zero: no change at the start.
        nn.init.kaiming_uniform_(down.weight, a=math.sqrt(5))
        nn.init.zeros_(up.weight)
        if up.bias is not None:
            nn.init.zeros_(up.bias)
        weight = base_layer.weight
        self.lora_A = nn.ModuleDict({ADAPTER: down.to(weight.device, weight.dtype)})
        self.lora_B = nn.ModuleDict({ADAPTER: up.to(weight.device, weight.dtype)})
        for param in base_layer.parameters():
            param.requires_grad_(False)

    def _convs(self, adapter: str) -> tuple[_ConvNd, _ConvNd]:
        """``A`` and ``B`` of ``adapter``."""
        # PEFT looks the adapters up in ModuleDicts, which type their items as Module;
        # these hold the two convolutions __init__ built.
        return cast(_ConvNd, self.lora_A[adapter]), cast(_ConvNd, self.lora_B[adapter])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Base output plus the scaled low-rank update (unless disabled or merged)."""
        out: torch.Tensor = self.base_layer(x)
        if self.disable_adapters or self.merged:
            return out
        down, up = self._convs(ADAPTER)
        update = up(down(x.to(down.weight.dtype)))
        return out + (update * self.scaling[ADAPTER]).to(out.dtype)

    def enable_adapters(self, enabled: bool) -> None:
        """Switch the update on or off (PEFT's ``disable_adapter()`` calls this)."""
        self._disable_adapters = not enabled
        for name in self.adapter_layer_names:
            getattr(self, name).requires_grad_(enabled)

    def get_delta_weight(self, adapter: str = ADAPTER) -> torch.Tensor:
        """The change of the base weight that equals the adapter's contribution."""
        down, up = self._convs(adapter)
        a = down.weight.float()  # conv (r, in, *k); transposed (in, r, *k)
        b = up.weight.float().flatten(1)  # (out, r)
        if self.transposed:
            delta = torch.einsum("ir...,or->io...", a, b)
        else:
            delta = torch.einsum("or,ri...->oi...", b, a)
        return delta * self.scaling[adapter]

    def get_delta_bias(self, adapter: str = ADAPTER) -> torch.Tensor | None:
        """The change of the base bias (None when ``B`` has no bias)."""
        bias = self._convs(adapter)[1].bias
        return None if bias is None else bias.float() * self.scaling[adapter]

    def _shift(self, sign: float) -> None:
        """Add (sign 1) or take out (sign -1) the update from the base weight and bias."""
        weight = self.base_layer.weight
        weight.data = weight.data + sign * self.get_delta_weight().to(weight.device, weight.dtype)
        delta_bias = self.get_delta_bias()
        bias = self.base_layer.bias
        if delta_bias is not None and bias is not None:
            bias.data = bias.data + sign * delta_bias.to(bias.device, bias.dtype)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """Add the update to the base weight (once)."""
        if self.merged:
            return
        if safe_merge and not torch.isfinite(self.get_delta_weight()).all():
            raise ValueError("NaNs detected in the merged weights of a LoRA layer")
        self._shift(1.0)
        self.merged_adapters.append(ADAPTER)

    def unmerge(self) -> None:
        """Take the update back out of the base weight."""
        if not self.merged:
            return
        self._shift(-1.0)
        self.merged_adapters.clear()

    def unload_and_optionally_merge_module(
        self, merge: bool, safe_merge: bool, adapter_names: list[str] | None
    ) -> nn.Module:
        """The base layer, merged first when ``merge`` (PEFT's ``merge_and_unload``)."""
        if merge:
            self.merge(safe_merge=safe_merge, adapter_names=adapter_names)
        for param in self.base_layer.parameters():
            param.requires_grad_(False)
        return self.base_layer


def replace_with_own_lora(
    model: nn.Module, names: list[str], rank: int, alpha: float, bias: bool = True
) -> None:
    """Wrap the named submodules of ``model`` in :class:`ConvLora`, in place.

    With ``bias``, every layer that has a bias gets a LoRA bias.
    """
    modules = dict(model.named_modules())
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        layer = modules[name]
        with_bias = bias and getattr(layer, "bias", None) is not None
        setattr(parent, child, ConvLora(layer, rank, alpha, bias=with_bias))
