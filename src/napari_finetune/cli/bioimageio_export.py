"""``export CHECKPOINT --bioimageio OUT.zip --volume STORE``: its options and its run.

Only argparse is imported at registration; torch and bioimageio.spec are
imported when the export runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from napari_finetune.model.checkpoint import Checkpoint

DEFAULT_LICENSE = "CC-BY-4.0"  # the same as napari_finetune.bioimageio.export's


def add_options(parser: argparse.ArgumentParser) -> None:
    """The ``--bioimageio`` option group of ``export``."""
    group = parser.add_argument_group(
        "bioimage.io package",
        "write the model as a bioimage.io package (pytorch_state_dict + torchscript "
        "weights, test tensors cut from --volume), checked with bioimageio.core",
    )
    group.add_argument(
        "--bioimageio", type=Path, metavar="OUT.zip", help="the bioimage.io package to write"
    )
    group.add_argument(
        "--volume",
        type=Path,
        metavar="STORE",
        help="OME-Zarr store the test tensors are cut from (required with --bioimageio)",
    )
    group.add_argument("--name", help="the package's name (default: from the checkpoint's file)")
    group.add_argument("--description", help="one or two sentences on the model")
    group.add_argument(
        "--author",
        action="append",
        default=[],
        metavar="NAME",
        help="an author (repeatable; default: an imported package's authors, else your login)",
    )
    group.add_argument(
        "--license",
        default=DEFAULT_LICENSE,
        metavar="SPDX",
        help="SPDX licence identifier (default: %(default)s)",
    )
    group.add_argument(
        "--cite",
        action="append",
        default=[],
        metavar="TEXT=DOI_OR_URL",
        help="a citation, e.g. 'Doe et al. 2026=10.1234/abc' (repeatable; default: an "
        "imported package's citations, else the U-Net paper)",
    )
    group.add_argument(
        "--test-shape",
        type=int,
        nargs="+",
        metavar="N",
        help="spatial shape of the test tensors (default: up to 32 64 64, or 256 256)",
    )
    group.add_argument(
        "--channel",
        type=int,
        metavar="N",
        default=None,
        help="for a single-channel model and a --volume with several channels: the channel "
        "(0, 1, ...) the test tensors are cut from (default: the one the model was trained "
        "on, as its checkpoint records it)",
    )
    group.add_argument(
        "--no-check",
        action="store_true",
        help="skip bioimageio.core's test of the written package",
    )


def run(args: argparse.Namespace, source: Path) -> int:
    """Export ``source`` (a checkpoint or package) as ``args.bioimageio``."""
    import dataclasses

    from napari_finetune.bioimageio.export import export_bioimageio
    from napari_finetune.loading import load_checkpoint

    if args.volume is None:
        raise ValueError(
            "--bioimageio needs --volume STORE.zarr: the package's test tensors are cut "
            "from your own volume"
        )
    if not args.volume.exists():
        raise FileNotFoundError(2, "no such OME-Zarr store", str(args.volume))
    ckpt = load_checkpoint(source, trust=args.trust_factory)
    update = metadata_update(args)
    if update:
        ckpt = dataclasses.replace(ckpt, metadata={**ckpt.metadata, **update})
    if args.channel is not None:
        _say_other_channel(ckpt, args.volume, args.channel)
    out = export_bioimageio(
        ckpt,
        args.bioimageio,
        args.volume,
        name=args.name,
        description=args.description,
        authors=args.author or None,
        license=args.license,
        cite=[parse_cite(text) for text in args.cite] or None,
        tile_shape=args.test_shape,
        check=not args.no_check,
        channel=args.channel,
    )
    checked = "" if args.no_check else " (bioimageio.core test_model: passed)"
    print(f"wrote {out}{checked}")
    return 0


def _say_other_channel(ckpt: Checkpoint, store: Path, channel: int) -> None:
    """One line (stderr) when ``--channel`` is not the channel the checkpoint records its
    run trained on: the package is written as asked (the override is the option's point,
    e.g. a store whose channels are ordered differently), but the user hears of it."""
    import sys

    from napari_finetune.bioimageio.export import trained_channel
    from napari_finetune.io.omezarr import open_volume

    image = open_volume(store, keep_axes=True).input
    trained = trained_channel(ckpt.metadata, image)
    if trained is not None and trained != channel and 0 <= channel < image.channels:
        print(
            f"note: the model was trained on channel {image.describe_channel(trained)}; the "
            f"test tensors come from channel {image.describe_channel(channel)} as --channel "
            "asks",
            file=sys.stderr,
        )


def metadata_update(args: argparse.Namespace) -> dict[str, Any]:
    """``--channel-names`` and ``--normalization`` as a metadata update."""
    update: dict[str, Any] = {}
    if args.channel_names:
        update["channel_names"] = list(args.channel_names)
    if args.normalization:
        try:
            update["normalization"] = json.loads(args.normalization)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"--normalization is not valid JSON ({exc.msg}): {args.normalization}"
            ) from None
    return update


def parse_cite(text: str) -> tuple[str, str]:
    """``"TEXT=DOI_OR_URL"`` -> ``(text, reference)`` (split at the first ``=``)."""
    label, sep, ref = text.partition("=")
    if not sep or not label.strip() or not ref.strip():
        raise ValueError(
            f"--cite {text!r}: expected TEXT=DOI_OR_URL, e.g. 'Doe et al. 2026=10.1234/abc'"
        )
    return label.strip(), ref.strip()
