"""Which device a job runs on: resolution, availability, cache, and a model's home.

One place for the questions the trainer, the predictor and the widget all ask,
so that "cuda on a machine without CUDA" gets the same one-line answer from
each of them instead of torch's own assertion deep inside ``.to()``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily: the CLI's --help must not load it
    import torch


class DeviceUnavailableError(ValueError):
    """A device was asked for that this machine (or this PyTorch build) lacks."""


_DEVICE_NAME = re.compile(r"^(auto|cpu|mps|cuda)(:\d+)?$")


def resolve_device(name: str = "auto") -> str:
    """The device to run on, checked to exist.

    Parameters
    ----------
    name : str
        ``"auto"`` (CUDA when available, then MPS, else the CPU), ``"cpu"``,
        ``"cuda"``, ``"cuda:N"`` or ``"mps"``.

    Raises
    ------
    DeviceUnavailableError
        The device is not there; the message names it, why, and what to use.
    """
    import torch

    if not _DEVICE_NAME.match(name) or name.startswith(("auto:", "cpu:", "mps:")):
        raise DeviceUnavailableError(
            f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps."
        )
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "has no CUDA support" if torch.version.cuda is None else "finds no CUDA GPU"
            raise DeviceUnavailableError(
                f"device {name!r} is not available: this PyTorch ({torch.__version__}) "
                f"{build}; use --device cpu (or auto), or install a CUDA build of PyTorch."
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        count = torch.cuda.device_count()
        if index >= count:
            raise DeviceUnavailableError(
                f"device {name!r} is not available: this machine has {count} CUDA "
                f"GPU(s), cuda:0 to cuda:{count - 1}."
            )
    if name == "mps" and not _mps_available():
        raise DeviceUnavailableError(
            "device 'mps' is not available: it needs an Apple-silicon Mac with a PyTorch "
            "built for it; use --device cpu (or auto)."
        )
    return name


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def empty_device_cache(device: torch.device | str) -> None:
    """Return cached blocks to the device so a retry sees the freed memory."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif kind == "mps" and _mps_available():
        torch.mps.empty_cache()
    elif kind == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.empty_cache()


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    import torch

    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


@contextmanager
def on_device(model: torch.nn.Module, device: torch.device | str) -> Iterator[None]:
    """Run the body with ``model`` on ``device``, and move it back home afterwards.

    Nothing moves when the model is already there (the common case: one move
    for a whole volume, not one per block).
    """
    import torch

    home = model_device(model)
    moved = torch.device(device) != home
    if moved:
        model.to(device)
    try:
        yield
    finally:
        if moved:
            model.to(home)


def model_in_channels(model: torch.nn.Module) -> int:
    """The input channels ``model`` takes: its recorded ``in_channels``, else its first
    convolution's; 1 when neither says (every earlier checkpoint took one)."""
    import torch

    kwargs = getattr(model, "init_kwargs", None)
    if isinstance(kwargs, dict) and isinstance(kwargs.get("in_channels"), int):
        return int(kwargs["in_channels"])
    for module in model.modules():
        if isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d | torch.nn.Conv3d):
            return int(module.in_channels)
    return 1


def check_input_channels(model: torch.nn.Module, channels: int, axes: str) -> None:
    """Refuse an image of ``channels`` channels (its ``axes``, e.g. "czyx") that are not
    the model's input channels, in one line. Counts, not the image type: this floor is
    beside the arrays', not above it."""
    wanted, got = model_in_channels(model), channels
    if wanted != got:
        fix = (
            "take one of its channels (AxesImage.channel, --channel on the command line)"
            if wanted == 1 else f"give it an image of {wanted} channels"
        )
        raise ValueError(
            f"the model takes {wanted} input channel{'s' * (wanted != 1)} but the image "
            f"(axes {axes.upper()}) has {got}; {fix}."
        )


def check_model_fits_image(model: torch.nn.Module, shape: tuple[int, ...]) -> None:
    """Refuse a 2D model on a 3D image (and the reverse) with one line.

    Models that do not say their ``dims`` are assumed to fit; their first
    forward pass then says what is wrong.
    """
    dims = getattr(model, "dims", None)
    if isinstance(dims, int) and dims != len(shape):
        image_axes = {2: "a 2D (YX)", 3: "a 3D (ZYX)"}.get(dims, f"a {dims}D")
        raise ValueError(
            f"the model is {dims}D but the image has shape {tuple(shape)}; use "
            f"{image_axes} image, or a {len(shape)}D model."
        )
