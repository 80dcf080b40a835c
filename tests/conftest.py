"""Test-suite wiring: GPU tests skip cleanly without CUDA; multi-GPU tests without two GPUs."""
from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    n_gpus = torch.cuda.device_count() if has_cuda else 0
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and n_gpus < 2:
            item.add_marker(skip_multi)


@pytest.fixture
def one_thread():
    """One OpenMP thread for the test: on 2 shared cores, two threads spin against each other and
    against the other tests' rank processes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True, scope="session")
def _bench_results_to_tmp(tmp_path_factory):
    """Benchmark smoke tests write their JSON records to a temp dir, never into bench/results/."""
    import os

    if "GOBRRR_BENCH_RESULTS" in os.environ:
        yield
        return
    os.environ["GOBRRR_BENCH_RESULTS"] = str(tmp_path_factory.mktemp("bench-results"))
    yield
    os.environ.pop("GOBRRR_BENCH_RESULTS", None)
