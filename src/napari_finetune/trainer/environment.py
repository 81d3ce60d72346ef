"""Where a run ran: versions, the device and the host, for the record and the CLI header.

A checkpoint that behaves differently on another machine is explained first by
this: another torch, another GPU, less memory. The record keeps plain types
only (``weights_only`` loading), and nothing here may fail a run: a value that
cannot be read is None.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def run_environment(device: torch.device | str) -> dict[str, Any]:
    """Versions, device and host of this process, as plain types.

    Returns
    -------
    dict
        ``python``, ``torch``, ``napari_finetune`` (versions), ``host`` (the host
        name), ``platform`` and ``device``: ``{"type", "name", "capability",
        "total_memory_bytes"}`` (capability "8.0" on CUDA, None elsewhere).
    """
    import torch

    from napari_finetune import __version__

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "napari_finetune": __version__,
        "host": socket.gethostname() or platform.node() or None,
        "platform": platform.platform(terse=True),
        "device": device_description(torch.device(device)),
        "numeric": numeric_stack(),
    }


def numeric_stack() -> dict[str, Any]:
    """The libraries that compute the numbers: CUDA and cuDNN versions, TF32.

    The same model and weights can give other numbers under another cuDNN
    (its bf16/fp16 conv3d kernels have been wrong in some versions) or with
    TF32 matmuls and convolutions (10 bits of mantissa instead of 23).

    Returns
    -------
    dict
        ``torch``; ``cuda`` (``torch.version.cuda``, None on a CPU build);
        ``cudnn`` (``torch.backends.cudnn.version()``, e.g. 91002 for 9.10.2,
        None when torch has no cuDNN); ``tf32_matmul`` and ``tf32_cudnn``
        (``torch.backends.cuda.matmul.allow_tf32``,
        ``torch.backends.cudnn.allow_tf32``); ``float32_matmul_precision``
        (``torch.get_float32_matmul_precision()``: "highest", "high" or
        "medium", the other switch of TF32 matmuls). A value that cannot be
        read is None.
    """
    import torch

    stack: dict[str, Any] = {
        "torch": str(torch.__version__),
        "cuda": None,
        "cudnn": None,
        "tf32_matmul": None,
        "tf32_cudnn": None,
        "float32_matmul_precision": None,
    }
    try:
        stack["cuda"] = torch.version.cuda
        stack["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        stack["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
        stack["float32_matmul_precision"] = str(torch.get_float32_matmul_precision())
        # version() is None on a build without cuDNN, and loads the library
        # (no GPU needed) where there is one.
        if torch.backends.cudnn.is_available():
            version = torch.backends.cudnn.version()
            stack["cudnn"] = None if version is None else int(version)
    except (RuntimeError, AttributeError, OSError):
        pass  # a stack that cannot say: the record keeps None, the run goes on
    return stack


def device_description(device: torch.device) -> dict[str, Any]:
    """Name, compute capability and total memory of ``device``."""
    import torch

    info: dict[str, Any] = {
        "type": device.type,
        "name": None,
        "capability": None,
        "total_memory_bytes": None,
    }
    try:
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            info["name"] = props.name
            info["capability"] = f"{props.major}.{props.minor}"
            info["total_memory_bytes"] = int(props.total_memory)
        elif device.type == "mps":
            info["name"] = f"Apple {platform.machine()} GPU (MPS)"
            info["total_memory_bytes"] = int(torch.mps.recommended_max_memory())
        else:
            info["name"] = _cpu_name()
            info["total_memory_bytes"] = _physical_memory()
    except (RuntimeError, AttributeError, OSError, ValueError):
        pass  # a device that cannot say: the record keeps None, the run goes on
    if device.type == "cpu":
        info["cores"] = os.cpu_count()
    return info


def describe_environment(env: dict[str, Any]) -> str:
    """One line: ``napari-finetune 0.1.0, python 3.12.3, torch 2.13.0, cuda:0 NVIDIA H200
    (capability 9.0, 139.8 GiB), host gpu-01``."""
    dev = env.get("device") or {}
    details = []
    if dev.get("capability"):
        details.append(f"capability {dev['capability']}")
    if dev.get("cores"):
        details.append(f"{dev['cores']} cores")
    if dev.get("total_memory_bytes"):
        details.append(f"{dev['total_memory_bytes'] / 2**30:.1f} GiB")
    device = f"{dev.get('type', '?')} {dev.get('name') or ''}".strip()
    if details:
        device += f" ({', '.join(details)})"
    return (
        f"napari-finetune {env.get('napari_finetune')}, python {env.get('python')}, "
        f"torch {env.get('torch')}, device {device}, host {env.get('host')}"
    )


def _cpu_name() -> str | None:
    # platform.processor() is empty or just "x86_64" on most Linux systems.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _physical_memory() -> int | None:
    if sys.platform.startswith("win"):
        return None
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
