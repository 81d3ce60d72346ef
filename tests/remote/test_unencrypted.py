"""A plain tcp:// scheduler of another machine: which addresses, and the Session's request."""

from __future__ import annotations

import numpy as np
import pytest

from napari_finetune.config import FinetuneConfig
from napari_finetune.remote.preflight import is_loopback, unencrypted_line
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Session


@pytest.mark.parametrize("address, loopback", [
    ("tcp://127.0.0.1:8786", True), ("tcp://127.4.5.6:1", True), ("tcp://[::1]:8786", True),
    ("tcp://localhost:8786", True), ("tcp://LOCALHOST:8786", True),
    ("tcp://10.1.2.3:8786", False), ("tcp://gpu-server:8786", False),
    ("tcp://[2001:db8::1]:8786", False), ("gpu-server:8786", False),
])
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback
    assert (unencrypted_line(address) is None) is loopback


def test_tls_is_never_warned_of():
    assert unencrypted_line("tls://10.1.2.3:8786") is None
    line = unencrypted_line("tcp://10.1.2.3:8786")
    assert line is not None and "the checkpoint, the painted tiles and the weights" in line


def _session(scheduler: str, answers: list[bool], asked: list[tuple[str, str]]) -> Session:
    def confirm(address: str, line: str) -> bool:
        asked.append((address, line))
        return answers.pop(0)

    painted = np.zeros((8, 16, 16), np.uint8)
    painted[4, 8, 8] = 2
    return Session(InlineRunner(), image=np.zeros((8, 16, 16), np.float32), checkpoint="x.pt",
                   corrections=painted, config=FinetuneConfig(steps=1),
                   scheduler=scheduler, confirm_unencrypted=confirm)


def test_the_session_asks_once_per_unencrypted_address_and_a_no_starts_nothing(monkeypatch):
    from napari_finetune.session import jobs

    started: list[str | None] = []

    def train_job(*args, scheduler=None, **kwargs):
        started.append(scheduler)
        yield from ()

    monkeypatch.setattr(jobs, "train_job", train_job)
    asked: list[tuple[str, str]] = []
    session = _session("tcp://10.1.2.3:8786", [False, True], asked)
    refused, ended = [], []
    session.events.refused.connect(refused.append)
    session.events.ended.connect(ended.append)

    assert session.finetune() is False  # No: nothing starts
    assert started == [] and ended == [] and len(asked) == 1
    assert asked[0][0] == "tcp://10.1.2.3:8786" and "not encrypted" in asked[0][1]
    assert "declined" in refused[0] and "tls://" in refused[0]

    assert session.finetune() is True  # asked again (a No is not remembered): Yes
    assert session.finetune() is True  # remembered for this address: not asked
    assert len(asked) == 2 and started == ["tcp://10.1.2.3:8786"] * 2

    session.scheduler = "tcp://10.9.9.9:8786"  # another address is asked about
    with pytest.raises(IndexError):  # no answer left: proves it asked
        session.finetune()
    session.scheduler, session.confirm_unencrypted = "tcp://127.0.0.1:8786", None
    assert session.finetune() is True  # this machine: never asked
