"""``napari-finetune``: the command line (demo, train, predict, export, info).

Only argparse and the config dataclasses are imported here, so ``--help`` is
instant; torch, PEFT, zarr and matplotlib are imported by the subcommand that
needs them. Expected failures (a bad path, a corrupt checkpoint, a wrong
option) end with one line on stderr and exit code 1, bad usage with exit code
2 (argparse), Ctrl-C with exit code 130; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from napari_finetune import __version__
from napari_finetune.errors import first_line

PROG = "napari-finetune"


class CLIError(Exception):
    """An error the user can fix; its message is printed as is."""


class UsageError(CLIError):
    """A wrong or missing option found after parsing: one line, exit code 2 as argparse's."""


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand registered."""
    from napari_finetune.cli import commands, demo

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Correct a pretrained segmentation UNet on your own volume.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo.register(sub)
    commands.register(sub)
    return parser


def _expected_errors() -> tuple[type[BaseException], ...]:
    # ValueError covers CheckpointError and VolumeError (both subclass it);
    # OSError covers missing files, permissions, a full disk.
    return (CLIError, ValueError, OSError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 1 on an error, 2 on bad usage, 130 on Ctrl-C.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0)
    # What was typed, for a command that runs itself again (train --nproc under torchrun).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except _expected_errors() as exc:
        message = first_line(exc)
        if isinstance(exc, OSError) and exc.filename and exc.strerror:
            message = f"{exc.strerror}: {exc.filename}"
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
