"""Blockwise prediction: equal to one call, bounded reads, 2D/3D, odd shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr

from array_readers import CountingReader
from napari_finetune.config import PredictConfig
from napari_finetune.model.unet import UNet
from napari_finetune.predict import axis_cores, block_grid, predict_block, predict_volume


def _model(dims: int, norm: str = "none", out_channels: int = 2) -> UNet:
    # depth 2: receptive-field radius ~23 voxels, so a halo of 24 makes blocks exact.
    return UNet(dims=dims, depth=2, features=4, out_channels=out_channels, norm=norm).eval()


def test_predict_block_shape_range_and_odd_sizes():
    model = _model(3)
    block = np.random.default_rng(0).random((5, 13, 9), dtype=np.float32)
    probs = predict_block(model, block)
    assert probs.shape == (2, 5, 13, 9)
    assert probs.dtype == np.float32
    assert 0.0 <= probs.min() and probs.max() <= 1.0


def test_predict_block_restores_training_mode():
    model = _model(2, norm="batch").train()
    before = model.encoders[0][1].running_mean.clone()
    predict_block(model, np.random.default_rng(0).random((16, 16), dtype=np.float32))
    assert model.training
    # eval + no_grad: BatchNorm statistics were not updated by the prediction.
    assert (model.encoders[0][1].running_mean == before).all()


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_blockwise_equals_one_shot_2d(norm):
    model = _model(2, norm)
    image = np.random.default_rng(1).random((70, 83), dtype=np.float32)
    reference = predict_block(model, image)
    config = PredictConfig(block_shape=(16, 24), halo=(24, 24), device="cpu")
    result = predict_volume(model, image, (0.0, 1.0), config)
    np.testing.assert_allclose(result, reference, atol=1e-5)


def test_blockwise_equals_one_shot_3d_batched_odd_shape():
    # depth 1: receptive-field radius ~9 voxels, so a halo of 10 is exact and cheap.
    model = UNet(dims=3, depth=1, features=4, out_channels=2, norm="none").eval()
    raw = np.random.default_rng(2).random((19, 37, 41), dtype=np.float32) * 200 + 50
    reference = predict_block(model, (raw - 50) / 200)
    config = PredictConfig(block_shape=(8, 16, 16), halo=(10, 10, 10), batch_size=3, device="cpu")
    result = predict_volume(model, raw, (50.0, 250.0), config)
    np.testing.assert_allclose(result, reference, atol=1e-5)


def test_small_halo_is_not_exact():
    # The equality above is not trivial: with too little context blocks differ.
    model = _model(2)
    image = np.random.default_rng(3).random((64, 64), dtype=np.float32)
    reference = predict_block(model, image)
    config = PredictConfig(block_shape=(16, 16), halo=(0, 0), device="cpu")
    result = predict_volume(model, image, (0.0, 1.0), config)
    assert np.abs(result - reference).max() > 1e-4


def test_volume_smaller_than_block_and_3_axis_config_on_2d():
    model = _model(2)
    image = np.random.default_rng(4).random((11, 7), dtype=np.float32)
    result = predict_volume(model, image, (0.0, 1.0), PredictConfig(device="cpu"))
    np.testing.assert_allclose(result, predict_block(model, image), atol=1e-6)


def test_reads_are_bounded_by_block_and_halo():
    model = _model(3)
    reader = CountingReader(np.random.default_rng(5).random((24, 48, 48), dtype=np.float32))
    config = PredictConfig(block_shape=(8, 16, 16), halo=(4, 4, 4), device="cpu")
    seen = []
    predict_volume(model, reader, (0.0, 1.0), config, progress=lambda d, t: seen.append((d, t)))
    # No read exceeds an interior block with its halo: (8 + 2*4) x (16 + 2*4)^2.
    assert max(reader.reads) <= 16 * 24 * 24
    # z: 2 blocks of 12 (border blocks take the halo they save); y, x: 3 blocks of 16.
    assert len(reader.reads) == 2 * 3 * 3
    assert seen[-1] == (18, 18) and [d for d, _ in seen] == list(range(1, 19))


def test_zarr_in_zarr_out_per_channel_uint8(tmp_path):
    model = _model(3)
    data = np.random.default_rng(6).random((12, 40, 40), dtype=np.float32)
    image = zarr.create_array(
        store=str(tmp_path / "img.zarr"), shape=data.shape, chunks=(4, 16, 16), dtype="f4"
    )
    image[:] = data
    targets = [
        zarr.create_array(
            store=str(tmp_path / f"c{c}.zarr"), shape=data.shape, chunks=(8, 16, 16), dtype="u1"
        )
        for c in range(2)
    ]
    config = PredictConfig(block_shape=(8, 16, 16), halo=(24, 24, 24), device="cpu")
    predict_volume(model, image, (0.0, 1.0), config, out=targets)
    reference = predict_block(model, data) > 0.5
    for c in range(2):
        written = targets[c][:]
        assert written.dtype == np.uint8 and set(np.unique(written)) <= {0, 1}
        # Voxels right at 0.5 may flip with float rounding; none do here in practice.
        assert (written == reference[c]).mean() > 0.999


def test_dims_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="3D"):
        predict_volume(_model(3), np.zeros((16, 16), np.float32), (0.0, 1.0))


@pytest.mark.parametrize("size", [1, 7, 40, 83, 192, 256, 1000])
def test_axis_cores_bound_reads(size):
    block, halo = 32, 8
    cores = axis_cores(size, block, halo, multiple=8)
    assert cores[0][0] == 0 and cores[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(cores, cores[1:], strict=False))
    for start, stop in cores:
        read = stop - start + (halo if start > 0 else 0) + (halo if stop < size else 0)
        assert read <= block + 2 * halo + 8  # + at most one alignment step


def test_block_grid_covers_every_voxel_once():
    shape = (23, 50)
    cover = np.zeros(shape, int)
    for core, read, inner in block_grid(shape, (8, 16), (3, 5), multiple=4):
        cover[core] += 1
        assert read[0].start % 4 == 0 and read[1].start % 4 == 0
        for c, r, i in zip(core, read, inner, strict=True):
            assert r.start + i.start == c.start and r.start + i.stop == c.stop
    assert (cover == 1).all()


def test_predict_block_keeps_per_module_modes():
    model = _model(2, norm="batch").train()
    model.encoders[0][1].eval()  # e.g. a frozen BatchNorm inside a training model
    predict_block(model, np.zeros((8, 8), np.float32))
    assert model.training and not model.encoders[0][1].training


def test_monai_unet_predicts_sizes_its_strides_do_not_divide():
    # Before: foreign models got a multiple of 1, no padding, and MONAI UNet failed
    # on 30x100x100 (its strides need multiples of 8 here).
    from monai.networks import nets

    model = nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(2, 4, 4, 4),
                      strides=(2, 2, 2), norm="batch").eval()
    volume = np.random.default_rng(7).random((30, 100, 100), dtype=np.float32)
    config = PredictConfig(block_shape=(16, 64, 64), halo=(4, 8, 8), device="cpu")
    probs = predict_volume(model, volume, (0.0, 1.0), config)
    assert probs.shape == (2, 30, 100, 100) and np.isfinite(probs).all()
    assert predict_block(model, volume[:13, :21, :9]).shape == (2, 13, 21, 9)


def test_block_grid_aligns_each_axis_to_its_own_multiple():
    shape = (23, 50, 37)
    cover = np.zeros(shape, int)
    for core, read, _ in block_grid(shape, (8, 16, 16), (3, 5, 5), multiple=(2, 8, 4)):
        cover[core] += 1
        assert read[0].start % 2 == 0 and read[1].start % 8 == 0 and read[2].start % 4 == 0
    assert (cover == 1).all()


def test_shape_multiple_is_one_divisor_for_every_axis():
    from monai.networks import nets

    from napari_finetune.model.geometry import shape_multiple
    from napari_finetune.predict import spatial_multiple

    model = nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(2, 4, 4),
                      strides=((1, 2, 2), 2))
    assert spatial_multiple(model, 3) == (2, 4, 4)
    assert shape_multiple(model) == 4
    assert shape_multiple(UNet(dims=2, depth=3, features=2)) == 8


def test_blockwise_equals_a_plain_model_call():
    """The oracle is not the code under test: ``torch.sigmoid(model(x))`` on the whole volume."""
    import torch

    torch.manual_seed(3)
    model = UNet(dims=3, depth=1, features=4, out_channels=2, norm="none").eval()
    raw = np.random.default_rng(3).random((20, 36, 44), dtype=np.float32) * 200 + 50
    with torch.no_grad():
        x = torch.from_numpy((raw - 50) / 200).float()[None, None]
        reference = torch.sigmoid(model(x))[0].numpy()
    for batch_size in (1, 4):
        config = PredictConfig(block_shape=(8, 16, 16), halo=(10, 10, 10),
                               batch_size=batch_size, device="cpu")
        calls: list[tuple[int, int]] = []
        result = predict_volume(model, raw, (50.0, 250.0), config,
                                progress=lambda done, total, seen=calls: seen.append((done, total)))
        np.testing.assert_allclose(result, reference, atol=1e-5)
        total = calls[-1][1]
        assert calls[-1] == (total, total)  # every block written, progress in order
        assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_a_failed_read_stops_the_prediction_with_its_error():
    """The next block is read in a thread while the model computes: its error reaches
    the caller, and no thread is left behind."""
    import threading

    class FailingReader(CountingReader):
        def __getitem__(self, index):
            if len(self.reads) == 3:
                raise OSError("chunk 3 is unreadable")
            return super().__getitem__(index)

    model = _model(3)
    image = FailingReader(np.random.default_rng(4).random((16, 32, 32), dtype=np.float32))
    config = PredictConfig(block_shape=(8, 16, 16), halo=(4, 4, 4), batch_size=1, device="cpu")
    before = threading.active_count()
    with pytest.raises(OSError, match="chunk 3 is unreadable"):
        predict_volume(model, image, (0.0, 1.0), config)
    assert threading.active_count() == before


def test_a_block_on_the_second_gpu_is_read_when_its_own_stream_is_done():
    """The read-back of cuda:1's copy waits on an event recorded on cuda:1's stream.

    ``Event.record()`` without a stream records on the current device's (cuda:0
    here), where the copy does not run: the host would read the buffer early.
    """
    from napari_finetune.predict import inference_mode, launch_batch
    from napari_finetune.testing import FakeCuda

    model = _model(2)
    blocks = np.random.default_rng(0).random((2, 12, 12), dtype=np.float32)
    with FakeCuda(device_count=2, tensors_on_host=True) as cuda, inference_mode(model):
        assert torch.cuda.current_device() == 0
        pending = launch_batch(model, blocks, "cuda:1")
        probs = pending.result()
    assert cuda.moves == [torch.device("cuda", 1)]
    assert cuda.recorded == [torch.device("cuda", 1)]
    assert pending._ready.synchronized and probs.shape == (2, 2, 12, 12)


def test_stop_ends_the_prediction_inside_a_batch_keeping_the_blocks_written():
    """Stop asked while a batch's forward pass runs: the model's next layer does not run
    (a batch is one block of seconds on a CPU core, which a closing napari waited for);
    the blocks of the batches before are written, the cut batch's are not."""
    import threading

    model = _model(3)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv3d)]
    image = np.random.default_rng(5).random((8, 32, 32), dtype=np.float32)
    config = PredictConfig(block_shape=(8, 16, 16), halo=(4, 4, 4), batch_size=1, device="cpu")
    blocks = len(block_grid(image.shape, (8, 16, 16), (4, 4, 4), (4, 4, 4)))
    assert blocks == 4
    ran: list[str] = []  # "conv" per convolution run, "batch" per forward pass begun
    asked = threading.Event()
    model.register_forward_pre_hook(lambda *_: ran.append("batch"))
    for conv in convs:
        conv.register_forward_hook(lambda *_: ran.append("conv"))

    def stop() -> bool:
        # The user's Stop comes during the second block's forward pass, after its
        # first convolution.
        if ran.count("batch") == 2 and ran[-1] == "conv":
            asked.set()
        return asked.is_set()

    out = predict_volume(model, image, (0.0, 1.0), config, stop=stop)
    assert ran.count("batch") == 2
    assert ran[ran.index("batch", 1):] == ["batch", "conv"]  # cut after one convolution
    assert ran.count("conv") == len(convs) + 1
    full = predict_volume(model, image, (0.0, 1.0), config)
    written = np.any(out != 0, axis=0)
    first = block_grid(image.shape, (8, 16, 16), (4, 4, 4), (4, 4, 4))[0][0]
    np.testing.assert_array_equal(out[(slice(None), *first)], full[(slice(None), *first)])
    assert written.sum() == written[first].size  # only the first block's core


def test_a_stop_does_not_cut_the_same_model_in_another_thread():
    """A run may use the model in its own thread while a prediction stops: only the
    prediction's thread is cut."""
    import threading

    model = _model(3)
    x = torch.zeros(1, 1, 8, 16, 16)
    from napari_finetune.predict.volume import stop_between_layers

    with stop_between_layers(model, lambda: True):
        result: list[torch.Tensor] = []
        other = threading.Thread(target=lambda: result.append(model(x)))
        other.start()
        other.join()
        assert result and result[0].shape == (1, 2, 8, 16, 16)
    assert model(x).shape == (1, 2, 8, 16, 16)  # the hooks are gone after
