"""Command-line options made from the config dataclasses, and the status printer.

Every :class:`~napari_finetune.config.FinetuneConfig` field becomes an option
(``batch_size`` -> ``--batch-size``) whose help text is the field's own
docstring entry, so the CLI and the dataclass cannot drift apart; ranges and
choices come from :mod:`napari_finetune.config_fields`, which the widget's
settings form is built from too.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from napari_finetune.config import FinetuneConfig, PredictConfig
from napari_finetune.config_fields import DEVICE_NAMES, FIELDS, field_docs, is_device_name
from napari_finetune.voxel_size import VoxelSize, parse_voxel_size

if TYPE_CHECKING:  # the trainer (torch) is imported when a run starts, not with --help
    from napari_finetune.trainer.status import Status

__all__ = [
    "DEVICE_METAVAR", "add_channel_option", "add_config_options", "config_from_args",
    "device_option", "field_docs", "given_options", "voxel_size_option",
]

# --device's values in the usage and help: the names argparse accepts (cuda:N: GPU N).
DEVICE_METAVAR = "{" + ",".join(DEVICE_NAMES) + "}"


def device_option(text: str) -> str:
    """``--device cuda:1``; another name is argparse's one-line usage error listing them."""
    if not is_device_name(text):
        raise argparse.ArgumentTypeError(
            f"unknown device {text!r}: use {', '.join(DEVICE_NAMES[:-1])} or {DEVICE_NAMES[-1]}"
        )
    return text


def checkpoint_option(text: str) -> Path:
    """A checkpoint file, or the name of a model shipped with the package
    (:data:`~napari_finetune.samples.models.SHIPPED`: ``sample``, ``starter``)."""
    from napari_finetune.samples.models import shipped_model

    return shipped_model(text) or Path(text)


def checkpoint_help(what: str) -> str:
    """An option's help for a checkpoint argument: what it is, and the shipped names."""
    from napari_finetune.samples.models import SHIPPED

    names = "; ".join(f"{name}: {model.about}" for name, model in SHIPPED.items())
    return f"{what}: a checkpoint file, or a model that ships with napari-finetune ({names})"


def add_channel_option(parser: argparse.ArgumentParser) -> None:
    """``--channel N``: the store's channel a single-channel model trains or predicts on."""
    parser.add_argument(
        "--channel", type=int, metavar="N", default=None,
        help="for a store with several channels and a model that takes one: the channel "
        "(0, 1, ...) it works on; a model taking as many channels as the store takes them all",
    )


def voxel_size_option(text: str) -> VoxelSize:
    """``--voxel-size 40,8,8``; argparse prints a bad value's one line as the usage error."""
    try:
        return parse_voxel_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

# The type an option parses where it is not its default's (every field whose default is
# None has one); a ValueError or ArgumentTypeError is argparse's one-line "invalid value".
_OPTIONAL_TYPES: dict[str, Callable[[str], object]] = {
    "max_grad_norm": float, "memory_snapshot": str, "voxel_size": voxel_size_option,
    "device": device_option,
}
# What leaving out the option of a field whose default is None means: None cannot be
# typed, so the help says this instead (every such field needs its entry).
_UNSET = {
    "autobatch": "on for cuda/mps, off on the cpu",
    "max_grad_norm": "no clipping",
    "memory_snapshot": "off",
    "voxel_size": "every axis alike where the store has no scale",
}
# Options that show a format or their values rather than the field's type.
_METAVARS = {"voxel_size": "Z,Y,X", "device": DEVICE_METAVAR}
# Switches whose default None means "decided by the device": --x / --no-x.
_OPTIONAL_SWITCHES = ("autobatch",)
# The config dataclasses the command line builds; config_from_args returns the one it is given.
ConfigT = TypeVar("ConfigT", FinetuneConfig, PredictConfig)
ConfigClass = type[FinetuneConfig] | type[PredictConfig]


def add_config_options(
    parser: argparse.ArgumentParser, cls: ConfigClass, skip: tuple[str, ...] = ()
) -> None:
    """Add one option per dataclass field (defaults come from the dataclass)."""
    # A field named in a docstring reads as its option; one without an option, in words.
    docs = field_docs(
        cls, refer=lambda name: name.replace("_", " ") if name in skip else _flag(name)
    )
    group = parser.add_argument_group(f"{cls.__name__} settings")
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = _flag(f.name)
        default = f.default
        shown = _UNSET[f.name] if default is None else _show(default)
        spec = FIELDS.get(f.name) if cls is FinetuneConfig else None
        limits = f", {spec.range_text()}" if spec and spec.low is not None else ""
        helptext = f"{docs.get(f.name, '')} (default: {shown}{limits})"
        choices = [value for _, value in spec.choices] if spec and spec.choices else None
        if isinstance(default, bool) or f.name in _OPTIONAL_SWITCHES:
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=helptext
            )
        elif isinstance(default, tuple):
            group.add_argument(flag, type=int, nargs="+", metavar="N", default=None,
                               help=helptext)
        else:
            kind = _OPTIONAL_TYPES.get(
                f.name, str if default is None else type(default)
            )
            group.add_argument(
                flag, type=kind, default=None, help=helptext, choices=choices,
                metavar=_METAVARS.get(f.name),
            )


def given_options(cls: ConfigClass, args: argparse.Namespace) -> tuple[str, ...]:
    """Names of the ``cls`` fields whose option was given on the command line."""
    return tuple(f.name for f in dataclasses.fields(cls) if getattr(args, f.name, None) is not None)


def config_from_args(cls: type[ConfigT], args: argparse.Namespace, **overrides: object) -> ConfigT:
    """Build ``cls`` from the options given (unset ones keep the dataclass default).

    ``overrides`` are field values set by the command itself (a None one is left out);
    the dataclass checks every value's type and range, as it does the options'.
    """
    # Values of fields of different types: the dataclass's __post_init__ checks them.
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if value is not None:
            values[f.name] = tuple(value) if isinstance(value, list) else value
    values.update({k: v for k, v in overrides.items() if v is not None})
    if cls is FinetuneConfig:  # the widget's ranges (ValueError: one line, as the config's)
        for name, value in values.items():
            if name in FIELDS and FIELDS[name].low is not None and value is not None:
                for item in value if isinstance(value, tuple) else (value,):
                    FIELDS[name].check(name, item)
    return cls(**values)


def add_predict_options(parser: argparse.ArgumentParser) -> None:
    """Block, halo, batch and device of blockwise prediction."""
    add_config_options(parser, PredictConfig)


def _flag(name: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _show(value: object) -> str:
    """A default as it is typed (a switch's as on or off)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


class StatusPrinter:
    """Prints a status line whenever the run's state changes, under a tqdm bar.

    A line is printed for the probe, every recovery, the end of the run, and
    any step at which dtype, batch x accumulation or the distillation state
    differ from the last printed line; the bar shows steps and loss.
    """

    def __init__(self, total: int, quiet: bool = False, echo: bool = True) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, unit="step", disable=quiet, file=sys.stderr, dynamic_ncols=True
        )
        self.echo = echo  # False: only collect the lines (benchmarks)
        self.last_key: tuple[object, ...] | None = None
        self.lines: list[str] = []

    @staticmethod
    def describe(status: Status) -> str:
        """The state as one line: precision, batch x accumulation, distillation, hold."""
        # Here, not at the top: the CLI's start does not import torch.
        from napari_finetune.trainer.precision import precision_words

        return (
            f"{precision_words(status.dtype, status.grad_scaler)}  "
            f"batch {status.batch_size} x accumulation {status.accumulation}  "
            f"distillation {status.distillation}  hold on the other channels "
            f"{status.hold_other_channels}"
        )

    def __call__(self, status: Status) -> None:
        key = (
            status.dtype,
            status.grad_scaler,
            status.batch_size,
            status.accumulation,
            status.distillation,
            status.hold_other_channels,
            None if status.validation is None else tuple(sorted(status.validation.items())),
        )
        if status.kind != "step" or key != self.last_key:
            line = f"[{status.kind} {status.step}/{status.total_steps}] {self.describe(status)}"
            if status.message:
                line += f"  | {status.message}"
            self.lines.append(line)
            if self.echo:
                self.bar.write(line)
            self.last_key = key
        self.bar.n = status.step
        if status.loss is not None:
            self.bar.set_postfix(loss=f"{status.loss:.4f}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        """Close the progress bar."""
        self.bar.close()
