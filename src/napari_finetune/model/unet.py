"""A small 2D/3D UNet that remembers how it was built.

The constructor arguments are kept in ``init_kwargs`` so a checkpoint can
rebuild the exact architecture without pickling code. Every convolution that
carries spatial context is 3x3(x3) on purpose: PEFT merges LoRA on those, while
it cannot merge pointwise Conv3d (huggingface/peft #3768), so only the output head is
pointwise and it is left out of the LoRA targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from napari_finetune.voxel_size import pooling_factors

Norm = Literal["group", "batch", "instance", "none"]


def _conv(dims: int) -> type[nn.Module]:
    return nn.Conv3d if dims == 3 else nn.Conv2d


def _norm(kind: Norm, dims: int, channels: int) -> nn.Module:
    if kind == "group":
        groups = 4 if channels % 4 == 0 else 1
        return nn.GroupNorm(groups, channels)
    if kind == "batch":
        return (nn.BatchNorm3d if dims == 3 else nn.BatchNorm2d)(channels)
    if kind == "instance":
        return (nn.InstanceNorm3d if dims == 3 else nn.InstanceNorm2d)(channels, affine=True)
    return nn.Identity()


class ConvBlock(nn.Sequential):
    """Two 3x3 convolutions, each followed by normalisation and ReLU."""

    def __init__(self, dims: int, in_channels: int, out_channels: int, norm: Norm) -> None:
        conv = _conv(dims)
        super().__init__(
            conv(in_channels, out_channels, 3, padding=1),
            _norm(norm, dims, out_channels),
            nn.ReLU(inplace=True),
            conv(out_channels, out_channels, 3, padding=1),
            _norm(norm, dims, out_channels),
            nn.ReLU(inplace=True),
        )


class UNet(nn.Module):
    """UNet with max-pool down, nearest-upsample + 3x3 conv up, and skip concatenation.

    Parameters
    ----------
    dims : {2, 3}
        Spatial dimensions.
    in_channels, out_channels : int
        Input channels and output channels (one logit per named class).
    depth : int
        Number of 2x downsamplings; inputs must be divisible by ``2**depth``
        (see ``shape_multiple``), which blockwise prediction pads for.
    features : int
        Channels of the first level, doubled at every level.
    norm : {"group", "batch", "instance", "none"}
        Normalisation after each convolution.
    scale_factors : sequence of sequence of int, optional
        Per level, the pooling of each axis (1 or 2): ``[[1, 2, 2], [1, 2, 2],
        [2, 2, 2]]`` pools z only at the third level, for voxels 4-5 times
        coarser in z (:meth:`for_voxel_size`). None: 2 on every axis at every
        level (every checkpoint written before the option builds that way).
    added_channels : int
        How many of the last ``out_channels`` are channels added for a new
        structure with weights of their own (:mod:`napari_finetune.model.add_channel`):
        each is made by a one-channel UNet of this one's shape in ``added``, which
        reads the input only, so no other channel reads its weights; ``head`` makes
        the others. 0 (every checkpoint written before the option): ``head`` makes all.
    """

    def __init__(
        self,
        dims: int = 3,
        in_channels: int = 1,
        out_channels: int = 2,
        depth: int = 3,
        features: int = 16,
        norm: Norm = "group",
        scale_factors: Sequence[Sequence[int]] | None = None,
        added_channels: int = 0,
    ) -> None:
        super().__init__()
        if dims not in (2, 3):
            raise ValueError(f"dims must be 2 or 3, got {dims}.")
        if depth < 0 or features < 1 or in_channels < 1 or out_channels < 1:
            raise ValueError("depth must be >= 0; features and channel counts >= 1.")
        if not 0 <= added_channels < out_channels:
            raise ValueError(
                f"added_channels must be 0 to out_channels - 1 ({out_channels - 1}), "
                f"got {added_channels}."
            )
        self.init_kwargs: dict[str, Any] = {
            "dims": dims,
            "in_channels": in_channels,
            "out_channels": out_channels,
            "depth": depth,
            "features": features,
            "norm": norm,
        }
        self.dims = dims
        self.shape_multiple: int | tuple[int, ...] = 2**depth
        # Per level: the pooling kernel and the upsampling factor; None keeps the
        # isotropic modules of every earlier checkpoint (same module tree, same state dict).
        self.scale_factors: list[tuple[int, ...]] | None = None
        if scale_factors is not None:
            factors = [tuple(int(f) for f in level) for level in scale_factors]
            if len(factors) != depth or any(
                len(level) != dims or not set(level) <= {1, 2} for level in factors
            ):
                raise ValueError(
                    f"scale_factors must give {depth} levels of {dims} factors, each 1 or 2, "
                    f"got {scale_factors!r}."
                )
            self.init_kwargs["scale_factors"] = [list(level) for level in factors]
            self.scale_factors = factors
            self.shape_multiple = tuple(
                2 ** sum(level[axis] == 2 for level in factors) for axis in range(dims)
            )
        if added_channels:
            # Recorded only when used: an older checkpoint's record (and state dict) stays.
            self.init_kwargs["added_channels"] = added_channels
        widths = [features * 2**level for level in range(depth + 1)]
        pool = nn.MaxPool3d if dims == 3 else nn.MaxPool2d
        conv = _conv(dims)

        self.encoders = nn.ModuleList()
        channels = in_channels
        for width in widths:
            self.encoders.append(ConvBlock(dims, channels, width, norm))
            channels = width
        self.pool = pool(2)  # no parameters: the per-level kernels below need no state either
        self.level_pools = (
            None if self.scale_factors is None
            else nn.ModuleList(pool(level) for level in self.scale_factors)
        )
        self.up_convs = nn.ModuleList()
        self.decoders = nn.ModuleList()
        for width in reversed(widths[:-1]):
            self.up_convs.append(conv(channels, width, 3, padding=1))
            self.decoders.append(ConvBlock(dims, 2 * width, width, norm))
            channels = width
        self.head = conv(channels, out_channels - added_channels, 1)
        self.added = nn.ModuleList(
            UNet(dims, in_channels, 1, depth, features, norm, scale_factors)
            for _ in range(added_channels)
        )

    # TorchScript compiles a module's properties; this one is for Python callers only.
    __jit_unused_properties__ = ["head_channels"]

    @property
    def head_channels(self) -> int:
        """The channels ``head`` makes: all but the added channels with their own weights."""
        head = self.head
        assert isinstance(head, nn.Conv2d | nn.Conv3d)
        return int(head.out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return one logit per output channel and voxel, same spatial shape as ``x``."""
        image = x
        skips = []
        for level, encoder in enumerate(self.encoders):
            if level > 0:
                x = self.pool(x) if self.level_pools is None else self.level_pools[level - 1](x)
            x = encoder(x)
            skips.append(x)
        skips.pop()
        for level, (up_conv, decoder) in enumerate(zip(self.up_convs, self.decoders, strict=True)):
            if self.scale_factors is None:
                x = nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
            else:  # the decoder climbs the levels in reverse
                factor = self.scale_factors[len(self.scale_factors) - 1 - level]
                x = nn.functional.interpolate(
                    x, scale_factor=tuple(float(f) for f in factor), mode="nearest"
                )
            x = up_conv(x)
            x = decoder(torch.cat([skips.pop(), x], dim=1))
        # The head's channels are computed exactly as without added ones; the added
        # channels are appended after them. A loop, not a generator: TorchScript (the
        # bioimage.io export) compiles this.
        outs = [self.head(x)]
        for added in self.added:
            outs.append(added(image))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    @classmethod
    def for_voxel_size(
        cls, voxel_size: Sequence[float] | None, dims: int = 3, depth: int = 3, **kwargs: Any
    ) -> UNet:
        """A new UNet whose pooling suits ``voxel_size``: an axis coarser than the finest is
        not pooled until the others have caught up (``(40, 8, 8)``: (1, 2, 2), (1, 2, 2),
        then (2, 2, 2)). An isotropic or unknown voxel size builds the plain UNet.

        Parameters
        ----------
        voxel_size : sequence of float or None
            The training volume's voxel size, one per spatial axis (the last ``dims``
            are used).
        dims, depth : int
            As in :class:`UNet`.
        **kwargs
            The other :class:`UNet` arguments.
        """
        factors = pooling_factors(voxel_size, depth, dims)
        if all(f == 2 for level in factors for f in level):
            return cls(dims=dims, depth=depth, **kwargs)
        return cls(dims=dims, depth=depth, scale_factors=factors, **kwargs)
