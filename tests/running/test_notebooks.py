"""Notebooks execute headless against small sweeps produced here (the CI small-volume variant), and
committed notebooks carry no outputs."""
import subprocess
import sys

import nbformat
import pytest

from kvstudy.running.paths import REPO_ROOT
from tests.small import AUTHORS_REGIME, FOLDER, PAPER_REGIME, SMALL

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def run(args, **kw):
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _regimes_and_alpha_search(root):
    """Notebook 01's other settings: the paper's likely hardware, the authors' regime, the alpha searches."""
    for name in PAPER_REGIME:
        run(["kvstudy", f"+experiment={name}", *SMALL[name], "hardware=a100_vidur_default",
             f"hydra.sweep.dir={root / name / 'a100_vidur_default'}"])
    for name in AUTHORS_REGIME:
        run(["kvstudy", f"+experiment={name}", *SMALL[name], "regime=authors",
             f"hydra.sweep.dir={root / name / 'authors'}"])
    for folder, setting in (("a100_tp2", "hardware=a100_tp2"), ("a100_vidur_default", "hardware=a100_vidur_default"),
                            ("authors", "regime=authors")):
        for demand in ("high", "low"):
            run(["kvstudy.studies", "alpha-search", f"+demand={demand}", "workload.num_requests=150", setting,
                 f"out={root / 'alpha_search' / folder}"])


def _hindsight_optimum(root):
    for model in (1, 2):
        run(["kvstudy.optimum", "study", "--model", str(model), "--trials", "2", "--time-limit", "1", "--lns", "1",
             "--out", str(root / "optimum" / f"model{model}.parquet")])
    cut = ["kvstudy.optimum", "study", "--model", "1", "--trials", "2", "--cut", "8", "--lns", "1"]
    run([*cut, "--time-limit", "5", "--solver", "branch", "--out", str(root / "optimum" / "model1_cut8.parquet")])
    run([*cut, "--time-limit", "0", "--lp", "--out", str(root / "optimum" / "model1_lp.parquet")])


#: notebook 10's grid, small: the study's shape (co-located, pipeline stages, a split; a GPU without a price) on the
#: linear latency model, 120 requests
SEARCH_SPEC = """
overrides: [model=llama31_8b, latency=linear, latency.d0=0.05, latency.d1=0.001, workload=lmsys,
            workload.num_requests=120, memory=paged, memory.capacity_tokens=auto, +demand=high,
            router=least_outstanding]
criterion: latency:metric=ttft,quantile=0.9,seconds=0.5
gpu_budget: 8
search: {start: 4.0, tolerance: 0.25, max_rate: 64}
grid:
  hardware: [a100_tp1, a40_tp1]
  pipeline: [1, 2]
  replicas: [1, 2]
  deployments: [p1d3]
  policies:
    vllm: [{}]
    mcsf: [{}]
"""


def _deployment_search(root):
    spec = root / "study_llama31_8b_lmsys.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(SEARCH_SPEC)
    run(["kvstudy.search", "grid", str(spec), "--prices", "runpod", "--jobs", "2", "--out",
         str(root / "search" / "study_llama31_8b_lmsys")])


#: the small experiments (tests/small.py) each notebook reads, and its other commands. Each notebook's results are
#: built into a folder of its own, so the notebooks are independent tests that pytest-xdist spreads over its workers
#: (one session fixture building everything held one worker for ~6.5 minutes; issue 54, item 4). A notebook whose
#: results are missing prints "no results at ..." and fails below.
EXPERIMENTS = {
    "01_mcsf_paper": ("table1", "table1_fixed_set", "table1_batch_cap", "fig3", "fig5", "fig5_reference",
                      "fig5_remedy", "alpha_beta_sweep"),
    "02_hindsight_optimum": (),
    "03_rr_sjf": ("rr_sjf_policies", "rr_sjf_quantum", "rr_sjf_noise", "rr_sjf_rate", "three_papers"),
    "04_cacheopt": ("cacheopt_motivation", "cacheopt_main", "cacheopt_ablation", "cacheopt_sensitivity"),
    "05_prefix_caching": ("prefix_mooncake", "prefix_sessions"),
    "06_cluster": ("cluster_lmsys", "cluster_mooncake"),
    "07_hardware": ("hardware", "hardware_table1", "hardware_rr_sjf", "hardware_cacheopt"),
    "08_offload": ("offload_mooncake", "offload_mooncake_cluster"),
    "09_disaggregation": ("disaggregation", "disaggregation_hardware", "disaggregation_link"),
    "10_deployment_search": (),
}
OTHER_COMMANDS = {"01_mcsf_paper": _regimes_and_alpha_search, "02_hindsight_optimum": _hindsight_optimum,
                  "10_deployment_search": _deployment_search}


def build_results(notebook: str, root):
    for name in EXPERIMENTS[notebook]:
        run(["kvstudy", f"+experiment={name}", *SMALL[name], f"hydra.sweep.dir={root / FOLDER.get(name, name)}"])
    if notebook in OTHER_COMMANDS:
        OTHER_COMMANDS[notebook](root)


def test_every_notebook_and_small_experiment_is_built():
    assert sorted(EXPERIMENTS) == sorted(p.stem for p in NOTEBOOKS)
    built = [name for names in EXPERIMENTS.values() for name in names]
    assert sorted(built) == sorted(SMALL), "each experiment of tests/small.py is built once, for the notebook reading it"


def test_committed_notebooks_have_no_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs committed"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    small_results = tmp_path / "results"
    build_results(path.stem, small_results)
    monkeypatch.setenv("KVSTUDY_RESULTS", str(small_results))
    monkeypatch.setenv("KVSTUDY_SCALE_N", "300")  # notebook 02: the at-scale bound on a smaller workload
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "no results at" not in text and "no " + str(small_results) not in text, text[:2000]
    assert any((small_results / "figures").glob("*.png"))
