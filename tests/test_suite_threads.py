"""The suite's own budget (issue 51 item 12): each xdist worker's torch takes its share of the cores, not all of
them (tests/conftest.py). Two workers with a thread per core each put 4 spinning OpenMP threads on 2 cores, and a
test ran 2-14x slower than alone (the suite 969 s against 492 s on the same machine)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="a plain (-n 0) run takes every core")
def test_each_worker_takes_its_share_of_the_cores():
    import torch

    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    cores = os.cpu_count() or 1
    if "OMP_NUM_THREADS" in os.environ and os.environ.get("OMP_NUM_THREADS") != str(max(1, cores // workers)):
        pytest.skip("the caller set OMP_NUM_THREADS")
    assert torch.get_num_threads() == max(1, cores // workers)
    assert torch.get_num_threads() * workers <= max(cores, workers)
