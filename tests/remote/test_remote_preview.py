"""Previews computed on the worker: the client asks for a region, the worker answers after
its next step with what a local predict with that step's weights gives."""

from __future__ import annotations

import numpy as np
import pytest
from test_remote_run import config
from test_remote_store import painting_of

from napari_finetune.io.volume import open_volume
from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner

pytestmark = pytest.mark.resource  # the LocalCluster

# Away from the painting: in tiles mode the worker was never sent these pixels.
REGION = (slice(0, 4), slice(24, 40), slice(24, 40))


@pytest.mark.parametrize("by_store", [False, True], ids=["tiles", "store"])
def test_a_preview_comes_back_as_a_local_predict_with_that_steps_weights(
    client, store, checkpoint, by_store
):
    image = open_volume(store).data
    remote = RemoteFinetuner.remote(
        load_checkpoint(checkpoint), image, painting_of(tuple(image.shape)),
        config(steps=40, validation_fraction=0.0, learning_rate=1e-2), client, weights_every=1,
        store_path=store if by_store else None)
    assert remote.take_preview() is None
    previews = []
    for status in remote.run():
        if status.kind == "step" and status.step == 1:
            remote.request_preview(REGION)
        preview = remote.take_preview()
        if preview is not None:
            region, probabilities = preview
            # The weights held here are those of the step that made the preview.
            assert remote.preview_step == remote.steps_done
            assert region == REGION and probabilities.dtype == np.float32
            assert probabilities.shape == (2, 4, 16, 16)
            np.testing.assert_allclose(probabilities, remote.predict(REGION), rtol=0, atol=1e-5)
            previews.append((remote.preview_step, probabilities))
            if len(previews) == 1:
                remote.request_preview(REGION)  # a second one, some steps later
    assert remote.store_used is by_store
    assert len(previews) == 2 and previews[0][0] < previews[1][0]
    assert np.abs(previews[0][1] - previews[1][1]).max() > 1e-4  # training moved it


def test_a_preview_region_that_is_not_a_box_of_the_image_is_one_line(client, checkpoint):
    image = np.zeros((16, 40, 40), np.float32)
    remote = RemoteFinetuner.remote(load_checkpoint(checkpoint), image, painting_of(image.shape),
                                    config(), client)
    for bad in [(slice(0, 4),), (slice(0, 4, 2),) * 3, (slice(30, 40),) * 3]:
        with pytest.raises(ValueError) as error:
            remote.request_preview(bad)
        assert "\n" not in str(error.value) and "preview region" in str(error.value)
