"""A kept checkpoint beside a store, as a remote run cut short writes it (no cluster needed)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import torch

from napari_finetune.remote.kept import KEPT_KEY, kept_path, kept_stamp

WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)


def write_kept(store, checkpoint, steps_done: int = 3, total_steps: int = 10,
               for_store=None) -> tuple[Path, dict[str, torch.Tensor]]:
    """Write ``checkpoint``'s model, its weights moved, with a run record of ``steps_done``
    of ``total_steps`` and the stamp of ``for_store`` (``store`` by default) beside
    ``store``; the path and the weights written."""
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.trainer import record

    ckpt = load_checkpoint(checkpoint)
    with torch.no_grad():
        for parameter in ckpt.model.parameters():
            parameter.add_(0.25)  # not the checkpoint's weights: a load of them shows
    run = {"steps_done": steps_done, "total_steps": total_steps, "worker": "tcp://10.0.0.7:4000"}
    path = record.write_export(
        ckpt.model, ckpt.metadata, len(ckpt.channel_names), run, kept_path(store),
        metadata_updates={KEPT_KEY: kept_stamp(for_store or store, "run-1", WHEN)})
    return Path(path), {k: v.clone() for k, v in ckpt.model.state_dict().items()}
