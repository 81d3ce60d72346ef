"""Prediction: probabilities from a model, in memory or into a store, on one machine or many.

The modules, each one job:

- :mod:`~napari_finetune.predict.volume`: blockwise prediction with a halo, in memory
  bounded by the block (the widget's, the trainer's and the exporters' prediction);
- :mod:`~napari_finetune.predict.tiling`: every cut of a volume (cores, reads with halo,
  regions, chunk alignment);
- :mod:`~napari_finetune.predict.regions`: output regions and the step down to smaller
  blocks when memory runs out;
- :mod:`~napari_finetune.predict.store`: prediction into an OME-Zarr store's ``labels/``;
- :mod:`~napari_finetune.predict.job`, :mod:`~napari_finetune.predict.tasks`,
  :mod:`~napari_finetune.predict.distributed`: the same prediction on dask.distributed,
  resumable (the job folder, the worker side, the client side).

The names callers take from ``napari_finetune.predict`` are those of ``volume``, and only
those: importing the package costs what importing ``volume`` costs (no zarr, no dask), so
the engine still runs where neither is installed.
"""

from napari_finetune.predict.volume import (
    MaskAndProbability,
    PendingProbs,
    Progress,
    axis_cores,
    block_grid,
    inference_mode,
    launch_batch,
    predict_block,
    predict_volume,
    spatial_multiple,
)

__all__ = [
    "MaskAndProbability",
    "PendingProbs",
    "Progress",
    "axis_cores",
    "block_grid",
    "inference_mode",
    "launch_batch",
    "predict_block",
    "predict_volume",
    "spatial_multiple",
]
