"""A new structure: one more output channel, the old ones untouched.

A structure the model has no channel for (nuclei for an EM model) gets its own
channel: the layer that makes the model's output gets one more output row. Its
old rows are copied exactly and the new one starts at zero weights and a bias
of :data:`NEW_CHANNEL_BIAS` (sigmoid ~0.02: "not here" everywhere until painted),
so the same input gives the same first ``C`` channels, bit for bit.

This works when the model's output IS the output of one convolution (or
transposed convolution) without groups: each output channel of such a layer
reads only its own row of weights and its own bias. napari-finetune's UNet
(``head``, 1x1), MONAI ``BasicUNet`` (``final_conv``, 1x1), torch-em's UNets
(``out_conv``, 1x1, no final activation) and MONAI ``UNet`` without residual
units (its last layer, a transposed convolution) are of this kind. A model
whose output is made after its last convolution (MONAI ``UNet`` with residual
units adds a skip path; a final softmax mixes the channels) is refused with one
line: appending a channel there would change the old channels' outputs.

napari-finetune's UNet gets more than a row: an added channel has weights of its
own, a one-channel copy of the starting UNet (``added``; its layers the starting
model's, its output row zero), which no old channel reads. A run that trains
only those (:func:`added_parameters`) leaves the old channels' outputs bit for
bit the starting model's, while the new channel can move every layer it reads,
as painting the structure as an existing channel does (an output row alone reads
the old model's last features only, too few for a structure it was never
trained on; a small block of its own beside them learnt too slowly: docs/
benchmarks.md, "Adding a channel on real nuclei"). The price: the copy's weights
and compute, once per added channel.

The widened model records its new ``out_channels`` (``init_kwargs``, or the
attribute an architecture adapter reads back), and the rebuild from that record
is checked to take its weights, so an export loads again with
``weights_only=True``. For a checkpoint, the channel's name and instance role
go into the metadata, with :data:`STARTING_CHANNELS_KEY`: how many leading
channels the model had before, the channels a run's teacher knows (the trainer
distils and holds only those; the new one is supervised where painted).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any, TypeVar, overload

import torch
from torch import nn

from napari_finetune.model.checkpoint_format import (
    Checkpoint,
    CheckpointError,
    architecture_of,
    channel_names_of,
)
from napari_finetune.model.factory import build_model

# The instance roles' metadata key and names (napari_finetune.objects.roles; that
# package sits beside this one, so they are repeated and a test keeps them equal).
ROLES_KEY = "instance_roles"
ROLES = ("object", "boundary")

# Metadata: how many leading output channels the starting model had. A run reads it to
# distil (and hold) only those; an export drops it, since the exported model knows all.
STARTING_CHANNELS_KEY = "starting_channels"

# sigmoid(-4) = 0.018: the new channel says "absent" until it is painted, so a
# prediction before training shows no false structure, and BCE's gradient at the
# first painted voxels is still near its largest.
NEW_CHANNEL_BIAS = -4.0

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
          nn.ConvTranspose3d)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\- ]*$")

ModelOrCheckpoint = TypeVar("ModelOrCheckpoint", nn.Module, Checkpoint)


class AddChannelError(ValueError):
    """The model cannot get another channel (or the name or role is wrong); one line."""


def parse_add_channel(text: str) -> tuple[str, str]:
    """``"nuclei:object"`` -> ``("nuclei", "object")``; a one-line error otherwise."""
    name, sep, role = str(text).rpartition(":")
    name, role = name.strip(), role.strip().lower()
    if not sep or not name:
        raise AddChannelError(
            f"--add-channel takes NAME:ROLE (ROLE one of {', '.join(ROLES)}), e.g. "
            f"nuclei:object; got {text!r}."
        )
    check_name_and_role(name, role, ())
    return name, role


def check_name_and_role(name: str, role: str, existing: list[str] | tuple[str, ...]) -> None:
    """Raise :class:`AddChannelError` for a name that is taken or unusable, or a role not
    in :data:`ROLES`."""
    if role not in ROLES:
        raise AddChannelError(
            f"the role of a new channel is one of {', '.join(ROLES)}, got {role!r} "
            "(object: the channel is high on the things to count; boundary: between them)."
        )
    if not _NAME.match(name):
        raise AddChannelError(
            f"a channel name is letters, digits, spaces, '_', '-' or '.', got {name!r}."
        )
    if name in existing:
        raise AddChannelError(
            f"the model already has a channel named {name!r} (its channels: "
            f"{', '.join(existing)}); paint it with its own label, or pick another name."
        )


@overload
def add_output_channel(
    target: Checkpoint, name: str, role: str,
    roles_before: Mapping[str, Mapping[str, Any]] | None = None,
    own_weights: bool = True,
) -> Checkpoint: ...
@overload
def add_output_channel(
    target: nn.Module, name: str, role: str,
    roles_before: Mapping[str, Mapping[str, Any]] | None = None,
    own_weights: bool = True,
) -> nn.Module: ...
def add_output_channel(
    target: Checkpoint | nn.Module, name: str, role: str,
    roles_before: Mapping[str, Mapping[str, Any]] | None = None,
    own_weights: bool = True,
) -> Checkpoint | nn.Module:
    """A copy of ``target`` with one more output channel, the old ones unchanged.

    Parameters
    ----------
    target : Checkpoint or torch.nn.Module
        The starting model (not changed). A checkpoint's copy also gets the
        channel's name and role and :data:`STARTING_CHANNELS_KEY` in its metadata.
    name : str
        The new channel's name (not one the model has).
    role : {"object", "boundary"}
        Its instance role (``object``: high on the things to count).
    roles_before : mapping, optional
        The old channels' roles as plain dicts (``{"membrane": {"role": "boundary",
        ...}}``), for a checkpoint whose metadata stores none because its roles are
        defaults (the sample model's): written beside the new one so they stay.
    own_weights : bool
        For napari-finetune's UNet: the channel gets weights of its own (see module
        doc). False: only an output row, as for other models (a UNet that has
        added channels with own weights always gets another such one).

    Returns
    -------
    Checkpoint or torch.nn.Module
        Same kind as ``target``; painted label ``2 + C`` (C the old channel count)
        is the new channel's foreground.

    Raises
    ------
    AddChannelError
        One line: the model's output is not made by one convolution, it does not
        record how to rebuild it with another channel, the name is taken, or the
        role is unknown.
    """
    if isinstance(target, Checkpoint):
        return _add_to_checkpoint(target, name, role, roles_before, own_weights)
    check_name_and_role(name, role, ())
    return widen_model(target, own_weights)


def _add_to_checkpoint(
    ckpt: Checkpoint, name: str, role: str,
    roles_before: Mapping[str, Mapping[str, Any]] | None,
    own_weights: bool,
) -> Checkpoint:
    names = list(ckpt.channel_names)
    check_name_and_role(name, role, names)
    model = widen_model(ckpt.model, own_weights)
    metadata = copy.deepcopy(ckpt.metadata)
    metadata["channel_names"] = [*names, name]
    stored = metadata.get(ROLES_KEY)
    roles = dict(stored) if isinstance(stored, dict) else {
        str(k): dict(v) for k, v in (roles_before or {}).items()
    }
    roles[name] = {"role": role}
    metadata[ROLES_KEY] = roles
    # A second channel added before training keeps the first count: the teacher is
    # the model as it was loaded.
    metadata.setdefault(STARTING_CHANNELS_KEY, len(names))
    from napari_finetune import palette

    metadata.pop(palette.METADATA_KEY, None)  # the colours are chosen again for the new names
    return dataclasses.replace(
        ckpt, model=model, metadata=metadata, architecture=architecture_of(model)
    )


def output_layer(model: nn.Module) -> tuple[str, nn.Module]:
    """``(qualified name, module)`` of the layer whose output is the model's output.

    Found by running the model once on a small input and keeping the last leaf
    module whose output tensor is the model's output tensor itself.

    Raises
    ------
    AddChannelError
        When no single convolution without groups makes the output.
    """
    first = next((m for m in model.modules() if isinstance(m, _CONVS)), None)
    if first is None:
        raise AddChannelError(
            f"{type(model).__name__} has no convolution, so napari-finetune cannot find the "
            "layer that makes its channels to add one."
        )
    ndim = first.weight.ndim - 2
    from napari_finetune.model.geometry import spatial_multiple
    from napari_finetune.model.modes import evaluating

    shape = tuple(2 * m for m in spatial_multiple(model, ndim))
    # The outputs themselves are kept (not their ids): a freed tensor's id can be reused
    # by the model's output, which would name a layer that did not make it.
    outputs: list[tuple[str, object]] = []
    hooks = [
        module.register_forward_hook(
            lambda _m, _i, out, _n=qualname: outputs.append((_n, out))
        )
        for qualname, module in model.named_modules()
        if not list(module.children())
    ]
    try:
        device = first.weight.device
        with evaluating(model), torch.no_grad():
            out = model(torch.zeros((1, first.in_channels, *shape), device=device))
            found = next((n for n, made in reversed(outputs) if made is out), None)
        outputs.clear()
    finally:
        for hook in hooks:
            hook.remove()
    layer = model.get_submodule(found) if found is not None else None
    if not isinstance(layer, _CONVS) or layer.groups != 1:
        what = (
            f"is made by a {type(layer).__name__} ({found})" if layer is not None
            else "is made after its last layer (a skip path added to it, an activation)"
        )
        raise AddChannelError(
            f"cannot add a channel to {type(model).__name__}: its output {what}, and only a "
            "final convolution can get one more channel without changing the old ones. Use a "
            "model that ends in a convolution (napari-finetune's UNet, MONAI BasicUNet or UNet "
            "with num_res_units=0, torch-em UNets) or paint the structure as an existing channel."
        )
    assert found is not None
    return found, layer


def widen_model(model: nn.Module, own_weights: bool = True) -> nn.Module:
    """A copy of ``model`` with one more output channel (see module doc).

    Parameters
    ----------
    model : torch.nn.Module
        Not changed.
    own_weights : bool
        Weights of its own when ``model`` is napari-finetune's UNet; False: an
        output row only.

    Raises
    ------
    AddChannelError
        One line when the model cannot be widened or rebuilt from its record.
    """
    from napari_finetune.model.unet import UNet

    # Exactly the UNet, not a subclass: another forward may make its output otherwise.
    if type(model) is UNet and (own_weights or len(model.added)):
        wide = _with_added_channel(model)
        _check_rebuilds(wide)
        return wide
    qualname, layer = output_layer(model)
    old = _out_of(layer)
    wide = copy.deepcopy(model)
    new_layer = _widened(layer)
    parent_name, _, attr = qualname.rpartition(".")
    parent = wide.get_submodule(parent_name)
    setattr(parent, attr, new_layer)
    # What the rebuild reads: the recorded arguments, or the attributes an adapter
    # recovers them from (MONAI keeps out_channels on the model and on its blocks).
    recorded = getattr(wide, "init_kwargs", None)
    if isinstance(recorded, dict):
        wide.init_kwargs = {**recorded, "out_channels": old + 1}  # type: ignore[assignment]
    for module in (wide, parent):
        if getattr(module, "out_channels", None) == old and not isinstance(module, _CONVS):
            try:
                module.out_channels = old + 1  # type: ignore[assignment]
            except AttributeError:  # a property read off the layers (torch-em)
                pass
    _check_rebuilds(wide)
    return wide


def _with_added_channel(model: nn.Module) -> nn.Module:
    """A copy of napari-finetune's UNet ``model`` with one more channel of its own weights.

    The copy is built from ``model``'s record with one more added channel and takes
    every one of ``model``'s weights; the new channel's UNet takes ``model``'s own
    layers (not an earlier added channel's), and its output row starts at zero with
    a bias of :data:`NEW_CHANNEL_BIAS`.
    """
    from napari_finetune.model.unet import UNet

    assert isinstance(model, UNet)
    kwargs = dict(model.init_kwargs)
    existing = int(kwargs.get("added_channels", 0))
    kwargs.update(out_channels=int(kwargs["out_channels"]) + 1, added_channels=existing + 1)
    device = next(model.parameters()).device
    # Every weight is copied below; the draws of the build must not move the global
    # random state (a run seeded after this would draw other patches).
    with torch.random.fork_rng(devices=[]):
        wide = UNet(**kwargs)
    state = model.state_dict()
    missing, unexpected = wide.load_state_dict(state, strict=False)
    new_prefix = f"added.{existing}."
    if unexpected or any(not key.startswith(new_prefix) for key in missing):
        raise AddChannelError(
            f"UNet got a channel, but its weights do not fit the wider model (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})."
        )
    own = wide.added[existing]
    assert isinstance(own, UNet)
    shared = {k: v for k, v in state.items() if not k.startswith(("head.", "added."))}
    missing, unexpected = own.load_state_dict(shared, strict=False)
    if unexpected or any(not key.startswith("head.") for key in missing):
        raise AddChannelError(
            f"UNet got a channel, but its own copy does not take the starting layers "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    row = own.head
    assert isinstance(row, nn.Conv2d | nn.Conv3d)
    with torch.no_grad():
        # Zero: the channel says "absent" everywhere (the bias) until it is trained; the
        # run fits the row on the painting first (trainer/new_channel.py).
        row.weight.zero_()
        if row.bias is not None:
            row.bias.fill_(NEW_CHANNEL_BIAS)
    wide.to(device)
    wide.train(model.training)
    for name, param in wide.named_parameters():
        if not name.startswith(new_prefix):
            param.requires_grad_(model.get_parameter(name).requires_grad)
    return wide


def channel_rows(model: nn.Module, channels: range) -> list[tuple[str, nn.Module, int]]:
    """Where each of ``channels`` is made: ``(layer name, layer, row)``.

    An added channel with weights of its own is row 0 of its own UNet's output layer
    (``added.K.head``); any other channel is its row of the model's output layer.

    Raises
    ------
    AddChannelError
        As :func:`output_layer`, for a channel made by the output layer.
    """
    from napari_finetune.model.unet import UNet

    head_rows = model.head_channels if isinstance(model, UNet) and type(model) is UNet else None
    found: list[tuple[str, nn.Module, int]] = []
    for channel in channels:
        if head_rows is not None and channel >= head_rows:
            name = f"added.{channel - head_rows}.head"
            found.append((name, model.get_submodule(name), 0))
        elif head_rows is not None:
            found.append(("head", model.get_submodule("head"), channel))
        else:
            found.append((*output_layer(model), channel))
    return found


def added_parameters(model: nn.Module, taught: int) -> list[str] | None:
    """Module names whose weights are the channels ``taught..``'s own, or None.

    A run that trains only the parameters under these names (``added.K.`` in the
    model's parameter names, also inside a PEFT wrapper) leaves channels
    ``0..taught-1`` exactly as they were. None when a channel from ``taught`` on has
    no weights of its own (it is a row of the shared output layer), or when there is
    no such channel: then every weight trains.
    """
    from napari_finetune.model.unet import UNet

    if not isinstance(model, UNet) or type(model) is not UNet or not len(model.added):
        return None
    head_rows = model.head_channels
    total = head_rows + len(model.added)
    if taught < head_rows or taught >= total:
        return None
    return [f"added.{k}" for k in range(taught - head_rows, len(model.added))]


def _out_of(layer: nn.Module) -> int:
    assert isinstance(layer, _CONVS)
    return int(layer.out_channels)


def _widened(layer: nn.Module) -> nn.Module:
    """A copy of the convolution ``layer`` with one more output channel, old rows exact."""
    assert isinstance(layer, _CONVS)
    wide = copy.deepcopy(layer)
    transposed = isinstance(layer, nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d)
    axis = 1 if transposed else 0  # a transposed convolution keeps (in, out, *kernel)
    weight = layer.weight.detach()
    row_shape = list(weight.shape)
    row_shape[axis] = 1
    with torch.no_grad():
        wide.weight = nn.Parameter(
            torch.cat([weight, weight.new_zeros(row_shape)], dim=axis),
            requires_grad=layer.weight.requires_grad,
        )
        if layer.bias is not None:
            bias = layer.bias.detach()
            wide.bias = nn.Parameter(
                torch.cat([bias, bias.new_full((1,), NEW_CHANNEL_BIAS)]),
                requires_grad=layer.bias.requires_grad,
            )
    wide.out_channels = layer.out_channels + 1
    return wide


def _check_rebuilds(model: nn.Module) -> None:
    """The widened model's record must rebuild a model that takes its weights."""
    try:
        architecture = architecture_of(model)
        # The model is in memory already, so its own factory is no new code to trust.
        # Its first weights are replaced by the state dict: their draws must not move
        # the caller's random state.
        with torch.random.fork_rng(devices=[]):
            rebuilt = build_model(architecture, trust=architecture.get("factory"))
        rebuilt.load_state_dict(model.state_dict())
    except (CheckpointError, RuntimeError) as exc:
        line = " ".join(str(exc).split())[:300]
        raise AddChannelError(
            f"{type(model).__name__} got a channel, but its recorded architecture does not "
            f"rebuild it ({line}); an export could not be loaded again."
        ) from None
    outputs = channel_names_of({}, _recorded_out_channels(architecture))
    if len(outputs) != output_channel_count(model):
        raise AddChannelError(
            f"{type(model).__name__} got a channel, but its recorded architecture still "
            f"says out_channels={len(outputs)}; an export would name its channels wrong."
        )


def output_channel_count(model: nn.Module) -> int:
    """How many channels ``model`` makes (napari-finetune's UNet: its head's and its added
    channels'; another model: its output layer's).

    Raises
    ------
    AddChannelError
        As :func:`output_layer`, for a model other than napari-finetune's UNet.
    """
    from napari_finetune.model.unet import UNet

    if isinstance(model, UNet) and type(model) is UNet:
        return model.head_channels + len(model.added)
    return _out_of(output_layer(model)[1])


def _recorded_out_channels(architecture: dict[str, Any]) -> int | None:
    value = architecture.get("kwargs", {}).get("out_channels")
    return int(value) if value is not None else None
