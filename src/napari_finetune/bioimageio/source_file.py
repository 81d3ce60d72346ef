"""Build a model from a bioimage.io package's own Python file, only when the user trusts it.

A package may define its architecture in a file it carries
(``ArchitectureFromFileDescr``). Importing that file runs the package author's
code, so it happens only when the user names it in ``trust``
(``"<file name>:<callable>"``, e.g. ``"unet.py:UNet"``), as for any factory off the
allow-list. The file's text is kept in the checkpoint's metadata
(``metadata["bioimageio"]["architecture_file"]``: ``name``, ``callable``, ``code``),
so a fine-tuned ``.pt`` of such a model loads again, under the same trust, and
exports back into a package with the file.

No ``bioimageio.spec`` here: a ``.pt`` needs none to load.
"""

from __future__ import annotations

import hashlib
import sys
import types
from typing import Any

from torch import nn

from napari_finetune.model.architectures import Trust, trusted_names
from napari_finetune.model.factory import CheckpointError, call_factory

# Where package files are imported: one module per file content.
MODULE_PREFIX = "napari_finetune_package_"


def trust_name(file_name: str, callable_name: str) -> str:
    """``"<file name>:<callable>"``: how the user trusts a package's source file."""
    return f"{file_name}:{callable_name}"


def untrusted_source(file_name: str, callable_name: str) -> CheckpointError:
    """The refusal of a package file the user has not trusted: how to trust it."""
    name = trust_name(file_name, callable_name)
    return CheckpointError(
        f"the model is built by {callable_name} from the bioimage.io package's "
        f"own file {file_name}, and importing that file runs its code; if you "
        f"trust the package, load it with --trust-factory {name} (Python: "
        f"load_checkpoint(path, trust=[{name!r}]))."
    )


def build_from_source(
    source: dict[str, Any], kwargs: dict[str, Any], trust: Trust = None
) -> nn.Module:
    """Call ``source["callable"]`` of the file ``source["code"]`` with ``kwargs``.

    Parameters
    ----------
    source : dict
        ``{"name": "unet.py", "callable": "UNet", "code": "<the file's text>"}``.
    kwargs : dict
        The constructor's keyword arguments.
    trust : str or collection of str, optional
        Must contain ``"<name>:<callable>"``, or nothing is run.

    Raises
    ------
    CheckpointError
        Not trusted (the message says how to trust it), the file fails to run,
        or it does not build a ``torch.nn.Module``.
    """
    name = trust_name(str(source["name"]), str(source["callable"]))
    if name not in trusted_names(trust):
        raise untrusted_source(str(source["name"]), str(source["callable"]))
    fn = getattr(_module_of(str(source["name"]), str(source["code"])), source["callable"], None)
    if not callable(fn):
        raise CheckpointError(
            f"the file {source['name']} defines no callable {source['callable']!r}."
        )
    return call_factory(fn, name, kwargs)


def _module_of(file_name: str, code: str) -> types.ModuleType:
    # Keyed by content, so two packages with a different model.py never share a module.
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    module_name = f"{MODULE_PREFIX}{digest}"
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    module = types.ModuleType(module_name)
    module.__file__ = file_name
    # Registered before running: dataclasses and pickling look the module up.
    sys.modules[module_name] = module
    try:
        exec(compile(code, file_name, "exec"), module.__dict__)  # noqa: S102 - the user trusts it
    except Exception as exc:  # the package's code: anything can go wrong
        del sys.modules[module_name]
        raise CheckpointError(
            f"the package's file {file_name} failed to run: {type(exc).__name__}: {exc}"
        ) from None
    return module


def saved_source(
    architecture: dict[str, Any], metadata: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The package file a checkpoint's factory names, when its metadata keeps it (else None)."""
    record = ((metadata or {}).get("bioimageio") or {}).get("architecture_file")
    if not isinstance(record, dict) or not {"name", "callable", "code"} <= set(record):
        return None
    if architecture.get("factory") != trust_name(str(record["name"]), str(record["callable"])):
        return None
    return record
