"""One LocalCluster of one worker process for the remote tests (starting one costs seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def client():
    """A client of a real LocalCluster: one worker process, one thread."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                           dashboard_address=":0")
    with Client(cluster) as c:
        yield c
    cluster.close()
