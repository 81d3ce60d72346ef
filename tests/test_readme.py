"""The README's Python runs as written (so it cannot drift from the API)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_readme_python_runs_as_written(tmp_path):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "the README has no python block"
    # One thread: the shared test machine; the cache: nothing written outside tmp_path.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NAPARI_FINETUNE_CACHE": str(tmp_path)}
    for i, code in enumerate(blocks):
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=280,
        )
        assert result.returncode == 0, f"README python block {i + 1}:\n{result.stderr[-3000:]}"
    # The block fine-tunes and exports, as it says.
    assert (tmp_path / "finetuned.pt").is_file()
    assert "finished" in result.stdout
