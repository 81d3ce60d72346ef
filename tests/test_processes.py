"""The one 'is that writer still alive' test of the checkpoint writer and the labels swap."""

from __future__ import annotations

import os
import subprocess
import sys

from napari_finetune.processes import process_alive


def test_this_process_is_alive_and_a_finished_one_is_not():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid is free
    assert not process_alive(child.pid)
