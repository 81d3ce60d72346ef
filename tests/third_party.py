"""Third-party model libraries for the tests: MONAI as it is, torch-em behind a shim.

torch-em imports torchvision, and PyPI's torchvision 0.28.0 cannot load its
compiled ops beside the CPU build of torch 2.13.0 ("operator torchvision::nms
does not exist"). ``make install`` therefore puts that torchvision in a side
folder of the venv (``torch-em-deps``), which only these tests put on
``sys.path``: transformers (imported by PEFT) imports any torchvision it finds,
so one in site-packages would break LoRA in every other process. Before
torch-em is imported, the two op schemas torchvision's Python code registers
fake kernels for are defined here, when its compiled library cannot load; the
ops themselves are never called by the models tested.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

TORCH_EM_DEPS = Path(sys.prefix) / "torch-em-deps"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARIES: list[torch.library.Library] = []  # a dropped Library removes its definitions


def monai_nets() -> ModuleType:
    """``monai.networks.nets`` (a dev dependency: a broken install fails, not skips)."""
    from monai.networks import nets

    return nets


def _torchvision_ops_load() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    for library in Path(spec.origin).parent.glob("_C*.so"):
        try:
            torch.ops.load_library(str(library))
            return True
        except OSError:
            return False
    return False


def _define_missing_torchvision_ops() -> None:
    try:
        torch.ops.torchvision.nms  # noqa: B018 - defined already (a real torchvision)
        return
    except (AttributeError, RuntimeError):
        pass
    if _torchvision_ops_load():
        return
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARIES.append(library)


def torch_em_model() -> ModuleType:
    """``torch_em.model``, importable beside the CPU torch; skipped where torch-em is absent."""
    if importlib.util.find_spec("torch_em") is None:
        pytest.skip("torch-em is not installed (make install adds it without dependencies)")
    if TORCH_EM_DEPS.is_dir() and str(TORCH_EM_DEPS) not in sys.path:
        sys.path.append(str(TORCH_EM_DEPS))
    if "torch_em" not in sys.modules:
        _define_missing_torchvision_ops()
    import torch_em.model

    return torch_em.model
