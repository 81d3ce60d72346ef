"""The view after Stop: predicted in tiles, its centre first, each shown as it lands.

A real small model (the depth-2 UNet of tests/conftest.py) on a 16 x 40 x 40 volume,
the job driven as the runners drive it; tiles of 16 so the viewed slice is several.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_finetune.session import jobs
from napari_finetune.session.events import Event, RegionPredicted

VIEW = (slice(7, 8), slice(0, 40), slice(0, 40))


@pytest.fixture
def image() -> np.ndarray:
    return np.random.default_rng(0).random((16, 40, 40), dtype=np.float32)


def drive(job, on_event=lambda event: None) -> tuple[list[Event], jobs.Prediction]:
    """Every event of ``job`` in order (``on_event`` called on each), and its result."""
    events: list[Event] = []
    while True:
        try:
            event = next(job)
        except StopIteration as end:
            return events, end.value
        events.append(event)
        on_event(event)


def voxels(region: tuple[slice, ...]) -> set[tuple[int, ...]]:
    return {tuple(int(i) for i in point) for point in np.ndindex(
        *(s.stop for s in region)) if all(p >= s.start for p, s in zip(point, region,
                                                                       strict=True))}


def test_the_view_comes_in_tiles_its_centre_first_all_before_the_rest(checkpoint, image):
    job = jobs.predict_job(str(checkpoint), image, None, "cpu", first=VIEW, view_tile=16)
    events, prediction = drive(job)
    shown = [e.region for e in events if isinstance(e, RegionPredicted)]
    assert len(shown) > 1, shown
    first = shown[0]
    # Inside the viewed slice, smaller than it, and around its centre (20, 20).
    assert all(f.start >= v.start and f.stop <= v.stop for f, v in zip(first, VIEW, strict=True))
    assert voxels(first) < voxels(VIEW)
    assert all(s.start <= 20 < s.stop for s in first[1:]), first
    # Every viewed voxel announced before the pass over the volume, each once.
    last = max(i for i, e in enumerate(events) if isinstance(e, RegionPredicted))
    covered: set[tuple[int, ...]] = set()
    for region in shown:
        assert not covered & voxels(region), region
        covered |= voxels(region)
    assert covered == voxels(VIEW)
    rest = [e for e in events[last + 1:] if getattr(e, "what", None) == "predict"]
    assert rest and rest[-1].done == rest[-1].total
    assert prediction.complete


def test_a_small_view_is_one_tile(checkpoint, image):
    view = (slice(7, 8), slice(4, 20), slice(10, 24))
    events, _ = drive(jobs.predict_job(str(checkpoint), image, None, "cpu", first=view,
                                       view_tile=16))
    assert [e.region for e in events if isinstance(e, RegionPredicted)] == [view]


@pytest.mark.parametrize("asked_before_stop", [0, 3])
def test_a_stop_ends_the_job_and_no_cut_tile_is_shown(checkpoint, image, asked_before_stop):
    """Stop once the first tile is shown: at the next tile's start (0 asks), or inside its
    model call (``stop`` is asked between the model's layers: the 4th ask)."""
    state = {"shown": False, "asked": 0}

    def stop() -> bool:
        if not state["shown"]:
            return False
        state["asked"] += 1
        return state["asked"] > asked_before_stop

    def on_event(event: Event) -> None:
        if isinstance(event, RegionPredicted):
            state["shown"] = True

    job = jobs.predict_job(str(checkpoint), image, None, "cpu", first=VIEW, view_tile=16,
                           stop=stop)
    events, prediction = drive(job, on_event)
    first_tile = jobs.view_tiles(VIEW, 16)[0]
    assert [e.region for e in events if isinstance(e, RegionPredicted)] == [first_tile]
    assert state["asked"] > asked_before_stop  # it was asked there, and stopped there
    assert not prediction.complete
    # The cut tile and the volume's pass wrote nothing: only the first tile has values.
    outside = np.ones(image.shape, bool)
    outside[first_tile] = False
    assert not any(mask[outside].any() for mask in prediction.masks)


def test_inference_runs_the_convolutions_of_a_thin_read_through_onednn(checkpoint):
    """torch's own kernel for a batch of one with a small batch x channels x depth x
    height (slow_conv3d_forward) took 4.9 s of the 16 x 256 x 256 view, oneDNN 2.7 s."""
    import torch
    from torch.profiler import profile

    from napari_finetune.loading import load_checkpoint
    from napari_finetune.predict.volume import inference_mode

    model = load_checkpoint(str(checkpoint)).model
    x = torch.rand(1, 1, 16, 32, 32)
    with torch.no_grad():
        plain = model.eval()(x)
    with inference_mode(model), profile() as seen:
        fast = model(x)
    names = {e.key for e in seen.key_averages()}
    assert "aten::slow_conv3d_forward" not in names, names
    assert "aten::mkldnn_convolution" in names, names
    assert torch.allclose(plain, fast, atol=1e-4)
    model.train()  # a training step keeps torch's own path, with gradients
    model(x).sum().backward()
