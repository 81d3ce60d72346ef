"""One LocalCluster of one worker process for the remote tests (starting one costs seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def client():
    """A client of a real LocalCluster: one worker process, two task threads.

    The training task gives torch the process's CPUs divided among the task
    threads: two threads on the 2-core test machines leave it one, as in the test
    process, so a run there does the in-process run's arithmetic to the bit (with
    AdamW, a bias under a norm layer turns sums in another order into
    learning-rate-sized differences).
    """
    from distributed import Client, LocalCluster

    cluster = LocalCluster(processes=True, n_workers=1, threads_per_worker=2,
                           dashboard_address=":0")
    with Client(cluster) as c:
        yield c
    cluster.close()
