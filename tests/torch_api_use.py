"""Every torch API the package's code names, found in its source (for the floor test)."""

from __future__ import annotations

import ast
from pathlib import Path


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """``torch.cuda.mem_get_info`` for an attribute chain rooted at torch or an alias of it."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to torch or a part of it: ``import torch.distributed as dist``,
    ``from torch import nn``, ``from torch.utils.data import Dataset``."""
    names = {"torch": "torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else "torch"
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "torch":
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def torch_apis_used(source: Path) -> tuple[dict[str, str], set[str]]:
    """The torch names the code under ``source`` uses, and those it asks for first.

    Returns ``({API: first file using it}, guarded)``: only the longest names are
    kept (``torch.cuda.mem_get_info``, not ``torch.cuda`` too); ``guarded`` holds
    the names only ever asked with ``getattr(torch.x, "name", ...)`` or ``hasattr``
    (the code runs without them), which also count as used.
    """
    found: dict[str, str] = {}
    asked: set[str] = set()
    direct: set[str] = set()
    for path in sorted(source.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = _aliases(tree)
        where = path.relative_to(source).as_posix()
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = _dotted(node, aliases)
                if name is not None:
                    direct.add(name)
            elif isinstance(node, ast.Name) and node.id in aliases and node.id != "torch":
                name = aliases[node.id]
            elif (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            ):
                base = _dotted(node.args[0], aliases) if isinstance(
                    node.args[0], ast.Attribute) else aliases.get(getattr(node.args[0], "id", ""))
                if base is not None:
                    name = f"{base}.{node.args[1].value}"
                    asked.add(name)
            if name is not None:
                found.setdefault(name, where)
    used = {
        name: where for name, where in found.items()
        if not any(other.startswith(name + ".") for other in found)
    }
    return used, {name for name in asked if name in used and name not in direct}
