"""Everything outside _qt/ runs with no Qt: the engine, the CLI and the tests depend on it."""

import pkgutil
import subprocess
import sys

import napari_finetune

QT_MODULES = ("qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6", "magicgui", "superqt", "napari.qt")


def _modules_outside_qt() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(napari_finetune.__path__, "napari_finetune."):
        # __main__ modules run the CLI when imported; their imports are the CLI's.
        if "._qt" not in info.name and not info.name.endswith(".__main__"):
            names.append(info.name)
    return names


def test_no_module_outside_qt_pulls_in_qt():
    modules = _modules_outside_qt()
    assert "napari_finetune.config" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"leaked = [m for m in sys.modules if m.split('.')[0] in {QT_MODULES!r}"
        f" or m.startswith('napari.qt')]\n"
        "print(','.join(sorted(leaked)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"Qt imported outside _qt/: {result.stdout}"


def test_package_import_is_cheap():
    code = "import sys, napari_finetune; print('torch' in sys.modules, 'peft' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"]
