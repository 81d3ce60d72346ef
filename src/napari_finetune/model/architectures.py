"""Which model factories a checkpoint may name: the allow-list.

A checkpoint's ``architecture.factory`` is plain data (``"module:callable"``),
so ``torch.load(..., weights_only=True)`` lets any value through; importing
and calling it would let a file run code (``subprocess:run`` with
``{"args": [...]}``). A factory is therefore resolved only when it is

1. napari-finetune's own UNet;
2. a model of a well-known library that an adapter knows (MONAI ``UNet`` /
   ``BasicUNet``, torch-em ``UNet2d`` / ``UNet3d`` / ``AnisotropicUNet``);
3. registered by an installed package in the entry-point group
   ``napari_finetune.architectures`` (``name = "package.module:callable"``);
   the user installed that package, and it declared the callable a model;
   or named by an architecture adapter (:mod:`~napari_finetune.model.adapters`:
   its factories and the classes its constructor arguments may name, such as
   torch-em's ``conv_block_impl``), built in or registered in the group
   ``napari_finetune.adapters``;
4. trusted explicitly by the user: ``load_checkpoint(path, trust=[...])`` or
   ``--trust-factory package.module:callable`` on the command line.

The check happens on the string, before anything is imported: naming a module
is not enough to get it imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterable
from importlib import metadata
from types import FunctionType

ENTRY_POINT_GROUP = "napari_finetune.architectures"

# Both the public re-export and the defining module, because a model saved
# through ``type(model)`` records the latter (``monai.networks.nets.unet:UNet``).
BUILTIN_FACTORIES: frozenset[str] = frozenset(
    {
        "napari_finetune.model.unet:UNet",
        "monai.networks.nets:UNet",
        "monai.networks.nets:Unet",
        "monai.networks.nets.unet:UNet",
        "monai.networks.nets:BasicUNet",
        "monai.networks.nets:BasicUnet",
        "monai.networks.nets.basic_unet:BasicUNet",
        "torch_em.model:UNet2d",
        "torch_em.model:UNet3d",
        "torch_em.model:AnisotropicUNet",
        "torch_em.model.unet:UNet2d",
        "torch_em.model.unet:UNet3d",
        "torch_em.model.unet:AnisotropicUNet",
    }
)

Trust = Collection[str] | str | None


class FactoryNotAllowed(ValueError):
    """A factory that is on no allow-list and not trusted by the user."""


def trusted_names(trust: Trust) -> frozenset[str]:
    """``trust`` as a set of ``"module:callable"`` strings (one string or many)."""
    if trust is None:
        return frozenset()
    if isinstance(trust, str):
        return frozenset({trust.strip()})
    return frozenset(str(name).strip() for name in trust)


def registered_factories() -> dict[str, str]:
    """``{"module:callable": entry-point name}`` of the entry-point group."""
    found = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found[entry.value.replace(" ", "")] = entry.name
    return found


def is_allowed(factory: str, trust: Trust = None) -> bool:
    """Whether ``factory`` may be imported and called (nothing is imported here).

    Parameters
    ----------
    factory : str
        ``"package.module:callable"``.
    trust : str or collection of str, optional
        Factories the user trusts explicitly, by their exact name.
    """
    factory = str(factory).strip()
    return (
        factory in BUILTIN_FACTORIES
        or factory in trusted_names(trust)
        or factory in registered_factories()
        or factory in _adapter_names()
    )


def _adapter_names() -> frozenset[str]:
    # Factories and argument callables (torch-em's ConvBlock3d) that adapters name;
    # lazily, because registered adapters are loaded from their entry points.
    from napari_finetune.model.adapters import allowed_names as adapter_names

    return adapter_names()


def not_allowed_message(factory: str) -> str:
    """One line naming the factory and how to trust it."""
    return (
        f"the checkpoint asks to build its model with {factory!r}, which is not an "
        "architecture napari-finetune knows (its own UNet, MONAI UNet/BasicUNet, torch-em "
        f"UNets, or one registered in the {ENTRY_POINT_GROUP!r} entry-point group); "
        "calling it could run any code. If you trust the file and that package, load it "
        f"with --trust-factory {factory} (Python: load_checkpoint(path, "
        f"trust=[{factory!r}]))."
    )


def resolve_factory(factory: str, trust: Trust = None) -> Callable[..., object]:
    """Import the callable named ``"module:qualname"``, if the allow-list permits it.

    Raises
    ------
    FactoryNotAllowed
        When ``factory`` is on no allow-list and not in ``trust``.
    ImportError, AttributeError
        When it is allowed but cannot be imported (the package is missing).
    """
    factory = str(factory).strip()
    if not is_allowed(factory, trust):
        raise FactoryNotAllowed(not_allowed_message(factory))
    module_name, sep, qualname = factory.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"{factory!r} is not of the form 'package.module:callable'")
    target: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{factory!r} is not callable")
    return target


def factory_name(obj: type | FunctionType) -> str:
    """``"module:qualname"`` of a class or function (how a checkpoint names it)."""
    return f"{obj.__module__}:{obj.__qualname__}"


def allowed_names(trust: Trust = None) -> Iterable[str]:
    """Every factory name allowed now, sorted (for messages and ``info``)."""
    return sorted(
        BUILTIN_FACTORIES | trusted_names(trust) | set(registered_factories()) | _adapter_names()
    )
