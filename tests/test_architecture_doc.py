"""docs/architecture.md names every module of the package with its job.

The table "Where each job lives" lists each module by its path under
``src/napari_finetune`` (``model/factory.py``); a row may name more files of one
folder after the first (``model/checkpoint_format.py``, ``checkpoint.py``), and a
package is named by its folder (``predict/``). A module that is added, moved or
renamed without its line in the table fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "napari_finetune"
DOC = ROOT / "docs" / "architecture.md"


def documented() -> set[str]:
    """Paths the table's first column names, with a row's folder carried to bare names."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Where each job lives", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in re.findall(r"^\| (.+?) \|", table, flags=re.MULTILINE):
        folder = ""
        for token in re.findall(r"`([^`]+)`", row):
            if "/" in token:
                folder = token if token.endswith("/") else token.rsplit("/", 1)[0] + "/"
                names.add(token)
            else:
                names.add(folder + token)
    return names


def modules() -> set[str]:
    """Every module as the table writes it: ``a/b.py``, or ``a/`` for a package."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py":
            if relative.parent != Path("."):  # the package itself is the whole document
                found.add(relative.parent.as_posix() + "/")
        else:
            found.add(relative.as_posix())
    return found


def test_every_module_has_its_line_in_the_architecture_doc():
    missing = sorted(modules() - documented())
    assert not missing, f"docs/architecture.md has no line for: {', '.join(missing)}"


def test_the_doc_names_no_module_that_is_gone():
    files = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*") if p.is_file()}
    folders = {p.relative_to(PACKAGE).as_posix() + "/" for p in PACKAGE.rglob("*") if p.is_dir()}
    gone = sorted(documented() - files - folders)
    assert not gone, f"docs/architecture.md names what is not in the package: {', '.join(gone)}"
