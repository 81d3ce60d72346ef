"""The 'Paint here next' and 'Export as bioimage.io model…' buttons.

Both start a job (``actions.run_job``) and handle its events here; the slow
parts (predicting the volume, writing and testing a package) run in workers.
"""

from __future__ import annotations

from typing import Any

from napari.utils.notifications import show_info

from napari_finetune._qt import corrections as corr
from napari_finetune._qt import share, suggest


def _weights_key(w: Any) -> tuple:
    """Which weights an uncertainty map belongs to (a new run or checkpoint: a new map)."""
    s = w.state
    if s.trainer is not None:
        return ("trainer", id(s.trainer), s.trainer.steps_done)
    return ("checkpoint", s.info.path if s.info else None)


def paint_here_next(w: Any) -> None:
    """Predict the uncertainty (once per set of weights), then suggest the next region."""
    from napari_finetune._qt.actions import run_job

    s, layer = w.state, w.image_combo.layer()
    if layer is None or s.info is None or s.busy is not None:
        return
    key = _weights_key(w)
    if s.uncertainty is not None and s.uncertainty_key == key:
        _suggest(w)
        return
    s.uncertainty, s.uncertainty_key, s.suggested = None, key, []
    model = s.trainer.model if s.trainer is not None else None
    run_job(w, "predict", suggest.uncertainty_job, s.info.path, corr.image_level0(layer),
            len(s.info.channel_names), w.settings.device.currentText(), model=model,
            normalization=s.info.normalization, trust=s.info.trust,
            what="Computing the uncertainty failed")


def _suggest(w: Any) -> None:
    from napari_finetune._qt.actions import run_job

    s = w.state
    painted = w.corrections_combo.layer()
    corrections = None if painted is None else painted.data
    # Half a training patch: a region a few strokes cover, and a patch's context around it.
    patch = w.settings.config().patch_shape[-s.uncertainty.ndim:]
    region = tuple(max(1, p // 2) for p in patch)
    run_job(w, None, suggest.suggest_job, s.uncertainty, corrections, region,
            list(s.suggested), what="Suggesting a region failed")


def export_bioimageio(w: Any, path: str) -> None:
    """Write a bioimage.io package of the fine-tuned weights (or the checkpoint's)."""
    from napari_finetune._qt.actions import run_job

    s, layer = w.state, w.image_combo.layer()
    if layer is None or s.info is None or s.busy is not None:
        return
    source = s.trainer if s.trainer is not None else s.info.path
    run_job(w, "export", share.bioimageio_job, source, path, corr.image_level0(layer),
            trust=s.info.trust, what="bioimage.io export failed")


def handle_event(w: Any, event: tuple) -> None:
    """Main-thread side of the 'uncertainty', 'suggestion' and 'packaged' events."""
    s, kind = w.state, event[0]
    if kind == "uncertainty":
        s.uncertainty = event[1]
        suggest.show_uncertainty(w.viewer, w.image_combo.layer(), event[1])
        w.status_panel.set_idle("uncertainty updated")
        _suggest(w)
    elif kind == "suggestion":
        suggestion = event[1]
        w.status_panel.append_log(suggest.describe(suggestion))
        if suggestion is not None:
            s.suggested.append(suggestion.box)
            suggest.go_to(w.viewer, w.image_combo.layer(), suggestion)
    elif kind == "packaged":
        w.output_label.setText(f"bioimage.io package written to {event[1]}")
        w.output_label.setToolTip(event[1])
        show_info(f"bioimage.io model package written to {event[1]} (bioimage.io tests passed)")
