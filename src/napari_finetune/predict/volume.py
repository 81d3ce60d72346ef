"""Blockwise prediction with a halo, in memory bounded by the block.

A volume is cut into core blocks (``PredictConfig.block_shape``). Each block is
read with a halo of context on every side (``PredictConfig.halo``), widened so
the read starts and ends on the model's pooling grid (per axis: the model's
``shape_multiple``, an architecture adapter's, or one found by forward passes;
:mod:`napari_finetune.model.geometry`),
normalised, passed through the model, and only the core is written out. The
image is read block by block with slicing (numpy, zarr or dask), never whole.

Exactness: with a model whose output at a voxel depends only on its receptive
field (``norm="none"``, or BatchNorm in eval mode), the result equals one call
on the whole volume when the halo covers the receptive field: reads are aligned
to the pooling grid and the borders are padded the same way in both cases.
GroupNorm and InstanceNorm normalise over the whole input, so a block's output
also depends on its content: blockwise results differ slightly from one call
(0.2-0.6 % of decisions on the sample, docs/benchmarks.md); bigger blocks help.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import numpy as np

from napari_finetune.arrays import (
    ArrayTarget,
    AxesImage,
    AxisTaken,
    Index,
    Targets,
    VolumeArray,
    WritableVolume,
)
from napari_finetune.config import PredictConfig
from napari_finetune.data.normalization import (
    background_where_missing,
    missing_mask,
    normalize,
    normalize_channels,
)
from napari_finetune.devices import check_model_fits_image, on_device, resolve_device

# The tiling lives in predict.tiling; these names stay importable from here.
from napari_finetune.predict.tiling import axis_cores as axis_cores
from napari_finetune.predict.tiling import block_grid

if TYPE_CHECKING:  # torch is imported when a model runs (importing predict stays light)
    import torch

Progress = Callable[[int, int], None]
# A probability target: MaskAndProbability keeps its type (numpy or zarr) for the caller.
P = TypeVar("P", bound=ArrayTarget)
# predict_volume hands back the targets it was given, typed as given.
T = TypeVar("T", bound=Targets)


def spatial_multiple(model: torch.nn.Module, ndim: int) -> tuple[int, ...]:
    """Per-axis divisor the model's input sizes need (:mod:`~napari_finetune.model.geometry`:
    ``2**depth`` for the UNet, an adapter's or a probed value for other models)."""
    from napari_finetune.model.geometry import spatial_multiple as per_axis

    return per_axis(model, ndim)


def predict_block(model: torch.nn.Module, block: np.ndarray, device: str = "cpu") -> np.ndarray:
    """Sigmoid probabilities of one normalised block.

    Parameters
    ----------
    model : torch.nn.Module
        One logit per output channel; its mode (train/eval) and device are
        restored on return.
    block : numpy.ndarray
        Normalised float32 block, spatial axes only (ZYX or YX).
    device : str
        Where to compute.

    Returns float32 probabilities of shape ``(C, *block.shape)``.
    """
    block = np.asarray(block, dtype=np.float32)
    return predict_batch(model, block[None], device)[0]


def predict_batch(
    model: torch.nn.Module, blocks: np.ndarray, device: str, channels: bool = False
) -> np.ndarray:
    """``(n, *spatial)`` normalised blocks -> ``(n, C, *spatial)`` probabilities;
    with ``channels`` the blocks are ``(n, C_in, *spatial)`` (every input channel)."""
    with on_device(model, device), inference_mode(model):
        return launch_batch(model, blocks, device, channels).result()


@contextmanager
def inference_mode(model: torch.nn.Module) -> Iterator[None]:
    """The model in eval mode without gradients; each module's own mode restored after."""
    import torch

    from napari_finetune.model.modes import evaluating

    with evaluating(model), torch.no_grad(), _onednn_convolutions():
        yield


def _onednn_convolutions_type() -> type:
    """:func:`_onednn_convolutions`' mode class, built on first use (torch imported then)."""
    from torch.overrides import TorchFunctionMode

    class OneDnnConvolutions(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in _CONVOLUTIONS:
                fast = _onednn_convolution(*args, **kwargs)
                if fast is not None:
                    return fast
            return func(*args, **kwargs)

    return OneDnnConvolutions


_CONVOLUTIONS: set[Any] = set()
_MODE: list[type] = []


def _onednn_convolutions() -> AbstractContextManager[None]:
    """Run float32 CPU 2D and 3D convolutions without gradients through oneDNN, in this
    thread only (a torch function mode is per thread).

    torch picks its own slow im2col kernel (``slow_conv3d_forward``) for a batch of one
    whose ``batch x channels x depth x height`` is at most 20480: every first layer, and
    every layer of a thin or small read. Measured on the sample's UNet, one thread, load
    9-10: 16 x 256 x 256 4.9 s -> 2.7 s, 8 x 256 x 256 6.3 -> 1.3 s, 16 x 160 x 160 3.1 ->
    0.7 s, 16 x 80 x 80 1.3 -> 0.16 s, the whole pass's 80 x 160 x 160 blocks alike
    (5.1, 5.5 s); outputs equal within 5e-5.
    """
    import torch

    if not _MODE:
        _CONVOLUTIONS.update({torch.conv2d, torch.conv3d})
        _MODE.append(_onednn_convolutions_type())
    return _MODE[0]()


def _onednn_convolution(input: Any, weight: Any, bias: Any = None, stride: Any = 1,
                        padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    """``torch.conv2d/3d``'s arguments through ``aten.mkldnn_convolution``; None where it
    does not apply (another device or dtype, gradients, a string padding, oneDNN off)."""
    import torch

    n = input.dim() - 2 if isinstance(input, torch.Tensor) else 0
    if (n not in (2, 3) or input.device.type != "cpu" or input.dtype != torch.float32
            or not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32
            or weight.dim() != n + 2 or input.layout != torch.strided
            or isinstance(padding, str) or torch.is_grad_enabled()
            or not (torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available())):
        return None

    def per_axis(value: Any) -> list[int]:
        return [int(value)] * n if isinstance(value, int) else [int(v) for v in value]

    return torch.ops.aten.mkldnn_convolution(
        input.contiguous(), weight.contiguous(), bias, per_axis(padding), per_axis(stride),
        per_axis(dilation), groups)


class PendingProbs:
    """Probabilities of one batch on their way to the host.

    On CUDA the copy into page-locked memory is queued behind the model call
    and the next batch can be launched before this one is read back;
    :meth:`result` waits for this batch's copy alone. Elsewhere the values are
    there already.
    """

    def __init__(self, probs: torch.Tensor, ready: torch.cuda.Event | None = None) -> None:
        self._probs = probs
        self._ready = ready

    def result(self) -> np.ndarray:
        """``(n, C, *spatial)`` float32 probabilities on the host."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._probs.numpy()


def launch_batch(
    model: torch.nn.Module, blocks: np.ndarray, device: str, channels: bool = False
) -> PendingProbs:
    """Start the model on ``(n, *spatial)`` normalised blocks; the model is on ``device``,
    in :func:`inference_mode`. With ``channels`` the blocks are ``(n, C_in, *spatial)``.

    The far side is padded up to the pooling multiple with reflection (not
    zeros: intensities stay plausible) and cropped off again. On CUDA the
    input goes up from page-locked memory without blocking, and the result
    comes back into page-locked memory without blocking (:class:`PendingProbs`).
    """
    import torch

    lead = 2 if channels else 1
    spatial = blocks.shape[lead:]
    multiple = spatial_multiple(model, len(spatial))
    pad = [(0, 0)] * lead + [(0, (-s) % m) for s, m in zip(spatial, multiple, strict=True)]
    if any(p[1] for p in pad):
        blocks = np.pad(blocks, pad, mode="reflect")
    cuda = torch.device(device).type == "cuda"
    x = torch.from_numpy(np.ascontiguousarray(blocks, dtype=np.float32))
    x = x if channels else x.unsqueeze(1)
    if cuda:
        x = x.pin_memory()
    x = x.to(device, non_blocking=cuda)
    probs = torch.sigmoid(model(x).float())
    crop = (slice(None), slice(None)) + tuple(slice(0, s) for s in spatial)
    probs = probs[crop]
    if not cuda:
        return PendingProbs(probs.cpu())
    host = torch.empty(probs.shape, dtype=probs.dtype, pin_memory=True)
    host.copy_(probs, non_blocking=True)
    ready = torch.cuda.Event()
    # On the stream of the device the copy runs on: record() alone records on
    # the current device's (cuda:0 unless set), and a block predicted on cuda:1
    # would be read before its copy is done. ``device`` is where ``probs`` is.
    ready.record(torch.cuda.current_stream(torch.device(device)))
    return PendingProbs(host, ready)


class _Stopped(Exception):
    """Raised inside a model's forward pass when the prediction was asked to stop."""


@contextmanager
def stop_between_layers(model: torch.nn.Module, stop: Callable[[], bool] | None) -> Iterator[None]:
    """Ask ``stop`` before every submodule of ``model`` runs, in this thread; True ends the
    forward pass there (:class:`_Stopped`).

    A batch of one 80 x 160 x 160 block (the default block with its halo) takes
    seconds on one CPU core, and a stop asked between batches only made a closing
    napari wait for it (8-12 s in the walk); a layer is a fraction of that. Only
    this thread's calls are cut: a run may use the same model in its own thread.
    A module that takes no hooks (a TorchScript one) runs whole.
    """
    if stop is None:
        yield
        return
    me = threading.get_ident()

    def check(*_: object) -> None:
        if threading.get_ident() == me and stop():
            raise _Stopped

    handles = []
    for module in model.modules():
        try:
            handles.append(module.register_forward_pre_hook(check))
        except RuntimeError:  # a ScriptModule refuses hooks
            continue
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def spatial_config(config: PredictConfig, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(block_shape, halo) of ``config`` for an image of ``ndim`` spatial axes."""
    # A 3-axis config used on a 2D image keeps its last (YX) axes.
    if len(config.block_shape) < ndim:
        raise ValueError(
            f"PredictConfig has {len(config.block_shape)} axes but the image has {ndim}; "
            "give block_shape and halo one value per spatial axis."
        )
    return config.block_shape[-ndim:], config.halo[-ndim:]


def out_channels(model: torch.nn.Module, ndim: int) -> int:
    """Number of output channels (recorded, from an adapter, or found by a forward pass)."""
    from napari_finetune.model.geometry import model_geometry

    return model_geometry(model, ndim).out_channels


def _as_target(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # Integer/bool targets hold the decision, float targets the probability.
    if not np.issubdtype(dtype, np.floating):
        values = values > 0.5
    return values.astype(dtype, copy=False)


class MaskAndProbability(Generic[P]):
    """A prediction target that stores a channel's decision and keeps its probability.

    Its float dtype makes :func:`write_probs` pass the probability through; the
    decision is cut here as for any integer target. One prediction gives both,
    so objects (each role with its own threshold) need no second prediction.

    Parameters
    ----------
    mask : array-like
        Integer or bool target of the decision (prob > 0.5).
    probability : array-like
        Float target of the probability (numpy, or a zarr array beside the store).
    """

    dtype = np.dtype(np.float32)

    def __init__(self, mask: ArrayTarget, probability: P) -> None:
        self.mask, self.probability = mask, probability
        self.shape = mask.shape

    def __setitem__(self, index: Index, values: np.ndarray) -> None:
        self.mask[index] = _as_target(values, self.mask.dtype)
        self.probability[index] = values


def write_probs(out: Targets, core: tuple[slice, ...], probs: np.ndarray) -> None:
    """Write ``(C, *core)`` probabilities into one array or per-channel arrays."""
    # A Sequence is a list or tuple of per-channel targets: numpy and zarr arrays are not.
    if isinstance(out, Sequence):
        for target, channel in zip(out, probs, strict=True):
            target[core] = _as_target(channel, target.dtype)
    else:
        out[(slice(None),) + core] = _as_target(probs, out.dtype)


# One (low, high) for a single-channel image, or one per channel.
Ranges = tuple[float, float] | list[tuple[float, float]]


@overload
def predict_volume(
    model: torch.nn.Module,
    image: VolumeArray | AxesImage,
    normalization_range: Ranges,
    config: PredictConfig | None = None,
    out: None = None,
    progress: Progress | None = None,
    skip: Sequence[slice] | None = None,
    stop: Callable[[], bool] | None = None,
) -> np.ndarray: ...


@overload
def predict_volume(
    model: torch.nn.Module,
    image: VolumeArray | AxesImage,
    normalization_range: Ranges,
    config: PredictConfig | None = None,
    *,
    out: T,
    progress: Progress | None = None,
    skip: Sequence[slice] | None = None,
    stop: Callable[[], bool] | None = None,
) -> T: ...


def predict_volume(
    model: torch.nn.Module,
    image: VolumeArray | AxesImage,
    normalization_range: Ranges,
    config: PredictConfig | None = None,
    out: Targets | None = None,
    progress: Progress | None = None,
    skip: Sequence[slice] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Targets:
    """Probabilities of a whole volume, computed block by block.

    Parameters
    ----------
    model : torch.nn.Module
        Spatial dims must match the image's.
    image : array-like or AxesImage
        numpy, zarr or dask, ZYX or YX; read one block (plus halo) at a time. An
        :class:`~napari_finetune.arrays.AxesImage` with channels gives the model all
        of them; one with time points is predicted one time point after the other,
        into outputs with its time axis (``(C, T, *spatial)`` or one ``(T, *spatial)``
        per channel).
    normalization_range : (float, float), or one per channel
        Intensities mapped to 0 and 1 (:func:`~napari_finetune.data.normalization.intensity_range`,
        ``intensity_ranges`` for channels).
    config : PredictConfig, optional
        Block, halo, batch and device; its last ``image.ndim`` axes are used.
    out : array or list of arrays, optional
        Where to write: one ``(C, *spatial)`` array or one spatial array per
        channel (numpy or zarr). Float arrays receive probabilities, integer or
        bool arrays ``prob > 0.5`` as 0/1. Default: a new float32 numpy array.
    progress : callable, optional
        Called as ``progress(done, total)`` after each block.
    skip : sequence of slice, optional
        A region already predicted (the one in view, first): the blocks whose
        core lies inside it are left out (``total`` counts the others).
    stop : callable, optional
        Asked before each batch and before each layer of the model's forward pass
        (:func:`stop_between_layers`); True ends the prediction there, the blocks
        written so far kept, the batch cut short dropped (the rest of ``out``
        untouched).

    Returns the ``out`` array(s), filled.
    """
    config = config or PredictConfig()
    axes_image = AxesImage.of(image)
    if axes_image.has_time:
        return _predict_time_points(model, axes_image, normalization_range, config, out,
                                    progress)
    ranges = normalization_range if isinstance(normalization_range, list) else [
        normalization_range]
    # A plain volume is read as it always was; channels through AxesImage.read.
    source: VolumeArray | AxesImage = axes_image.array if axes_image.is_plain else axes_image
    shape = axes_image.spatial_shape
    check_model_fits_image(model, shape)
    block_shape, halo = spatial_config(config, len(shape))
    device = resolve_device(config.device)
    grid = block_grid(shape, block_shape, halo, spatial_multiple(model, len(shape)))
    if skip is not None:
        grid = [block for block in grid if not _inside(block[0], skip, shape)]
    if out is None:
        out = np.zeros((out_channels(model, len(shape)), *shape), dtype=np.float32)

    blocks = read_batches(source, grid, ranges, config.batch_size)
    channels = not axes_image.is_plain
    # Three stages overlap: a thread reads and normalises the next batch, the
    # device computes this one, and the previous one is written out while it
    # computes (on CUDA the launch returns at once).
    with on_device(model, device), inference_mode(model), ThreadPoolExecutor(1) as reader, \
            stop_between_layers(model, stop):
        coming = reader.submit(next, blocks, None)
        previous: tuple[list[BlockPlace], PendingProbs] | None = None
        done = 0
        while (batch := coming.result()) is not None:
            if stop is not None and stop():
                break
            coming = reader.submit(next, blocks, None)
            places, stacked = batch
            try:
                launched = launch_batch(model, stacked, device, channels)
            except _Stopped:
                break  # this batch half computed: dropped; the previous one is written below
            if previous is not None:
                done += write_batch(out, *previous)
                if progress is not None:
                    progress(done, len(grid))
            previous = (places, launched)
        if previous is not None:
            done += write_batch(out, *previous)
            if progress is not None:
                progress(done, len(grid))
    return out


def _predict_time_points(
    model: torch.nn.Module,
    image: AxesImage,
    normalization_range: Ranges,
    config: PredictConfig,
    out: Targets | None,
    progress: Progress | None,
) -> Targets:
    """:func:`predict_volume` of each time point of ``image`` into its place in ``out``."""
    time_points = image.time_points
    if out is None:
        first = image.at_time(0)
        channels = out_channels(model, len(first.spatial_shape))
        out = np.zeros((channels, time_points, *first.spatial_shape), dtype=np.float32)
    for t in range(time_points):
        # A view of each target at time point t (the time axis is first after channels).
        here: Targets = (
            [AxisTaken(_writable(target), 0, t) for target in out]
            if isinstance(out, Sequence) else AxisTaken(_writable(out), 1, t)
        )

        def step(done: int, total: int, before: int = t) -> None:
            if progress is not None:
                progress(before * total + done, time_points * total)

        predict_volume(model, image.at_time(t), normalization_range, config, out=here,
                       progress=step)
    return out


def _writable(target: ArrayTarget) -> WritableVolume:
    """``target`` as the numpy or zarr array it is (read and written alike)."""
    return cast(WritableVolume, target)


def _inside(core: Sequence[slice], region: Sequence[slice], shape: Sequence[int]) -> bool:
    """Whether the block ``core`` lies inside ``region`` (slices of a volume of ``shape``)."""
    for c, r, n in zip(core, region, shape, strict=True):
        start, stop, _ = r.indices(n)
        if c.start < start or c.stop > stop:
            return False
    return True


# Where a block's probabilities go: its core in the volume, the core inside the
# block, and its missing voxels (None when every voxel has a value).
BlockPlace = tuple[tuple[slice, ...], tuple[slice, ...], np.ndarray | None]


def read_batches(
    image: VolumeArray | AxesImage,
    grid: list[tuple[tuple[slice, ...], tuple[slice, ...], tuple[slice, ...]]],
    normalization_range: Ranges,
    batch_size: int,
) -> Iterator[tuple[list[BlockPlace], np.ndarray]]:
    """Read, normalise and stack the grid's blocks, ``batch_size`` at a time.

    Only same-shaped blocks share a batch (a border block of another shape
    starts a new one). An :class:`~napari_finetune.arrays.AxesImage` (channels,
    one time point) gives ``(C, *block)`` blocks, each channel normalised with its
    range; a voxel is missing when any channel lacks a value there.
    """
    ranges = normalization_range if isinstance(normalization_range, list) else [
        normalization_range]
    places: list[BlockPlace] = []
    stack: list[np.ndarray] = []
    for core, read, inner in grid:
        missing: np.ndarray | None
        if isinstance(image, AxesImage):
            raw = image.read(read)
            block = normalize_channels(raw, ranges)
            per_channel = missing_mask(raw[(slice(None),) + inner])
            missing = None if per_channel is None else np.asarray(per_channel.any(axis=0))
        else:
            raw = np.asarray(image[read])
            block = normalize(raw, *ranges[0])
            missing = missing_mask(raw[inner])
        if stack and (stack[0].shape != block.shape or len(stack) >= batch_size):
            yield places, np.stack(stack)
            places, stack = [], []
        places.append((core, inner, missing))
        stack.append(block)
    if stack:
        yield places, np.stack(stack)


def write_batch(out: Targets, places: list[BlockPlace], pending: PendingProbs) -> int:
    """Write each block's core probabilities (missing voxels as background); the count."""
    probs = pending.result()
    for (core, inner, missing), block_probs in zip(places, probs, strict=True):
        core_probs = block_probs[(slice(None),) + inner]
        background_where_missing(core_probs, missing)
        write_probs(out, core, core_probs)
    return len(places)
