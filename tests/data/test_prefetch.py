import threading

import numpy as np
import pytest

from napari_finetune.data.prefetch import SampleFeed, stage_for
from napari_finetune.data.sampling import PatchSampler


def _sampler(seed=0):
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (12, 32, 32)).astype(np.uint8)
    corrections = np.zeros(image.shape, np.uint8)
    corrections[2:8, 4:20, 4:20] = 1
    corrections[9, 25, 25] = 2
    return PatchSampler(image, corrections, (4, 8, 8), (0, 255), seed=seed)


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "napari-finetune-prefetch"]


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_same_samples_as_drawing_on_the_training_thread(depth):
    plain = _sampler()
    expected = [plain.sample(3) for _ in range(5)]
    fed = _sampler()
    with SampleFeed(fed, depth) as feed:
        got = [feed.next(3) for _ in range(5)]
    for (ei, el), (gi, gl) in zip(expected, got, strict=True):
        np.testing.assert_array_equal(ei, gi)
        np.testing.assert_array_equal(el, gl)
    # The steps drawn ahead and not used are given back: the sampler continues as plain.
    np.testing.assert_array_equal(plain.sample(2)[0], fed.sample(2)[0])
    assert not _prefetch_threads()


def test_a_new_step_size_restarts_from_the_first_unused_step():
    plain = _sampler()
    expected = [plain.sample(4), plain.sample(2), plain.sample(2)]
    feed = SampleFeed(_sampler(), 2)
    got = [feed.next(4), feed.next(2), feed.next(2)]
    feed.close()
    for (ei, _), (gi, _) in zip(expected, got, strict=True):
        np.testing.assert_array_equal(ei, gi)


def test_sampling_error_is_raised_on_the_training_thread():
    class Failing:
        def __init__(self):
            self.calls = 0

        def sample(self, n):
            self.calls += 1
            if self.calls == 2:
                raise OSError("store went away")
            return np.zeros((n, 1, 2)), np.zeros((n, 2))

        def get_state(self):
            return {"calls": self.calls}

        def set_state(self, state):
            self.calls = state["calls"]

    feed = SampleFeed(Failing(), 2)
    feed.next(1)
    with pytest.raises(OSError, match="store went away"):
        feed.next(1)
    feed.close()
    assert not _prefetch_threads()


def test_stage_runs_on_the_producer_thread_and_only_for_cuda():
    seen = []

    def stage(array):
        seen.append(threading.current_thread().name)
        return array

    with SampleFeed(_sampler(), 1, stage=stage) as feed:
        feed.next(2)
    assert seen and set(seen) == {"napari-finetune-prefetch"}
    import torch

    assert stage_for(torch.device("cpu")) is None
    assert stage_for(torch.device("cuda", 0)) is not None


def test_pinned_copy_is_pinned_and_equal():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs CUDA")
    from napari_finetune.data.prefetch import pinned_copy

    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = pinned_copy(a)
    np.testing.assert_array_equal(a, b)
    assert torch.from_numpy(b).is_pinned()
