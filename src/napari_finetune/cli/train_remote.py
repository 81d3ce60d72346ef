"""``napari-finetune train --scheduler ADDRESS``: the same run on a dask worker (a GPU server).

The run is a :class:`~napari_finetune.remote.finetuner.RemoteFinetuner`, driven
by :func:`~napari_finetune.cli.run.run_finetune` as a local one is: the status
lines, Ctrl-C (stops the worker after its step), and the export of the last
weights received, also when the worker is lost mid-run. ``--tls-*`` give dask's
own TLS (``distributed.Security``); dask ships pickled functions, so the
cluster must be yours. ``--attach RUN_ID`` follows a run whose client went away
(a laptop that slept, a terminal closed) and exports its weights as that
client would have.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Security


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--scheduler`` and the TLS files."""
    group = parser.add_argument_group(
        "on a GPU server (dask.distributed; the cluster must be yours: dask runs pickled code)"
    )
    group.add_argument(
        "--scheduler", metavar="ADDRESS",
        help="train on a worker of this dask scheduler (e.g. tcp://gpu-server:8786 or "
        "tls://...); with --device cuda a worker started with --resources GPU=1 is asked for. "
        "The checkpoint, the painting and the image around it are sent; the weights come back",
    )
    group.add_argument(
        "--attach", metavar="RUN_ID",
        help="re-attach to the run RUN_ID on --scheduler, whose client went away (the id is "
        "in the run's first line, and in the line that says the scheduler was lost): follow "
        "it to its end and export its weights to --out as this command would; give the "
        "command that started it (same store, checkpoint and settings)",
    )
    group.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate of the cluster (TLS)")
    group.add_argument("--tls-cert", metavar="PEM", help="this client's certificate (TLS)")
    group.add_argument("--tls-key", metavar="PEM", help="this client's private key (TLS)")


def check_options(args: argparse.Namespace) -> None:
    """One line (a UsageError) when ``--attach`` comes without ``--scheduler``."""
    if args.attach is not None and args.scheduler is None:
        from napari_finetune.cli import UsageError

        raise UsageError(f"--attach {args.attach} re-attaches to a run on a dask scheduler; "
                         "give its --scheduler ADDRESS too.")


def security(args: argparse.Namespace) -> Security | None:
    """dask's ``Security`` from the ``--tls-*`` files (None: dask's configuration decides).

    Called before the run connects: a plain ``tcp://`` address of another machine
    is said first, in one line on stderr (what travels in the clear, how to use TLS).
    """
    from napari_finetune.remote.preflight import unencrypted_line

    if args.scheduler is not None and (line := unencrypted_line(args.scheduler)):
        print(f"warning: {line}", file=sys.stderr)
    files = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if not any(files):
        return None
    if not all(files):
        from napari_finetune.cli import UsageError

        raise UsageError("--tls-ca-file, --tls-cert and --tls-key go together; give all three.")
    from napari_finetune.remote.preflight import tls_security

    return tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
