"""``max_send_bytes``: a run that would send more is refused before anything is sent."""

from __future__ import annotations

import numpy as np
import pytest
from test_remote_run import config, model_file, volume  # noqa: F401 (a fixture)

from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.preflight import RemoteError


def test_the_planned_bytes_are_what_is_sent(model_file):  # noqa: F811
    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections, config(),
                                    "tcp://127.0.0.1:9")
    planned = remote.planned_bytes()
    inputs = remote.inputs()
    assert sum(planned.values()) == inputs.nbytes
    assert planned["image"] == inputs.image.nbytes > 0
    assert planned["painting"] == inputs.painting.nbytes
    # Strokes over the whole volume reach more tiles than strokes in one corner.
    spread = np.zeros_like(corrections)
    spread[::5, ::12, ::12] = 1
    wide = RemoteFinetuner.remote(load_checkpoint(model_file), image, spread, config(),
                                  "tcp://127.0.0.1:9")
    assert wide.planned_bytes()["image"] > planned["image"]


@pytest.mark.resource  # the tests' LocalCluster
def test_a_run_over_the_cap_is_one_line_and_sends_nothing(client, model_file):  # noqa: F811
    image, corrections = volume()
    remote = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                    config(max_send_bytes=1000), client)
    planned = sum(remote.planned_bytes().values())
    assert planned > 1000
    with pytest.raises(RemoteError) as caught:
        list(remote.run())
    line = str(caught.value)
    assert "\n" not in line and f"would send {planned / 1e6:.1f} MB" in line
    assert "over the cap of 0.0 MB (max_send_bytes, --max-send-bytes)" in line
    assert "shared filesystem" in line and "store_path=" in line
    assert remote.run_id is None and remote.bytes_sent == 0  # no task, no queue

    # Under the cap the same run goes.
    ok = RemoteFinetuner.remote(load_checkpoint(model_file), image, corrections,
                                config(steps=1, max_send_bytes=planned), client)
    assert [s.kind for s in ok.run()][-1] == "finished"
    assert ok.bytes_sent == planned
