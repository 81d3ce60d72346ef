"""A preview the worker cannot compute is one line back to the client; the run goes on."""

from __future__ import annotations

import numpy as np

from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.messages import PREVIEW, decode, encode, region_to_plain
from napari_finetune.remote.worker import Outbox, _answer_preview

REGION = (slice(0, 4), slice(0, 8), slice(0, 8))


class ListQueue:
    """The part of ``distributed.Queue`` the worker uses: ``put`` and ``get(batch=True)``
    (all items there now, maybe none; only the batch form is used, so only it exists)."""

    def __init__(self, items: list[bytes] | None = None) -> None:
        self.items = list(items or [])

    def put(self, item: bytes) -> None:
        self.items.append(item)

    def get(self, *, batch: bool) -> list[bytes]:
        if batch is not True:
            raise TypeError("the worker reads its queues only in batches")
        items, self.items = self.items, []
        return items


class Trainer:
    """The worker's trainer as ``_answer_preview`` sees it: a step count and ``predict``."""

    steps_done = 3

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def predict(self, region: object) -> np.ndarray:
        if self.fail:
            raise MemoryError("CUDA out of memory on the preview region\nTried to allocate")
        return np.ones((2, 4, 8, 8), np.float64)


def _client() -> RemoteFinetuner:
    import torch

    model = torch.nn.Conv3d(1, 2, 1)
    image = np.zeros((8, 16, 16), np.float32)
    return RemoteFinetuner(model, image, np.zeros((2, 8, 16, 16), np.uint8), _config(),
                           scheduler="tcp://127.0.0.1:1", checkpoint=b"")


def _config():
    from napari_finetune.config import FinetuneConfig

    return FinetuneConfig(steps=2, batch_size=1, mode="full", device="cpu",
                          patch_shape=(8, 16, 16))


def test_a_failing_preview_sends_its_line_and_the_client_reports_it_once():
    previews = ListQueue([encode({"region": region_to_plain(REGION)})])
    messages = ListQueue()
    _answer_preview(Trainer(fail=True), previews, Outbox(messages))  # raises nothing
    [answer] = map(decode, messages.items)  # as the client reads them
    assert answer["kind"] == PREVIEW and "probabilities" not in answer
    assert answer["error"] == "MemoryError: CUDA out of memory on the preview region"

    client = _client()
    assert client._take(answer) is False  # not the run's end
    assert client.take_preview() is None
    assert client.take_preview_failure() == answer["error"]
    assert client.take_preview_failure() is None  # once


def test_a_preview_that_works_still_comes_back_as_float32():
    previews = ListQueue([encode({"region": region_to_plain(REGION)})])
    messages = ListQueue()
    _answer_preview(Trainer(fail=False), previews, Outbox(messages))
    [answer] = map(decode, messages.items)  # as the client reads them
    assert "error" not in answer and answer["probabilities"].dtype == np.float32
    client = _client()
    client._take(answer)
    region, probabilities = client.take_preview()
    assert region == REGION and probabilities.shape == (2, 4, 8, 8)
    assert client.take_preview_failure() is None
