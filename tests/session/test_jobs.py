"""The jobs' own choices: what the engine's warm-up imports."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys

import pytest

from napari_finetune.session.jobs import warm_up_job


class _PeftAsked(importlib.abc.MetaPathFinder):
    """Records each attempt to import PEFT and refuses it (as a machine without it would)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "peft":
            self.asked.append(name)
            raise ImportError(f"{name} is not installed on this machine")
        return None


@pytest.mark.parametrize("lora", [False, True])
def test_the_warm_up_imports_peft_only_for_a_lora_run(lora, monkeypatch):
    """The default full fine-tune never needs PEFT (and transformers, which it imports):
    the dock's warm-up leaves it out; choosing LoRA warms it up, and a missing PEFT is
    no failure there (Fine-tune says what to install)."""
    finder = _PeftAsked()
    for name in [n for n in sys.modules if n.split(".")[0] == "peft"]:
        monkeypatch.delitem(sys.modules, name)  # put back after the test
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])

    assert list(warm_up_job(lora)) == []  # runs to its end, yielding nothing

    assert finder.asked == (["peft"] if lora else [])


WARM_UP_IN_A_FRESH_PROCESS = """
import sys
from napari_finetune.session.jobs import warm_up_job
list(warm_up_job(False))
loaded = sorted(n for n in sys.modules if n.split(".")[0] in ("peft", "transformers"))
print(" ".join(loaded) or "none")
"""


def test_a_full_fine_tune_warm_up_leaves_peft_out_in_a_fresh_process():
    """The test above clears only PEFT's own modules: one of ours that imported PEFT at
    its top, already loaded by earlier tests, would not import it again there. A fresh
    process sees every import the warm-up makes, direct or not."""
    out = subprocess.run(
        [sys.executable, "-c", WARM_UP_IN_A_FRESH_PROCESS], capture_output=True, text=True,
        timeout=300, check=True,
    ).stdout.strip().splitlines()[-1]
    assert out == "none"
