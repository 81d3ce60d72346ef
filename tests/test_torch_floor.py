"""The torch floor declared in pyproject.toml has every torch API the code relies on.

Installing the lowest torch to run the suite is not possible here (PyPI serves
only multi-GB CUDA builds of old versions), so the APIs newer than old torch
are listed with the release that brought each; the floor must be at least the
newest of them, and each listed API must still be used where the table says
(so the table cannot outlive the code that needed it), and exist in the torch
installed (so a name in it is not a typo).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "napari_finetune"

# (API, the first torch release with it, the file that uses it, the text of the use)
NEWER_APIS = [
    ("torch.OutOfMemoryError", (2, 5), "trainer/oom.py", "(torch.OutOfMemoryError)"),
    ("torch.mps.recommended_max_memory", (2, 5), "trainer/memory_info.py",
     "torch.mps.recommended_max_memory()"),
    ("torch.is_autocast_enabled", (2, 4), "testing/faults.py",
     "torch.is_autocast_enabled(device)"),
    ("torch.amp.GradScaler", (2, 3), "trainer/precision.py", "torch.amp.GradScaler("),
    ("torch.cuda.memory._record_memory_history", (2, 1), "trainer/snapshot.py",
     "_record_memory_history(max_entries="),
    ("torch.load", (1, 13), "model/checkpoint_format.py", "weights_only=True"),
]


def declared_floor() -> tuple[int, int]:
    """The ``torch>=X.Y`` of pyproject.toml's dependencies (read as text: no tomllib on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    specs = re.findall(r'^\s*"(torch\b[^"]*)"', text, flags=re.MULTILINE)
    assert len(specs) == 1, f"one torch requirement expected: {specs}"
    match = re.fullmatch(r"torch>=(\d+)\.(\d+)(?:\.\d+)?", specs[0].replace(" ", ""))
    assert match, f"the torch requirement is not a plain floor: {specs[0]}"
    return int(match[1]), int(match[2])


def _resolve(name: str) -> object:
    value: object = torch
    for part in name.split(".")[1:]:
        value = getattr(value, part)
    return value


def test_the_floor_is_the_newest_api_the_code_uses():
    assert declared_floor() == max(version for _, version, _, _ in NEWER_APIS)


@pytest.mark.parametrize(("api", "since", "path", "use"), NEWER_APIS)
def test_each_api_of_the_table_is_used_and_real(api, since, path, use):
    assert declared_floor() >= since
    assert use in (SOURCE / path).read_text(), f"{path} no longer uses {api}: update the table"
    assert callable(_resolve(api))


def test_the_autocast_query_takes_a_device_type():
    """torch.is_autocast_enabled(device_type), the 2.4 form (older ones take no argument)."""
    assert torch.is_autocast_enabled("cpu") is False
