"""The panel imports no job body: the jobs are the Session's, the widgets only bind.

Read from the source (an import under ``if TYPE_CHECKING:`` is a type, not code that
runs), so a widget module that starts importing ``session.jobs`` to run a job itself
beside the Session's runner fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import napari_finetune._qt

# The job bodies: what a widget has the Session run, never runs itself. (The Qt runner
# takes ``session.work``'s Job and guard to run the Session's jobs in napari's workers:
# how a job runs, not a job.)
JOB_MODULES = ("napari_finetune.session.jobs",)


def _runtime_imports(path: Path) -> set[str]:
    """Modules ``path`` imports when it runs (its TYPE_CHECKING blocks left out)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_widget_module_imports_a_job_body():
    folder = Path(napari_finetune._qt.__file__).parent
    offenders = {path.name: sorted(_runtime_imports(path) & set(JOB_MODULES))
                 for path in sorted(folder.glob("*.py"))}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_reading_sees_an_import_that_runs(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nfrom napari_finetune.session import "
                      "jobs\nif TYPE_CHECKING:\n    import napari_finetune.session.work\n")
    assert "napari_finetune.session.jobs" in _runtime_imports(source)
    assert "napari_finetune.session.work" not in _runtime_imports(source)
