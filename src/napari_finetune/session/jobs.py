"""The jobs of the widget and the Session, run off the main thread by a runner.

The widget runs them in napari's thread worker (``napari_finetune._qt.worker``),
a :class:`~napari_finetune.session.session.Session` through its runner
(:mod:`napari_finetune.session.runner`).

Every heavy object (checkpoint, model, trainer) is built inside the job, in
the worker thread: a click never waits for it. Each job yields typed events
and returns its result.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from napari_finetune.arrays import AxesImage
from napari_finetune.errors import one_line
from napari_finetune.session.events import (
    Placement,
    Preview,
    PreviewFailed,
    Progress,
    RegionPredicted,
    RunStatus,
    Saved,
    TrainerReady,
)
from napari_finetune.session.work import Job, core_left_for_the_ui, with_progress

if TYPE_CHECKING:
    from torch import nn

    from napari_finetune.arrays import VolumeArray
    from napari_finetune.bioimageio.export import ExportsCheckpoint
    from napari_finetune.config import FinetuneConfig
    from napari_finetune.objects import ChannelRole
    from napari_finetune.remote.finetuner import RemoteFinetuner
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.status import Status

logger = logging.getLogger(__name__)


def warm_up_job(lora: bool) -> Job[None]:
    """Import the engine in the background while the user looks and paints; PEFT too
    (with transformers: 1.2 s of CPU measured in a napari process that docks and closes,
    and their memory) only when ``lora``: the default full fine-tune never imports it.

    An import holds the GIL in bursts (~250 ms UI stalls measured), so it is
    better paid here, once, than between the Fine-tune click and the first step;
    and not in the dock's constructor either, where torch and the first AdamW
    (which imports torch._dynamo) froze napari 2.4-2.7 s before the panel showed.
    """
    from napari_finetune.session.heap import no_full_collections

    # Full collections would walk the half-imported modules again and again (session/heap).
    with no_full_collections():
        import torch

        import napari_finetune.model.lora  # noqa: F401
        import napari_finetune.trainer.loop  # noqa: F401

        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-4)

        if lora:
            try:
                import peft  # noqa: F401
            except ImportError:  # a broken PEFT install is the run's error, not the warm-up's
                pass
    yield from ()


def model_to_predict(
    checkpoint_path: str, image: VolumeArray | AxesImage, channel_count: int | None,
    model: nn.Module | None = None, normalization: dict | None = None,
    trust: Sequence[str] = (),
) -> tuple[nn.Module, tuple[float, float] | list[tuple[float, float]], int]:
    """(model, intensity range of ``image`` (one per channel of an image with channels),
    channels): the given model (a fine-tuned one, with the checkpoint's normalisation; a
    LoRA one as a merged copy) or the checkpoint's, loaded here in the worker."""
    from napari_finetune.data.normalization import image_range
    from napari_finetune.model.checkpoint_format import DEFAULT_NORMALIZATION
    from napari_finetune.model.lora import merged_to_predict

    if model is None:
        from napari_finetune.loading import load_checkpoint

        ckpt = load_checkpoint(checkpoint_path, trust=tuple(trust))
        model, normalization = ckpt.model, ckpt.normalization
        channel_count = len(ckpt.channel_names)
    elif channel_count is None:  # a model without its names: as many as it outputs
        from napari_finetune.model.geometry import model_geometry

        spatial = AxesImage.of(image).spatial_shape
        channel_count = model_geometry(model, len(spatial)).out_channels
    # Unmerged, every adapted layer runs twice (its base and its adapter): 2.1 -> 5.5 s
    # a 16 x 256 x 256 forward pass. A merged copy predicts the same; the training model
    # keeps its adapters (a next run or an export goes on from them).
    model = merged_to_predict(model)
    # A model's run without a saved normalisation trained with the default one.
    return model, image_range(image, normalization or DEFAULT_NORMALIZATION), channel_count


@dataclasses.dataclass
class Prediction:
    """A whole-volume prediction: one uint8 mask per channel (1 where prob > 0.5) and the
    float32 probability of the channels asked for, by channel index. ``complete`` is
    False when it was stopped: the blocks done are kept, the others are 0."""

    masks: list[np.ndarray]
    probabilities: dict[int, np.ndarray]
    complete: bool = True


VIEW_TILE = 128
"""The side of the tiles the view is predicted in (voxels, on each axis wider than it).

The view (a slice, 256 x 256 on screen) in one model call showed 2.7-4.6 s after Stop
(the sample, one torch thread); its centre tile of 128 x 128, read 16 x 160 x 160 with
the halo, is 0.7 s at load 10, and the nine tiles together cost about the one call.
"""


def predict_job(
    checkpoint_path: str, image: VolumeArray | AxesImage, channel_count: int | None,
    device: str, model: nn.Module | None = None, normalization: dict | None = None,
    trust: Sequence[str] = (),
    keep: Sequence[int] = (),
    first: tuple[slice, ...] | None = None,
    stop: Callable[[], bool] | None = None,
    view_tile: int = VIEW_TILE,
) -> Job[Prediction]:
    """Whole-volume prediction, blockwise: one uint8 mask per channel, and the probability
    of the channels in ``keep`` (indices; the ones with an instance role); ``model`` (a
    fine-tuned one) skips loading.

    With ``first`` (the region in view) that region is predicted first, on its own
    (read with the blocks' halo around it), and :class:`RegionPredicted` says so: the
    user sees it in about a second, where the whole of a real crop takes a minute.
    A region wider than ``view_tile`` is predicted in tiles (:func:`view_tiles`), its
    centre first, one :class:`RegionPredicted` per tile as it lands. The blocks then left
    are those not wholly inside it. ``stop`` is asked between tiles, batches and the
    model's layers: True ends the job there with what was predicted (``complete``
    False); a tile it cut is not announced.
    """
    from napari_finetune.config import PredictConfig
    from napari_finetune.predict import MaskAndProbability, predict_volume

    model, low_high, channel_count = model_to_predict(
        checkpoint_path, image, channel_count, model, normalization, trust
    )
    # Channels and time points (an AxesImage): masks have the axes without channels.
    shape = AxesImage.of(image).labels_shape
    masks = [np.zeros(shape, dtype=np.uint8) for _ in range(channel_count or 1)]
    targets: list[Any] = [
        MaskAndProbability(mask, np.zeros(shape, np.float32)) if i in keep else mask
        for i, mask in enumerate(masks)
    ]
    config = PredictConfig(device=device)
    stopped = stop if stop is not None else (lambda: False)
    axes_image = AxesImage.of(image)
    # The region in view first on a plain volume (one channel, one time point); a
    # volume with channels or time points is predicted whole, time point by time point.
    plain = axes_image.is_plain and isinstance(low_high, tuple)
    region = _within(first, shape) if first is not None and plain else None
    offset = 0  # the blocks of the region's own passes, counted before the rest
    with core_left_for_the_ui():
        if region is not None and isinstance(low_high, tuple):
            tiles = view_tiles(region, view_tile)
            for tile in tiles:
                if stopped():
                    break
                offset += yield from _predict_region(
                    model, axes_image.array, low_high, config, targets, tile, stopped,
                    counted=(offset, len(tiles)))
                if not stopped():  # a tile cut short is not shown as predicted
                    yield RegionPredicted(tile, masks)
        if not stopped():
            yield from with_progress(
                lambda progress: predict_volume(
                    model, image, low_high, config, out=targets,
                    progress=lambda d, t: progress(offset + d, offset + t),
                    skip=region, stop=stopped),
                "predict",
            )
    return Prediction(masks, {i: t.probability for i, t in enumerate(targets)
                              if isinstance(t, MaskAndProbability)},
                      complete=not stopped())


def _within(region: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...] | None:
    """``region`` clipped to ``shape`` as plain slices (None when empty or of another rank)."""
    if len(region) != len(shape):
        return None
    clipped = tuple(slice(*r.indices(n)[:2]) for r, n in zip(region, shape, strict=True))
    return clipped if all(c.stop > c.start for c in clipped) else None


def view_tiles(region: tuple[slice, ...], tile: int = VIEW_TILE) -> list[tuple[slice, ...]]:
    """``region`` (plain slices) cut into tiles of at most ``tile`` per axis, the one at its
    centre first, then the others by their distance from it: the user looks at the centre
    of the canvas, where the view's centre is (:func:`~napari_finetune._qt.layers.visible_region`).

    On each axis wider than ``tile`` a piece of ``tile`` is centred and the sides are cut
    outwards from it; a region no wider than ``tile`` is one tile.
    """
    import itertools

    def pieces(axis: slice) -> list[tuple[int, int]]:
        lo, hi = int(axis.start), int(axis.stop)
        if hi - lo <= tile:
            return [(lo, hi)]
        start = (lo + hi - tile) // 2
        cuts = [start, start + tile]
        while cuts[0] > lo:
            cuts.insert(0, max(lo, cuts[0] - tile))
        while cuts[-1] < hi:
            cuts.append(min(hi, cuts[-1] + tile))
        return list(itertools.pairwise(cuts))

    centre = [(r.start + r.stop) / 2 for r in region]
    tiles = [tuple(slice(a, b) for a, b in box)
             for box in itertools.product(*(pieces(r) for r in region))]
    return sorted(tiles, key=lambda t: sum(((s.start + s.stop) / 2 - c) ** 2
                                           for s, c in zip(t, centre, strict=True)))


def _predict_region(
    model: nn.Module, image: VolumeArray, low_high: tuple[float, float], config: Any,
    targets: list[Any], region: tuple[slice, ...], stop: Callable[[], bool] | None = None,
    counted: tuple[int, int] | None = None,
) -> Job[int]:
    """Predict ``region`` alone into ``targets``: read with the halo around it (clipped to
    the image), its core written; the number of blocks it took. ``stop`` as
    :func:`~napari_finetune.predict.predict_volume`'s (what was not predicted stays 0).
    ``counted``: (blocks before, tiles in all) of the view's tiles, for one progress over
    them (a tile is one model call as a rule); None: this region's own blocks.

    A read no bigger than one block with its halo is one model call: cut into the
    configured blocks, a 256 x 256 slice in view was four blocks, each with its own halo.
    """
    from napari_finetune.predict import MaskAndProbability, predict_volume
    from napari_finetune.predict.volume import spatial_config, spatial_multiple

    shape = tuple(int(s) for s in image.shape)
    halo = tuple(config.halo[-len(shape):])
    multiple = spatial_multiple(model, len(shape))
    read = tuple(_with_context(r, h, m, n)
                 for r, h, m, n in zip(region, halo, multiple, shape, strict=True))
    inner = tuple(slice(r.start - g.start, r.stop - g.start)
                  for r, g in zip(region, read, strict=True))
    part = np.asarray(image[read])
    block, block_halo = spatial_config(config, len(shape))
    if part.size <= np.prod([b + 2 * h for b, h in zip(block, block_halo, strict=True)]):
        config = dataclasses.replace(config, block_shape=tuple(part.shape),
                                     halo=(0,) * len(shape))
    local: list[Any] = [
        MaskAndProbability(np.zeros(part.shape, np.uint8), np.zeros(part.shape, np.float32))
        if isinstance(t, MaskAndProbability) else np.zeros(part.shape, np.uint8)
        for t in targets
    ]
    count = {"total": 0}

    def run(progress: Callable[[int, int], None]) -> Any:
        def seen(done: int, total: int) -> None:
            count["total"] = total
            if counted is None:
                progress(done, total)
            else:  # the tiles so far and this one's share, over the tiles' count
                before, tiles = counted
                progress(before + done, max(tiles, before + total))

        return predict_volume(model, part, low_high, config, out=local, progress=seen,
                              stop=stop)

    yield from with_progress(run, "predict")
    for target, got in zip(targets, local, strict=True):
        if isinstance(target, MaskAndProbability):
            target.mask[region] = got.mask[inner]
            target.probability[region] = got.probability[inner]
        else:
            target[region] = got[inner]
    return count["total"]


def _with_context(region: slice, halo: int, multiple: int, size: int) -> slice:
    """``region`` of one axis read with ``halo`` on each side (clipped to ``size``), its
    length cut down to the model's ``multiple`` where that still covers ``region``: the
    model pads a read up to it (a slice with a halo of 8, 17 voxels, costs 24 as it is,
    16 with one voxel less of context on the far side)."""
    lo, hi = max(0, region.start - halo), region.stop + halo
    down = (hi - lo) // multiple * multiple
    if down > 0 and lo + down >= region.stop:
        hi = lo + down
    return slice(lo, min(size, hi))


def train_job(
    checkpoint_path: str, image: VolumeArray, corrections: np.ndarray, store_path: str | None,
    channel_names: Sequence[str], config: FinetuneConfig, preview_interval_s: float,
    region: Callable[[], tuple[slice, ...] | None], trust: Sequence[str] = (),
    snapshot: int | None = None, channel_colors: Sequence[str] = (),
    scheduler: str | None = None, tls_files: tuple[str, str, str] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Job[None]:
    """Save the corrections, build model and trainer here, run, yield previews between steps.

    With ``scheduler`` (a dask scheduler's address; ``tls_files``: CA, certificate
    and key for TLS) the run happens on its worker
    (:class:`~napari_finetune.remote.finetuner.RemoteFinetuner`): the same
    events come here, and the weights come back.

    The first preview comes after the first optimizer step (the user sees the
    model move at once), then every ``preview_interval_s`` seconds (0: never).
    ``worker.quit()`` ends the run at its next event: every event comes after
    a whole optimizer step or a recovery, so the weights are those of the
    last completed step. ``stop`` (the front end's Stop, asked) cuts a preview at its
    model's next layer: the run then ends at once, without it.
    """
    if store_path:
        from napari_finetune.session.saving import save_corrections_locked

        # Before anything can fail; ``snapshot`` keeps a later, newer save from being undone.
        written = save_corrections_locked(store_path, corrections, channel_names, snapshot,
                                          channel_colors)
        yield Saved(written)
    with core_left_for_the_ui():  # from the build to the end of the run, whatever else runs
        yield from _build_and_run(checkpoint_path, image, corrections, config,
                                  preview_interval_s, region, trust, scheduler, tls_files,
                                  store_path, stop)


def with_store_voxel_size(config: FinetuneConfig, store_path: str) -> FinetuneConfig:
    """``config`` with the voxel size of the store's NGFF scale (None when it says none, or
    when the store cannot be read: the run trains the image in memory all the same).

    The store's channels and time points are kept (``keep_axes``): the panel works on
    them, and the voxel size is of the spatial axes alone (a ``tzyx`` scale
    ``(1, 2, 0.5, 0.5)`` gives ``(2, 0.5, 0.5)``).
    """
    from napari_finetune.io.volume import open_volume

    try:
        voxel_size = open_volume(store_path, keep_axes=True).voxel_size
    except (OSError, ValueError) as exc:
        logger.warning("voxel size of %s unknown: %s", store_path, exc)
        return config
    return dataclasses.replace(config, voxel_size=voxel_size)


def _build_and_run(
    checkpoint_path: str, image: VolumeArray, corrections: np.ndarray, config: FinetuneConfig,
    preview_interval_s: float, region: Callable[[], tuple[slice, ...] | None],
    trust: Sequence[str], scheduler: str | None, tls_files: tuple[str, str, str] | None,
    store_path: str | None, stop: Callable[[], bool] | None = None,
) -> Job[None]:
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.checkpoint import with_channel_recorded
    from napari_finetune.testing import build_hooks
    from napari_finetune.trainer.loop import Finetuner

    ckpt = load_checkpoint(checkpoint_path, trust=tuple(trust))  # as the user answered
    # The channel the panel's Channel row chose, recorded as ``train --channel`` records
    # it: a store without channel names says which only by it.
    ckpt = with_channel_recorded(ckpt, AxesImage.of(image).channel_taken)
    if store_path and config.voxel_size is None:  # read here, in the job's thread, not the UI's
        config = with_store_voxel_size(config, store_path)
    for hook in build_hooks.model:
        hook(ckpt.model)  # fault injection of the tests and the benchmark
    trainer: Finetuner
    remote: RemoteFinetuner | None = None
    if scheduler is None:
        trainer = Finetuner.from_checkpoint(ckpt, image, corrections, config)
    else:
        from napari_finetune.remote.finetuner import RemoteFinetuner
        from napari_finetune.remote.preflight import tls_security

        trainer = remote = RemoteFinetuner.remote(
            ckpt, image, corrections, config, scheduler, trust=tuple(trust),
            security=tls_security(*tls_files) if tls_files is not None else None,
            store_path=store_path)
    del ckpt
    trainer.after_build.extend(build_hooks.trainer)  # e.g. an OOM in the teacher
    yield TrainerReady(trainer)
    run = trainer.run()
    try:
        yield from _with_previews(trainer, run, preview_interval_s, region, remote, stop)
    finally:
        # However the run ended (a quit() included), close the run here, in this thread
        # (its sample feed), and give back the optimizer state and the teacher; the
        # weights stay for Export and Predict.
        run.close()
        if remote is not None and store_path:  # cut short: its weights kept beside the store
            remote.keep_beside(store_path)
        trainer.release()


def _with_previews(
    trainer: Finetuner, run: Iterator[Status], interval_s: float,
    region: Callable[[], tuple[slice, ...] | None], remote: RemoteFinetuner | None,
    stop: Callable[[], bool] | None = None,
) -> Job[None]:
    """The run's statuses and, after a step when one is due, the region on screen's
    probabilities: predicted here between two steps, or (``remote``) asked of the worker,
    which answers after its next step, and shown as the answer comes back. ``stop``
    True cuts a preview here at its model's next layer (none is shown)."""
    last: float | None = None
    placement: str | None = None
    for status in run:
        yield RunStatus(status)
        # Set before the status that says it (queued, then placed): a front end's label.
        if remote is not None and remote.placement is not None \
                and remote.placement != placement:
            placement = remote.placement
            yield Placement(placement)
        if interval_s > 0 and status.kind == "step" and _due(last, interval_s):
            where = region()
            if where is not None and remote is not None:
                remote.request_preview(where)
            elif where is not None:
                try:
                    # A preview is most of a step's time on a loaded CPU (the walk: 8.5 s
                    # from Stop to the run's end); Stop does not wait for it.
                    probs = preview_probs(trainer, where, stop)
                    yield Preview(where, probs)
                except Exception as exc:  # a view of the run, not part of it: it goes on
                    if stop is None or not stop():  # else cut by Stop: nothing to say
                        yield PreviewFailed(one_line(exc))
            last = time.monotonic()
        if remote is not None and (failed := remote.take_preview_failure()) is not None:
            yield PreviewFailed(failed)
        if remote is not None and (preview := remote.take_preview()) is not None:
            yield Preview(*preview)


def preview_probs(
    trainer: Finetuner, where: tuple[slice, ...], stop: Callable[[], bool] | None = None,
) -> np.ndarray:
    """``trainer.predict(where)`` between two steps; a LoRA model's through a merged copy
    (unmerged, each adapted layer runs twice: a preview was 2.6x as dear). ``stop`` True
    cuts it at the model's next layer."""
    from napari_finetune.data.normalization import normalize
    from napari_finetune.model.lora import is_lora, merged_to_predict
    from napari_finetune.predict import predict_block
    from napari_finetune.predict.volume import stop_between_layers

    if not is_lora(trainer.model) or not trainer.axes_image.is_plain:
        with stop_between_layers(trainer.model, stop):
            return np.asarray(trainer.predict(where))
    # As Finetuner.predict reads a plain image's region: through the run's in-memory
    # region when it holds it, normalised like the training patches.
    sampler = trainer.sampler
    region = trainer.image[where] if sampler is None else sampler.read_image(where)
    block = normalize(np.asarray(region), *trainer.normalization_range)
    with trainer.lock:  # the weights as they are between these two steps
        merged = merged_to_predict(trainer.model)
    with stop_between_layers(merged, stop):
        return np.asarray(predict_block(merged, block, device=str(trainer.device)))


def _due(last: float | None, interval_s: float) -> bool:
    """Whether a preview is due: the first after the first step, then every ``interval_s``."""
    return last is None or time.monotonic() - last >= interval_s


def export_job(
    trainer: Finetuner, path: str, roles: dict[str, ChannelRole] | None = None,
    sources: Mapping[str, Mapping[str, str]] | None = None,
) -> Job[str]:
    """``trainer.export(path)`` off the main thread, with ``roles`` (every channel's, as
    the widget's editor holds them) as the file's instance roles and ``sources`` where
    their values came from; returns where it was written."""
    yield from ()
    metadata = None
    if roles:
        from napari_finetune.objects import roles_to_metadata

        metadata = roles_to_metadata(roles, {}, sources)
    return str(trainer.export(path, metadata=metadata))


def bioimageio_job(
    source: ExportsCheckpoint | str, out_path: str, volume: VolumeArray,
    trust: Sequence[str] = (), roles: dict[str, ChannelRole] | None = None,
) -> Job[str]:
    """Write (and test, with bioimage.io's own checks) a model package off the main thread.

    ``source`` is the trainer after a run (its current weights) or the
    checkpoint's path; test tensors are cut from ``volume``. ``roles`` (every
    channel's, as the widget's editor holds them) replace the source's instance
    roles in the package; None keeps the source's. Returns where it was written.
    """
    from napari_finetune.bioimageio.export import export_bioimageio
    from napari_finetune.objects import roles_to_metadata

    yield Progress(0, 1, "bioimage.io package")
    metadata = None if roles is None else roles_to_metadata(roles, {})
    with core_left_for_the_ui():
        path = export_bioimageio(source, out_path, volume, trust=tuple(trust) or None,
                                 metadata=metadata)
    return str(path)


def save_predictions_job(
    store_path: str, arrays: Sequence[tuple[str, str, np.ndarray]],
    objects: Sequence[tuple[str, np.ndarray]] = (),
) -> Job[list[str]]:
    """Write each ``(channel, colour, mask)`` into ``<store>/labels/prediction-<channel>``
    with its colour and class name, and each ``(channel, uint32 ids)`` into
    ``labels/objects-<channel>``; returns the names written.

    As ``napari-finetune predict --instances`` does: every image is written
    whole, every level, in a staging folder, and all are swapped in together
    after the last one is complete, so a failure (full disk, an error) leaves
    the store's previous labels, none half written and none of a mixed save.
    """
    from contextlib import ExitStack

    import zarr

    from napari_finetune.io.labels import create_labels_array, prediction_metadata
    from napari_finetune.io.pyramid import fill_pyramid, write_level0
    from napari_finetune.io.staging import staged_replace
    from napari_finetune.io.volume import open_volume
    from napari_finetune.predict.store import objects_names

    # The image group, as the CLI stages into; a store with channels or time points is
    # opened with its axes (its labels carry them), not refused as one ZYX volume.
    store = open_volume(store_path, keep_axes=True).path
    channels = [channel for channel, _ in objects]
    Metadata = tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]
    items: list[tuple[str, np.ndarray, npt.DTypeLike, Metadata]] = [
        (f"prediction-{channel}", array, np.uint8, prediction_metadata(channel, color))
        for channel, color, array in arrays]
    items += [(name, array, np.uint32, (None, None))
              for name, (_, array) in zip(objects_names("prediction", channels), objects,
                                          strict=True)]
    with ExitStack() as stack:  # left in reverse order: every swap after the last write
        for i, (name, array, dtype, (colors, properties)) in enumerate(items):
            staging = stack.enter_context(staged_replace(store, name))
            level0 = create_labels_array(store_path, name, tuple(array.shape), dtype,
                                         colors=colors, properties=properties,
                                         staging=staging)
            write_level0(level0, array)
            fill_pyramid(zarr.open_group(str(staging / "labels" / name), mode="r+"))
            yield Progress(i + 1, len(items), "save predictions")
    return [name for name, *_ in items]
