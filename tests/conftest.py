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
    # the notebooks (each builds its own small results, ~20-120 s; 05, 06 and 08 share Llama-3.1-8B's predictor,
    # trained by the first of them while the others wait for it: apart, so that a worker rarely waits)
    "tests/running/test_notebooks.py::test_notebook_executes[01", "tests/running/test_notebooks.py::test_notebook_executes[05",
    "tests/running/test_notebooks.py::test_notebook_executes[03", "tests/running/test_notebooks.py::test_notebook_executes[02",
    "tests/running/test_notebooks.py::test_notebook_executes[04", "tests/running/test_notebooks.py::test_notebook_executes[07",
    "tests/running/test_notebooks.py::test_notebook_executes[08", "tests/running/test_notebooks.py::test_notebook_executes[06",
    "tests/running/test_output_paths.py::test_the_command_keeps_a_finished_run_and_hydras_record_of_it",
    "tests/running/test_readme.py::test_readme_command_runs[python -m kvstudy +experiment=cacheopt_main",
    "tests/running/test_readme.py::test_readme_command_runs[python -m kvstudy.optimum study",
    "tests/policies/test_policy_guide.py::test_commands_run_as_written",
    "tests/policies/test_policies.py::test_oracle_policies_never_exceed_memory",
    "tests/running/test_readme.py::test_readme_command_runs[python -m kvstudy +experiment=rr_sjf",
    "tests/studies/test_optimum_stop.py::test_a_study_that_finished_trials_reports_them_when_stopped",
    "tests/running/test_first_hour.py::test_training_a_predictor_shows_its_progress",
    "tests/studies/test_optimum_search.py::test_lns_improves_feasibly_and_deterministically",
    "tests/running/test_reproduce.py::test_a_tiny_paper_end_to_end",
    # the fast tier's longest
    "tests/running/test_workflow.py::test_policy_keys_on_an_experiment_sweeping_policies",
    "tests/studies/test_hardware.py::test_study_hardware_runs_timed_by_vidur",
    "tests/studies/test_latency.py::test_tables_match_vidur_get_execution_time",
    "tests/studies/test_optimum_study.py::test_worker_processes_give_the_same_rows_and_checkpoint",
    "tests/studies/test_profiles.py::test_real_vidur_profiles_take_the_same_path",
    "tests/studies/test_optimum_cpsat.py::test_cpsat_never_returns_worse_than_its_start",
    "tests/running/test_cli.py::test_latency_printout",
    "tests/cacheopt/test_cacheopt_speed.py::test_same_decisions_as_before_the_speed_up",
    "tests/config/test_user_traps.py::test_interrupted_run_keeps_what_is_done",
    "tests/config/test_cli_checks.py::test_a_sweep_prints_one_line_per_run_and_a_summary",
    "tests/memory/test_prefix_engine.py::test_hits_equal_the_independent_count_on_mooncake",
    "tests/memory/test_prefix_cache.py::test_cache_hits_equal_the_independent_count_on_mooncake",
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
