"""'Paint here next' on a Session given an ``AxesImage``: the uncertainty of every channel the
model reads and of every time point, and a region of one time point with nothing painted,
on real stores written by ome-zarr-py."""

from __future__ import annotations

import numpy as np
from tests.session.conftest import RecordingViewer, tiny_config
from tests.session.test_session_axes import session_on

from napari_finetune._qt.suggest import describe
from napari_finetune.io.omezarr import save_corrections
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Busy, Outcome, Session
from napari_finetune.uncertainty import Suggestion
from test_cli_axes import SPATIAL, image_of, model_file, painted, write_store

# Half of tiny_config's (16, 32, 32) patch.
REGION = (8, 16, 16)


def on_the_grid(box: tuple[slice, ...]) -> bool:
    """A region of the REGION grid (the last one on an axis may be smaller)."""
    return all(b.start % r == 0 and 0 < b.stop - b.start <= r
               for b, r in zip(box, REGION, strict=True))


def ended(session: Session) -> list[tuple[Busy, Outcome, str]]:
    ends: list[tuple[Busy, Outcome, str]] = []
    session.events.ended.connect(lambda end: ends.append((end.action, end.outcome, end.reason)))
    return ends


def test_a_two_channel_image_suggests_an_unpainted_region(tmp_path):
    store = write_store(tmp_path / "czyx.zarr",
                        np.stack([image_of(SPATIAL, 0), image_of(SPATIAL, 1)]), "czyx")
    save_corrections(store, painted())
    session = session_on(store, model_file(tmp_path / "m.pt", in_channels=2))
    ends = ended(session)
    assert session.suggest() is True
    assert ends == [(Busy.SUGGEST, Outcome.DONE, "")]
    assert session.uncertainty is not None and session.uncertainty.shape == SPATIAL
    box = session.suggestion.box
    assert on_the_grid(box)
    assert not painted()[box].any()
    assert describe(session.suggestion).startswith("paint here next: z=")


def test_a_time_series_suggests_a_region_of_one_time_point(tmp_path):
    frames = np.stack([image_of(SPATIAL, seed) for seed in range(2)])
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    corrections = np.zeros((2, *SPATIAL), np.uint8)
    corrections[1] = painted()
    save_corrections(store, corrections)
    checkpoint = model_file(tmp_path / "m.pt")
    session = session_on(store, checkpoint)
    ends = ended(session)
    seen = []
    for _ in range(3):  # asked again: the next region, never a painted one
        assert session.suggest() is True
        box = session.suggestion.box
        assert box[0].stop - box[0].start == 1  # one time point
        assert on_the_grid(box[1:])
        assert not corrections[box].any()
        seen.append(tuple((b.start, b.stop) for b in box))
    assert len(set(seen)) == 3
    assert ends == [(Busy.SUGGEST, Outcome.DONE, "")] * 3
    unsure = session.uncertainty
    assert unsure is not None and unsure.shape == (2, *SPATIAL)
    # Each time point's uncertainty is that of the frame alone.
    for t in range(2):
        alone = Session(InlineRunner(), viewer=RecordingViewer(), image=frames[t],
                        checkpoint=str(checkpoint), channel_names=["a", "b"],
                        config=tiny_config())
        assert alone.suggest() is True
        np.testing.assert_allclose(unsure[t], alone.uncertainty, atol=1e-6)
    line = describe(session.suggestion, "tzyx")
    center = session.suggestion.center
    assert line.startswith(f"paint here next: t={center[0]} z={center[1]} ")


def test_describe_names_the_axes_it_is_given():
    suggestion = Suggestion(center=(2, 10, 20), box=(slice(2, 3), slice(0, 20), slice(0, 40)),
                            uncertainty=0.5)
    assert describe(suggestion).startswith("paint here next: z=2 y=10 x=20 ")
    assert describe(suggestion, "tyx").startswith("paint here next: t=2 y=10 x=20 ")
