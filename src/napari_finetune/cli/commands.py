"""``train``, ``predict``, ``export`` and ``info``: thin layers over the library.

Heavy imports (torch, PEFT, zarr) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from napari_finetune.cli import (
    bioimageio_export,
    multi,
    object_sizes,
    predict_cluster,
    train_remote,
)
from napari_finetune.cli.options import (
    DEVICE_METAVAR,
    add_channel_option,
    add_config_options,
    add_predict_options,
    checkpoint_help,
    checkpoint_option,
    config_from_args,
    device_option,
    given_options,
    voxel_size_option,
)
from napari_finetune.cli.run import describe_outcome, run_finetune
from napari_finetune.config import FinetuneConfig, PredictConfig
from napari_finetune.errors import first_line
from napari_finetune.voxel_size import mismatch_line, trained_voxel_size

if TYPE_CHECKING:  # torch, numpy and zarr are imported when a command runs, not with --help
    import numpy as np

    from napari_finetune.arrays import AxesImage
    from napari_finetune.cli.run import RunOutcome
    from napari_finetune.io.volume import Volume
    from napari_finetune.model.checkpoint import Checkpoint
    from napari_finetune.objects import ChannelRole

# A value parsed from a JSON option (--kwargs, --normalization).
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of this module to ``sub``."""
    p = sub.add_parser(
        "train",
        help="fine-tune a checkpoint on a volume's painted corrections",
        description="Fine-tune CHECKPOINT on the corrections painted in an "
        "OME-Zarr store and export the result. Ctrl-C stops after the current "
        "step and still exports.",
    )
    p.add_argument("volume", type=Path, help="OME-Zarr store (its level 0 is used)")
    p.add_argument("--checkpoint", "-c", type=checkpoint_option, required=True,
                   help=checkpoint_help("the model to start from"))
    p.add_argument("--out", "-o", type=Path, required=True, help="where to write the result")
    p.add_argument(
        "--corrections",
        default="corrections",
        help="name of the labels image holding the corrections (default: %(default)s)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_channel_option(p)
    add_trust_option(p)
    p.add_argument(
        "--add-channel", action="append", default=[], metavar="NAME:ROLE",
        help="give the model a channel for a structure it has none for (ROLE object or "
        "boundary), e.g. nuclei:object; paint it with the next label (2 + the model's channel "
        "count). The old channels are kept by distillation from the model as it was "
        "(repeatable)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="do not resume the degraded state (smaller batch, fp32, distillation dropped) "
        "the checkpoint's previous run ended in; options given explicitly always win",
    )
    add_config_options(p, FinetuneConfig, skip=("resume_degraded", "explicit_settings"))
    multi.add_options(p)
    train_remote.add_options(p)
    p.set_defaults(func=train)

    p = sub.add_parser(
        "predict",
        help="predict a volume and write the result as NGFF labels",
        description="Predict an OME-Zarr volume block by block and write one "
        "label image per channel, labels/<name>-<channel> (1 where prob > 0.5).",
    )
    p.add_argument("checkpoint", type=checkpoint_option,
                   help=checkpoint_help("the model that predicts"))
    p.add_argument("volume", type=Path, help="OME-Zarr store to predict (level 0)")
    p.add_argument("--name", default="prediction", help="label name prefix (default: %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument(
        "--instances", action="store_true",
        help="also write labels/objects-<channel>: one id per object over the whole volume, "
        "for every channel with an instance role (the checkpoint's, or --role); with "
        "--workers/--scheduler the blocks are labelled on the cluster, resumable too",
    )
    p.add_argument(
        "--role", action="append", default=[], metavar="CHANNEL=ROLE",
        help="instance role of a channel for --instances: boundary (it encloses the objects, "
        "e.g. membrane), object (it covers them, e.g. mitochondria) or none; overrides the "
        "checkpoint's (repeatable)",
    )
    p.add_argument(
        "--seed-distance", action="append", default=[], metavar="CHANNEL=VOXELS",
        help="for --instances: the smallest distance between two objects' middles (cells: "
        "how far from the membrane a cell's middle lies), in voxels of the finest axis (y, x "
        "on an anisotropic volume), >= 1; kept as given, "
        "never taken from the painting or the prediction (repeatable)",
    )
    p.add_argument(
        "--min-size", action="append", default=[], metavar="CHANNEL=VOXELS",
        help="for --instances: objects of a channel smaller than this many voxels are "
        "dropped; kept as given, never taken from the painting or the prediction "
        "(repeatable)",
    )
    p.add_argument(
        "--voxel-size", type=voxel_size_option, metavar="Z,Y,X",
        help="the volume's voxel size, for a store whose NGFF scale does not say it (default: "
        "the store's scale): --instances measures distances in it, and a model trained at "
        "another voxel size is warned about",
    )
    add_channel_option(p)
    add_trust_option(p)
    add_predict_options(p)
    predict_cluster.add_options(p)
    p.set_defaults(func=predict)

    p = sub.add_parser(
        "export",
        help="convert a model into a checkpoint, or a checkpoint to TorchScript or bioimage.io",
        description="Without --factory: re-save CHECKPOINT (optionally with new "
        "channel names / normalisation). With --factory: SOURCE is a state dict "
        "file and the model is rebuilt by calling FACTORY(**KWARGS). With --bioimageio: "
        "write a bioimage.io model package (SOURCE may also be a package).",
    )
    p.add_argument("source", type=Path, help="a checkpoint, or a state dict with --factory")
    p.add_argument(
        "--out",
        "-o",
        type=Path,
        help="checkpoint to write (default: SOURCE for --torchscript only)",
    )
    p.add_argument("--factory", help="'package.module:callable' that builds the model")
    p.add_argument("--kwargs", default="{}", help="JSON keyword arguments of the factory")
    p.add_argument("--channel-names", nargs="+", metavar="NAME", help="output channel names")
    p.add_argument(
        "--normalization", help='JSON, e.g. {"method": "percentile", "low": 1, "high": 99}'
    )
    p.add_argument(
        "--torchscript",
        action="store_true",
        help="also write a TorchScript file next to the checkpoint (.torchscript.pt)",
    )
    add_trust_option(p)
    bioimageio_export.add_options(p)
    p.set_defaults(func=export)

    p = sub.add_parser(
        "info",
        help="describe a checkpoint, or this machine",
        description="Architecture, channels, normalisation and the record of "
        "the fine-tuning run of a checkpoint, with the environment it ran in. "
        "Without a checkpoint: this machine's versions, device and host.",
    )
    p.add_argument("checkpoint", type=checkpoint_option, nargs="?",
                   help=checkpoint_help("the model to describe"))
    p.add_argument(
        "--device", default="auto", type=device_option, metavar=DEVICE_METAVAR,
        help="device to describe; cuda:N is the GPU of index N (default: %(default)s)",
    )
    add_trust_option(p)
    p.set_defaults(func=info)


def add_trust_option(parser: argparse.ArgumentParser) -> None:
    """``--trust-factory``: model factories the user trusts beyond the allow-list."""
    parser.add_argument(
        "--trust-factory",
        action="append",
        default=[],
        metavar="MODULE:CALLABLE",
        help="build the model with this factory although it is not on the allow-list "
        "(napari-finetune's UNet, MONAI and torch-em UNets, registered architectures); "
        "calling it runs that package's code, so only name one you trust (repeatable)",
    )


def train(args: argparse.Namespace) -> int:
    """Fine-tune on the corrections of a store and export; Ctrl-C stops and exports."""
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if args.nproc is not None and args.nproc != 1 and world_size == 1:  # start torchrun
        return multi.launch(args.nproc, args.argv)
    from napari_finetune.io.omezarr import load_corrections, open_volume
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.checkpoint import with_channel_recorded

    config = config_from_args(
        FinetuneConfig,
        args,
        resume_degraded=not args.fresh,
        explicit_settings=given_options(FinetuneConfig, args),
        # On unless --no-distillation-check, as in the widget.
        distillation_check=args.distillation_check is not False,
    )
    if args.scheduler is not None and (world_size > 1 or (args.nproc or 1) > 1):
        from napari_finetune.cli import UsageError

        raise UsageError("--scheduler trains on one dask worker; leave out --nproc.")
    train_remote.check_options(args)
    if world_size > 1 or args.global_samples is not None:
        from napari_finetune.trainer.distributed import per_rank_config

        config = per_rank_config(config, world_size, args.global_samples)
    if args.out.exists() and args.out.is_dir():
        raise ValueError(f"--out {args.out} is a folder; give a file name such as finetuned.pt")
    if not args.out.parent.is_dir():
        raise FileNotFoundError(2, "output folder does not exist", str(args.out.parent))
    snapshot_dir = Path(config.memory_snapshot or ".").parent
    if not snapshot_dir.is_dir():
        raise FileNotFoundError(2, "folder of --memory-snapshot does not exist", str(snapshot_dir))
    ckpt = load_checkpoint(args.checkpoint, trust=args.trust_factory)
    for value in args.add_channel:
        ckpt = _with_new_channel(ckpt, value)
    volume = open_volume(args.volume, keep_axes=True)
    image = _model_input(volume, ckpt, args.channel)
    ckpt = with_channel_recorded(ckpt, args.channel if volume.input.channels > 1 else None)
    corrections = load_corrections(args.volume, args.corrections)
    _say_missing(image)
    if config.voxel_size is None and volume.voxel_size is not None:  # --voxel-size wins
        config = dataclasses.replace(config, voxel_size=volume.voxel_size)
    if world_size > 1:
        outcome = multi.run_rank(ckpt, image, corrections, config, args)
    elif args.scheduler is not None:
        outcome = _train_remotely(ckpt, image, corrections, config, args)
    else:  # the default patch is fitted as the widget fits its patch; a given one is kept
        outcome = run_finetune(ckpt, image, corrections, config, args.out, quiet=args.quiet,
                               fit_patch=args.patch_shape is None)
    line = describe_outcome(outcome, config.steps, args.out)
    if (outcome.stopped or outcome.exit_code == 0) and outcome.speaks:
        print(line)
    if outcome.error is not None and not outcome.speaks:
        return outcome.exit_code  # rank 0 says it
    if outcome.error is not None:
        from napari_finetune.cli import CLIError

        raise CLIError(line)
    return outcome.exit_code


def _with_new_channel(ckpt: Checkpoint, value: str) -> Checkpoint:
    """``ckpt`` with the channel ``--add-channel NAME:ROLE`` asks for (one line if it
    cannot have it); says which label paints it."""
    from napari_finetune.cli import UsageError
    from napari_finetune.model.add_channel import (
        AddChannelError,
        add_output_channel,
        parse_add_channel,
    )
    from napari_finetune.objects import roles_from_metadata

    try:
        name, role = parse_add_channel(value)
    except AddChannelError as exc:
        raise UsageError(str(exc)) from None
    names = [str(n) for n in ckpt.channel_names]
    # The old channels' roles as they read now (the sample model's are defaults, stored
    # nowhere): written beside the new one, so adding it does not drop them.
    before = {n: r.to_dict() for n, r in roles_from_metadata(ckpt.metadata, names).items()
              if r.role}
    try:
        wide = add_output_channel(ckpt, name, role, roles_before=before)
    except AddChannelError as exc:
        raise UsageError(str(exc)) from None
    print(f"added channel {name} ({role}): paint it with label {len(names) + 2}; "
          f"{', '.join(names)} are kept close to the starting model", file=sys.stderr)
    return wide


def _train_remotely(ckpt: Checkpoint, image: AxesImage, corrections: np.ndarray,
                    config: FinetuneConfig, args: argparse.Namespace) -> RunOutcome:
    """The run on a worker of ``--scheduler`` (the model's channels and the painted time
    points of ``image``, as in process); what cannot start is one line."""
    from napari_finetune.cli import CLIError
    from napari_finetune.remote.finetuner import RemoteFinetuner
    from napari_finetune.remote.preflight import RemoteError

    trainer = RemoteFinetuner.remote(
        ckpt, image, corrections, config, args.scheduler, trust=tuple(args.trust_factory),
        security=train_remote.security(args), fit_patch=args.patch_shape is None,
        store_path=args.volume,  # a worker that opens the same store reads it there
        attach_to=args.attach,
    )
    try:
        return run_finetune(ckpt, image, corrections, trainer.remote_config, args.out,
                            quiet=args.quiet, trainer=trainer)
    except RemoteError as exc:  # before any weights came back: nothing to export
        raise CLIError(first_line(exc)) from None


def predict(args: argparse.Namespace) -> int:
    """Write per-channel predictions of a store into its labels group."""
    from tqdm import tqdm

    from napari_finetune.io.omezarr import open_volume
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.predict.regions import PredictOutOfMemoryError
    from napari_finetune.predict.store import predict_to_omezarr

    config = config_from_args(PredictConfig, args)
    overrides = _parse_roles(args.role)
    sizes = _parse_sizes(args.seed_distance, args.min_size)
    for option, given in (("--role", overrides), ("--seed-distance", args.seed_distance),
                          ("--min-size", args.min_size)):
        if given and not args.instances:
            from napari_finetune.cli import UsageError

            raise UsageError(f"{option} is for the objects of --instances; add --instances.")
    instances = None
    user_set: dict[str, set[str]] = {}
    if args.instances:
        ckpt = load_checkpoint(args.checkpoint, trust=args.trust_factory)
        instances = _instance_roles(ckpt, overrides)
        instances, user_set = _given_sizes(ckpt, instances, sizes)
    if predict_cluster.wanted(args):  # the default stays in process, below
        if not args.instances:  # the channel choice is checked before a cluster starts
            ckpt = load_checkpoint(args.checkpoint, trust=args.trust_factory)
        volume = open_volume(args.volume, keep_axes=True)
        image = _model_input(volume, ckpt, args.channel)
        _say_missing(image)
        if instances is not None:
            _say_voxel_size(ckpt, args.voxel_size or volume.voxel_size)
            instances = object_sizes.roles_for_store(ckpt, instances, args.volume, image,
                                                     args.voxel_size or volume.voxel_size,
                                                     config, user_set)
        return predict_cluster.run(args, config, instances)
    if not args.instances:
        ckpt = load_checkpoint(args.checkpoint, trust=args.trust_factory)
    volume = open_volume(args.volume, keep_axes=True)
    image = _model_input(volume, ckpt, args.channel)
    _say_missing(image)
    voxel_size = args.voxel_size or volume.voxel_size
    _say_voxel_size(ckpt, voxel_size)
    if instances is not None:
        instances = object_sizes.roles_for_store(ckpt, instances, args.volume, image,
                                                 voxel_size, config, user_set)
    bars: list = []  # made at the first block, so an early error prints no empty bar

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(
                tqdm(
                    total=total,
                    unit="block",
                    disable=args.quiet,
                    file=sys.stderr,
                    dynamic_ncols=True,
                )
            )
        bars[0].n = done
        bars[0].refresh()

    def log(line: str) -> None:  # above the bar, on stderr with it
        (bars[0].write if bars else print)(line, file=sys.stderr)

    try:
        names = predict_to_omezarr(
            ckpt, args.volume, args.name, config, progress=progress, log=log,
            instances=instances, voxel_size=voxel_size, channel=args.channel,
        )
    except PredictOutOfMemoryError as exc:
        from napari_finetune.cli import CLIError

        raise CLIError(f"{exc} The previous labels of the store are kept.") from None
    finally:
        for bar in bars:
            bar.close()
    for name in names:
        print(f"wrote {args.volume}/labels/{name}")
    return 0


def export(args: argparse.Namespace) -> int:
    """Wrap a state dict into a checkpoint, re-save a checkpoint, write TorchScript."""
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.bring_your_own import checkpoint_from_factory
    from napari_finetune.model.checkpoint import save_checkpoint

    if args.channel is not None and args.bioimageio is None:
        from napari_finetune.cli import UsageError

        raise UsageError("--channel picks the channel of a bioimage.io package's test "
                         "tensors; add --bioimageio OUT.zip --volume STORE.")
    if args.bioimageio is not None and not (args.factory or args.out or args.torchscript):
        return bioimageio_export.run(args, args.source)  # SOURCE may be a package folder
    if not args.source.is_file():
        raise FileNotFoundError(2, "no such file", str(args.source))
    metadata_update: dict[str, Any] = {}
    if args.channel_names:
        metadata_update["channel_names"] = list(args.channel_names)
    if args.normalization:
        metadata_update["normalization"] = _json_option("--normalization", args.normalization)
    out = args.out
    trust = [*args.trust_factory, *([args.factory] if args.factory else [])]
    if args.factory:
        if out is None:
            raise ValueError("--factory needs --out: where to write the new checkpoint")
        kwargs = _json_option("--kwargs", args.kwargs)
        if not isinstance(kwargs, dict):  # a list or a number cannot be keyword arguments
            raise ValueError(f"--kwargs is not a JSON object: {args.kwargs}")
        checkpoint_from_factory(out, args.factory, kwargs, args.source, metadata_update)
        print(f"wrote {out}")
    elif out is not None:
        ckpt = load_checkpoint(args.source, trust=trust)
        metadata = {**ckpt.metadata, **metadata_update}
        save_checkpoint(out, ckpt.model, metadata, architecture=ckpt.architecture)
        print(f"wrote {out}")
    elif not args.torchscript:
        raise ValueError(
            "nothing to do: give --out (a checkpoint to write), --torchscript or --bioimageio"
        )
    if args.torchscript:
        target = out if out is not None else args.source
        print(f"wrote {write_torchscript(load_checkpoint(target, trust=trust))}")
    if args.bioimageio is not None:
        bioimageio_export.run(args, out if out is not None else args.source)
    return 0


def write_torchscript(ckpt: Checkpoint) -> Path:
    """Script the checkpoint's model (trace as a fallback) next to its file."""
    from napari_finetune.model.torchscript import to_torchscript

    if ckpt.path is None:  # load_checkpoint records its file; one built in memory has none
        raise ValueError("the checkpoint was not read from a file: no place for its TorchScript")
    path = ckpt.path.with_suffix(".torchscript.pt")
    to_torchscript(ckpt.model).save(str(path))
    return path


def info(args: argparse.Namespace) -> int:
    """Print :func:`describe_checkpoint` and the environment its run recorded, or this
    machine's environment without a checkpoint."""
    from napari_finetune.trainer.environment import describe_environment, run_environment

    if args.checkpoint is None:
        from napari_finetune.devices import resolve_device

        print(f"this machine: {describe_environment(run_environment(resolve_device(args.device)))}")
        return 0
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.checkpoint import describe_checkpoint
    from napari_finetune.objects import roles_from_metadata

    ckpt = load_checkpoint(args.checkpoint, trust=args.trust_factory)
    names = [str(n) for n in ckpt.channel_names]
    try:
        roles = {n: r.role for n, r in roles_from_metadata(ckpt.metadata, names).items()}
    except ValueError:  # roles that do not fit the channels: the names alone, as before
        roles = {}
    print(describe_checkpoint(ckpt, roles))
    env = (ckpt.metadata.get("run") or {}).get("environment")
    if env:
        print(f"trained with:  {describe_environment(env)}")
    return 0


def _parse_roles(values: list[str]) -> dict[str, str | None]:
    """``--role CHANNEL=ROLE`` values as {channel: role or None}; a one-line UsageError."""
    from napari_finetune.cli import UsageError
    from napari_finetune.objects import ROLES

    roles: dict[str, str | None] = {}
    for value in values:
        channel, sep, role = value.partition("=")
        channel, role = channel.strip(), role.strip().lower()
        if not sep or not channel or role not in (*ROLES, "none"):
            raise UsageError(
                f"--role {value!r}: give CHANNEL=ROLE with ROLE one of "
                f"{', '.join(ROLES)} or none, e.g. --role membrane=boundary."
            )
        roles[channel] = None if role == "none" else role
    return roles


def _parse_sizes(
    seed_distances: list[str], min_sizes: list[str]
) -> dict[str, dict[str, float | int]]:
    """``--seed-distance`` and ``--min-size`` values as {channel: {parameter: value}}; a
    one-line UsageError for a value that is not ``CHANNEL=NUMBER`` in range."""
    import math

    from napari_finetune.cli import UsageError

    sizes: dict[str, dict[str, float | int]] = {}
    for option, name, values in (("--seed-distance", "seed_distance", seed_distances),
                                 ("--min-size", "min_size", min_sizes)):
        for value in values:
            channel, sep, number = (part.strip() for part in value.partition("="))
            parsed: float | int | None
            try:
                parsed = float(number) if name == "seed_distance" else int(number)
            except ValueError:
                parsed = None
            if (not sep or not channel or parsed is None or not math.isfinite(parsed)
                    or parsed < (1 if name == "seed_distance" else 0)):
                what = ("a number of voxels >= 1, e.g. --seed-distance nuclei=12"
                        if name == "seed_distance"
                        else "a whole number of voxels >= 0, e.g. --min-size nuclei=500")
                raise UsageError(f"{option} {value!r}: give CHANNEL=VOXELS with {what}.")
            sizes.setdefault(channel, {})[name] = parsed
    return sizes


def _given_sizes(
    ckpt: Checkpoint, roles: dict[str, ChannelRole], sizes: dict[str, dict[str, float | int]],
) -> tuple[dict[str, ChannelRole], dict[str, set[str]]]:
    """``roles`` with the sizes given on the command line, and which parameters they set
    per channel (never estimated afterwards); a one-line UsageError for a channel the
    model does not have, or one without an instance role."""
    from dataclasses import replace

    from napari_finetune.cli import UsageError

    names = [str(n) for n in ckpt.channel_names]
    out = dict(roles)
    user_set: dict[str, set[str]] = {}
    for channel, given in sizes.items():
        options = " / ".join("--" + name.replace("_", "-") for name in given)
        if channel not in names:
            raise UsageError(f"{options} names channel {channel!r}, which the model does not "
                             f"have; its channels are {', '.join(names)}.")
        if out[channel].role is None:
            raise UsageError(f"{options} sizes the objects of {channel!r}, which has no "
                             f"instance role; give it one with --role {channel}=object (or "
                             "boundary).")
        role = out[channel]
        out[channel] = replace(
            role, seed_distance=float(given.get("seed_distance", role.seed_distance)),
            min_size=int(given.get("min_size", role.min_size)))
        user_set[channel] = set(given)
    return out, user_set


def _instance_roles(
    ckpt: Checkpoint, overrides: dict[str, str | None]
) -> dict[str, ChannelRole]:
    """The checkpoint's instance roles with ``--role`` applied; a one-line UsageError when a
    channel is unknown or none has a role."""
    from dataclasses import replace

    from napari_finetune.cli import UsageError
    from napari_finetune.objects import ChannelRole, roles_from_metadata

    names = [str(n) for n in ckpt.channel_names]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise UsageError(
            f"--role names channels {unknown} the model does not have; its channels are "
            f"{', '.join(names)}."
        )
    roles = roles_from_metadata(ckpt.metadata, names)
    for channel, role in overrides.items():
        # A role given on the command line keeps the checkpoint's parameters for that channel
        # when it had the same role; otherwise the role's defaults.
        kept = roles[channel]
        if role is None:
            roles[channel] = replace(kept, role=None)
        elif kept.role != role:
            roles[channel] = ChannelRole(role)
    if not any(r.role for r in roles.values()):
        which = Path(ckpt.path).name if ckpt.path else "the checkpoint"
        raise UsageError(
            f"{which} gives no channel an instance role (channels: "
            f"{', '.join(names)}); set one with --role CHANNEL=boundary or "
            "--role CHANNEL=object, e.g. --role " + f"{names[0]}=object."
        )
    return roles


def _model_input(volume: Volume, ckpt: Checkpoint, channel: int | None) -> AxesImage:
    """The store's image as the model takes it (all channels, or ``--channel``); a
    one-line UsageError naming the choice when the channels do not fit the model."""
    from napari_finetune.arrays import ChannelChoiceError
    from napari_finetune.cli import UsageError
    from napari_finetune.devices import model_in_channels

    try:
        return volume.input.for_model(model_in_channels(ckpt.model), channel)
    except ChannelChoiceError as exc:
        raise UsageError(str(exc)) from None


def _say_missing(image: AxesImage) -> None:
    """Print the one line on the image's NaN/inf voxels, if it has any."""
    from napari_finetune.data.normalization import describe_missing

    line = describe_missing(image.array, image.axes)
    if line:
        print(line)


def _say_voxel_size(ckpt: Checkpoint, voxel_size: tuple[float, ...] | None) -> None:
    """Print one warning line (stderr) when the model was trained at another voxel size."""
    line = mismatch_line(trained_voxel_size(ckpt.metadata), voxel_size)
    if line:
        print(line, file=sys.stderr)


def _json_option(flag: str, text: str) -> JSON:
    """``text`` parsed as JSON; a ValueError naming ``flag`` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not valid JSON ({exc.msg}): {text}") from None
