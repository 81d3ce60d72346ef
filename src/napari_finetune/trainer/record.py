"""The run's record: written with the exported checkpoint, read back on resume.

The record says what the run did (steps, final dtype, batch and accumulation,
what was dropped and at which step, painted voxels, source checkpoint hash,
config) and, under ``"degraded"``, the state a run on the same kind of device
should start from so it does not run out of memory the same way again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.lora import adapted_layers
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.run_state import RunState

if TYPE_CHECKING:
    import torch

    from napari_finetune.data.sampling import PatchSampler
    from napari_finetune.trainer.snapshot import MemoryHistory
    from napari_finetune.trainer.sync import LocalSync
    from napari_finetune.trainer.validation import Validator

RECORD_VERSION = 1


class RecordedRun(Protocol):
    """What the record reads of a run (the Finetuner is one; nothing here imports it)."""

    state: RunState
    config: FinetuneConfig
    precision: Precision
    model: torch.nn.Module
    device: torch.device
    sync: LocalSync
    sampler: PatchSampler | None
    validator: Validator
    memory_history: MemoryHistory
    metadata: dict[str, Any]
    source_sha256: str | None
    ended: str | None

    @property
    def painted_voxels(self) -> int:
        """Painted voxels of the corrections."""
        ...

    @property
    def out_channels(self) -> int:
        """Output channels of the model."""
        ...


def run_record(trainer: RecordedRun) -> dict[str, Any]:
    """Plain-types record of ``trainer``'s run (safe for ``weights_only`` loading)."""
    painted = trainer.painted_voxels if trainer.sampler is not None else None
    state = trainer.state
    check = state.precision_check
    return {
        "record_version": RECORD_VERSION,
        "steps_done": int(state.steps_done),
        "total_steps": int(trainer.config.steps),
        "final_dtype": trainer.precision.dtype_name,
        "grad_scaler": bool(trainer.precision.grad_scaler),
        "mixed_precision": trainer.precision.describe(),
        "fell_back_to_fp32": bool(trainer.precision.fell_back),
        # Steps (0: the probe) non-finite under bf16/fp16 and redone in fp32.
        "bad_mixed_precision_steps": list(trainer.precision.bad_steps),
        # The probe's mixed precision against fp32 (None when not compared).
        "precision_check": None if check is None else check.to_dict(),
        "batch_size": int(state.batch_size),
        "accumulation": int(state.accumulation),
        "samples_per_step": int(state.samples_per_step),  # of one rank
        "samples_per_step_all_ranks": int(state.samples_per_step * trainer.sync.world_size),
        "distillation": state.distillation_switch,
        "hold_other_channels": state.hold_switch,
        "dropped_at_step": state.dropped_at_step,
        "painted_voxels": None if painted is None else int(painted),
        "source_sha256": trainer.source_sha256,
        "final_loss": None if state.last_loss is None else float(state.last_loss),
        "recovery_log": list(state.recovery_log),
        "lora_layers": adapted_layers(trainer.model),
        "device": str(trainer.device),
        # Processes that trained together (each its own samples; rank 0 wrote this).
        "ranks": int(trainer.sync.world_size),
        "environment": environment_record(trainer),
        "memory": memory_record(trainer),
        "config": trainer.config.to_dict(),
        **trainer.validator.record(),
        "degraded": {
            "device_type": trainer.device.type,
            "fell_back_to_fp32": bool(trainer.precision.fell_back),
            "batch_size": int(state.batch_size),
            "distillation_dropped": state.dropped,
        },
    }


def environment_record(trainer: RecordedRun) -> dict[str, Any]:
    """Python, torch and napari-finetune versions, the device and the host of the run."""
    from napari_finetune.trainer.environment import run_environment

    return run_environment(trainer.device)


def memory_record(trainer: RecordedRun) -> dict[str, Any]:
    """What the memory-aware start chose and why, and where the snapshots went."""
    decision = trainer.state.autobatch_decision
    return {
        "autobatch": None if decision is None else decision.to_dict(),
        "memory_snapshots": list(trainer.memory_history.written),
    }


def apply_previous_run(
    state: RunState,
    precision: Precision,
    config: FinetuneConfig,
    run: dict[str, Any] | None,
) -> str:
    """Start from the degraded state a previous run on the same device type ended in.

    The batch never grows above the new config's batch and the samples per
    step stay the new config's; a dropped distillation carries over. fp32 does
    not: a fall-back may have come from a kernel's glitch, so mixed precision
    is probed again rather than inherited (the line says so).
    Settings named in ``config.explicit_settings`` are never overridden, and
    ``config.resume_degraded=False`` resumes nothing.

    Returns
    -------
    str
        A log line describing what was resumed, kept or skipped, or "" when the
        previous run left no degraded state for this device type.
    """
    degraded = (run or {}).get("degraded") or {}
    device_type = precision.device.type
    if not degraded or degraded.get("device_type") != device_type:
        return ""
    explicit = set(config.explicit_settings)
    batch = int(degraded.get("batch_size") or state.batch_size)
    offered = {
        # With autobatch the micro-batch is measured anew at the start: a previous
        # run's batch (possibly autobatch's own choice) is no degradation to resume.
        "batch": batch < state.batch_size and not config.autobatch_on(device_type),
        "distillation": bool(degraded.get("distillation_dropped")) and state.distillation > 0,
        "hold": bool(degraded.get("distillation_dropped")) and state.hold_other_channels,
    }
    reprobe = ""
    if degraded.get("fell_back_to_fp32") and precision.enabled:
        reprobe = (
            f"the previous run ended in fp32; {precision.mixed_words} is probed again "
            "rather than inherited"
        )
    if not any(offered.values()):
        return reprobe
    if not config.resume_degraded:
        what = ", ".join(name for name, on in offered.items() if on)
        return f"the previous run's degraded state ({what}) was not resumed (fresh start)"
    changes: list[str] = []
    kept: list[str] = []

    def resume(part: str, fields: tuple[str, ...]) -> bool:
        if not offered[part]:
            return False
        set_by_user = [name for name in fields if name in explicit]
        kept.extend(f"{name}={getattr(config, name)}" for name in set_by_user)
        return not set_by_user

    if resume("batch", ("batch_size",)):
        state.use_micro_batch(batch)
        changes.append(f"batch {state.batch_size} × accumulation {state.accumulation}")
    if resume("distillation", ("distillation",)):
        state.distillation = 0.0
        state.dropped_at_step = 0
        changes.append("distillation dropped")
    if resume("hold", ("hold_other_channels",)):
        state.hold_other_channels = False
        state.dropped_at_step = 0
        changes.append("hold on the other channels dropped")
    line = "resumed the previous run's degraded state: " + (", ".join(changes) or "nothing")
    if kept:
        line += f"; kept {' and '.join(kept)} as set"
    return f"{line}; {reprobe}" if reprobe else line


def export_checkpoint(
    trainer: RecordedRun, path: str | os.PathLike, ended: str | None = None,
    metadata_updates: Mapping[str, Any] | None = None,
) -> Path:
    """Merge the adapters into a copy and save it with the record, atomically;
    ``metadata_updates`` replace those entries of the checkpoint's metadata."""
    return write_export(trainer.model, trainer.metadata, trainer.out_channels,
                        run_record(trainer), path, ended or trainer.ended, metadata_updates)


def write_export(
    model: torch.nn.Module, metadata: Mapping[str, Any], out_channels: int,
    run: dict[str, Any], path: str | os.PathLike, ended: str | None = None,
    metadata_updates: Mapping[str, Any] | None = None,
) -> Path:
    """Save ``model`` (adapters merged into a copy) with the run record ``run``, atomically.

    The record may come from this process's run or from a run elsewhere (a
    remote worker's, received with its weights). ``ended`` defaults to
    ``"finished"`` when the record's steps are all done, else ``"stopped after
    step N"``.
    """
    from napari_finetune.model.checkpoint import (
        DEFAULT_NORMALIZATION,
        architecture_of,
        channel_names_of,
        save_checkpoint,
    )
    from napari_finetune.model.lora import merged_copy

    plain = merged_copy(model)
    from napari_finetune.model.add_channel import STARTING_CHANNELS_KEY

    metadata = {**metadata, **(metadata_updates or {})}
    # The exported model is the next run's teacher, for every channel it has.
    metadata.pop(STARTING_CHANNELS_KEY, None)
    metadata["channel_names"] = channel_names_of(metadata, out_channels)
    metadata["normalization"] = dict(metadata.get("normalization") or DEFAULT_NORMALIZATION)
    previous = metadata.get("run")
    metadata["run"] = dict(run)
    if ended is None:
        done, total = int(run["steps_done"]), int(run["total_steps"])
        ended = "finished" if done >= total else f"stopped after step {done}"
    metadata["run"]["ended"] = ended
    if previous:
        metadata["run"]["previous_run"] = {
            k: v for k, v in previous.items() if k not in ("previous_run", "recovery_log")
        }
    return save_checkpoint(path, plain, metadata, architecture=architecture_of(plain))
