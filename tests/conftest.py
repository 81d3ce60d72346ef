"""Shared test set-up: deterministic torch on a small thread budget."""

import os

import pytest

# Two cores here and several processes at once: keep torch from oversubscribing.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True)
def _seed_torch():
    import torch

    torch.manual_seed(0)
    yield
