"""Shared fixtures. Tests never touch the network (HF_HUB_OFFLINE=1) and never write outside tmp dirs,
except the trained-predictor cache, which goes to one temporary folder per session (shared by pytest-xdist's
workers, which wait for each other's training: kvstudy/latency/models.py ``_build_lock``)."""
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvstudy.running.paths import SHARED_REFERENCE  # noqa: E402

SHARED_REASON = f"needs the shared reference data at {SHARED_REFERENCE} (set KVSTUDY_SHARED to its path)"
needs_shared = pytest.mark.skipif(not SHARED_REFERENCE.exists(), reason=SHARED_REASON)


#: the longest tests (CPU seconds on one worker from a cold cache, `--durations=0 -n 0`, issue 54 item 4), most first.
#: Under pytest-xdist they start first, so a run's last minutes are short tests spread over every worker instead of one
#: long test on one worker while the others idle. A prefix of a node id; the rest keep their order, slow tests first.
LONG_FIRST = (
)


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: the order changes nothing but fixtures' set-ups
        return

    def rank(item):
        for i, prefix in enumerate(LONG_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(LONG_FIRST) + (0 if item.get_closest_marker("slow") else 1)

    items.sort(key=rank)  # stable: the order within a rank is the collection's


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    if "KVSTUDY_TEST_CACHE" in os.environ:  # reuse trained tables across local test runs
        os.environ["KVSTUDY_CACHE_DIR"] = os.environ["KVSTUDY_TEST_CACHE"]
    else:
        root = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base folder lies in the run's shared one
            root = root.parent
        (root / "kvcache").mkdir(exist_ok=True)
        os.environ["KVSTUDY_CACHE_DIR"] = str(root / "kvcache")
    yield


@pytest.fixture(scope="session")
def llama_tp2_latency():
    """Vidur's predictor for llama2_70b on a100_tp2 (trained once per session, ~20 s cold)."""
    from kvstudy.latency.models import vidur
    from kvstudy.latency.tables import HardwareSpec
    from kvstudy.running.paths import load_model_arch

    return vidur(load_model_arch("llama2_70b"), HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2),
                 capacity_tokens=16492)


def make_instance(prompt, output, arrival=None):
    from kvstudy.workloads.requests import make_requests

    n = len(prompt)
    return make_requests(np.zeros(n) if arrival is None else arrival, prompt, output, source="test")
