"""The torch floor declared in pyproject.toml has every torch API the code calls.

Installing the lowest torch to run the suite is not possible here (PyPI serves
only multi-GB CUDA builds of old versions). So the APIs the code calls are read
from its source (:mod:`torch_api_use`: every ``torch.…`` name, through aliases
and ``getattr``), and each must be in :data:`RELEASES` with the torch release
that brought it. A new call fails here until someone says when it came; the
floor must be the newest release among the calls that are not guarded (asked for
with ``getattr``/``hasattr`` first, the code running without them); every name
of the table must still be called (the table cannot outlive the code) and exist
in the torch installed (a name in it is not a typo).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from torch_api_use import torch_apis_used

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "napari_finetune"

# Torch 2.0 or older: the project never supported anything before it.
OLD = (2, 0)

# Every torch API the package calls, with the first release that has it (in the
# form the code uses: is_autocast_enabled(device_type) is 2.4's, load(weights_only=)
# 1.13's, _record_memory_history(max_entries=) 2.1's).
RELEASES: dict[str, tuple[int, int]] = {
    "torch.OutOfMemoryError": (2, 5),
    "torch.mps.recommended_max_memory": (2, 5),
    "torch.is_autocast_enabled": (2, 4),
    "torch.xpu.empty_cache": (2, 4),
    "torch.amp.GradScaler": (2, 3),
    "torch.utils._pytree.tree_leaves": (2, 2),
    "torch.cuda.memory._dump_snapshot": (2, 1),
    "torch.cuda.memory._record_memory_history": (2, 1),
    "torch.cuda.get_per_process_memory_fraction": (2, 7),
    **dict.fromkeys([
        "torch.Generator", "torch.Tensor.__bool__", "torch.Tensor.__float__",
        "torch.Tensor.__index__", "torch.Tensor.__int__", "torch.Tensor.cpu",
        "torch.Tensor.item", "torch.Tensor.numpy", "torch.Tensor.pin_memory", "torch.Tensor.to",
        "torch.Tensor.tolist", "torch.__version__.split", "torch._foreach_norm", "torch.arange",
        "torch.autocast", "torch.backends.cuda.matmul.allow_tf32",
        "torch.backends.cudnn.allow_tf32", "torch.backends.cudnn.is_available",
        "torch.backends.cudnn.version", "torch.backends.mps.is_available", "torch.bfloat16",
        "torch.bincount",
        "torch.bool", "torch.cat", "torch.count_nonzero", "torch.cuda.Event",
        "torch.cuda.OutOfMemoryError", "torch.cuda.Stream", "torch.cuda.current_device",
        "torch.cuda.current_stream", "torch.cuda.device", "torch.cuda.device_count",
        "torch.cuda.empty_cache", "torch.cuda.get_device_capability",
        "torch.cuda.get_device_properties", "torch.cuda.get_rng_state_all",
        "torch.cuda.is_available", "torch.cuda.is_initialized", "torch.cuda.max_memory_allocated",
        "torch.cuda.mem_get_info", "torch.cuda.memory_allocated", "torch.cuda.memory_reserved",
        "torch.cuda.reset_peak_memory_stats", "torch.cuda.set_device",
        "torch.cuda.set_rng_state_all", "torch.cuda.synchronize", "torch.device",
        "torch.distributed.ReduceOp.MIN", "torch.distributed.ReduceOp.RedOpType",
        "torch.distributed.ReduceOp.SUM", "torch.distributed.all_reduce",
        "torch.distributed.broadcast", "torch.distributed.destroy_process_group",
        "torch.distributed.get_backend", "torch.distributed.get_rank",
        "torch.distributed.get_world_size", "torch.distributed.init_process_group",
        "torch.distributed.is_initialized", "torch.dot", "torch.dtype", "torch.einsum",
        "torch.empty", "torch.float16", "torch.float32", "torch.float64", "torch.from_numpy",
        "torch.get_float32_matmul_precision", "torch.get_num_threads", "torch.get_rng_state",
        "torch.int64", "torch.is_grad_enabled", "torch.is_tensor", "torch.isfinite",
        "torch.jit.ScriptModule", "torch.jit.script", "torch.jit.trace",
        "torch.linalg.vector_norm", "torch.load", "torch.manual_seed",
        "torch.mps.current_allocated_memory", "torch.mps.driver_allocated_memory",
        "torch.mps.empty_cache", "torch.mps.synchronize", "torch.nn.BatchNorm1d",
        "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d", "torch.nn.Conv1d", "torch.nn.Conv2d",
        "torch.nn.Conv3d", "torch.nn.ConvTranspose1d", "torch.nn.ConvTranspose2d",
        "torch.nn.ConvTranspose3d", "torch.nn.GroupNorm", "torch.nn.Identity",
        "torch.nn.InstanceNorm1d", "torch.nn.InstanceNorm2d", "torch.nn.InstanceNorm3d",
        "torch.nn.LayerNorm", "torch.nn.MaxPool2d", "torch.nn.MaxPool3d", "torch.nn.Module",
        "torch.nn.ModuleDict", "torch.nn.ModuleList", "torch.nn.Parameter", "torch.nn.ReLU",
        "torch.nn.Sequential", "torch.nn.SyncBatchNorm",
        "torch.nn.functional.binary_cross_entropy_with_logits",
        "torch.nn.functional.interpolate", "torch.nn.init.kaiming_uniform_",
        "torch.nn.init.zeros_", "torch.nn.modules.batchnorm._BatchNorm",
        "torch.nn.modules.conv._ConvNd", "torch.nn.utils.clip_grad_norm_", "torch.no_grad",
        "torch.optim.AdamW", "torch.optim.LBFGS", "torch.optim.Optimizer", "torch.enable_grad",
        "torch.randperm", "torch.overrides.TorchFunctionMode", "torch.conv2d", "torch.conv3d",
        "torch.strided", "torch.backends.mkldnn.enabled", "torch.backends.mkldnn.is_available",
        "torch.ops.aten.mkldnn_convolution",
        "torch.randn", "torch.random.fork_rng", "torch.save", "torch.set_num_threads",
        "torch.set_rng_state", "torch.sigmoid", "torch.stack", "torch.tensor", "torch.uint8",
        "torch.utils._python_dispatch.TorchDispatchMode", "torch.utils.weak.WeakIdKeyDictionary",
        "torch.version.cuda", "torch.version.hip", "torch.where", "torch.zeros",
        "torch.zeros_like",
    ], OLD),
}


def declared_floor() -> tuple[int, int]:
    """The ``torch>=X.Y`` of pyproject.toml's dependencies (read as text: no tomllib on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    specs = re.findall(r'^\s*"(torch\b[^"]*)"', text, flags=re.MULTILINE)
    assert len(specs) == 1, f"one torch requirement expected: {specs}"
    match = re.fullmatch(r"torch>=(\d+)\.(\d+)(?:\.\d+)?", specs[0].replace(" ", ""))
    assert match, f"the torch requirement is not a plain floor: {specs[0]}"
    return int(match[1]), int(match[2])


USED, GUARDED = torch_apis_used(SOURCE)


def _resolve(name: str) -> object:
    value: object = torch
    for part in name.split(".")[1:]:
        value = getattr(value, part)
    return value


def test_every_torch_api_the_code_calls_has_its_release_in_the_table():
    unknown = {name: where for name, where in USED.items() if name not in RELEASES}
    assert not unknown, (
        f"new torch APIs in the code: {unknown}; add each to RELEASES with the torch "
        "release that brought it (and raise the floor in pyproject.toml if it is newer)"
    )


def test_the_table_lists_only_what_the_code_calls():
    stale = sorted(set(RELEASES) - set(USED))
    assert not stale, f"no longer called by the code, remove from RELEASES: {stale}"


def test_the_floor_is_the_newest_release_of_an_unguarded_call():
    needed = {name: RELEASES[name] for name in USED if name in RELEASES and name not in GUARDED}
    newest = max(needed.values())
    assert declared_floor() == newest, (
        f"the floor is {declared_floor()}; the newest unguarded call needs {newest}: "
        f"{sorted(n for n, v in needed.items() if v == newest)}"
    )


@pytest.mark.parametrize("api", sorted(RELEASES))
def test_each_api_of_the_table_exists_in_the_torch_installed(api):
    _resolve(api)


def test_a_call_newer_than_the_floor_without_a_guard_fails_the_floor(tmp_path):
    """The check above can fail: a module calling get_per_process_memory_fraction (2.7)
    directly, not through getattr, needs a floor of 2.7."""
    (tmp_path / "m.py").write_text(
        "import torch\nfrom torch import cuda as c\n"
        "c.get_per_process_memory_fraction(0)\ngetattr(torch.xpu, 'empty_cache', None)\n"
        "getattr(torch, 'OutOfMemoryError', None)\ntorch.OutOfMemoryError\n"
    )
    used, guarded = torch_apis_used(tmp_path)
    assert set(used) == {"torch.cuda.get_per_process_memory_fraction", "torch.xpu.empty_cache",
                         "torch.OutOfMemoryError"}
    assert guarded == {"torch.xpu.empty_cache"}  # the other two are also called directly


def test_the_autocast_query_takes_a_device_type():
    """torch.is_autocast_enabled(device_type), the 2.4 form (older ones take no argument)."""
    assert torch.is_autocast_enabled("cpu") is False
