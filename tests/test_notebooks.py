"""Notebooks execute headless against small sweeps produced here (the CI small-volume variant), and
committed notebooks carry no outputs."""
import subprocess
import sys

import nbformat
import pytest

from kvstudy.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
SMALL = {  # experiment -> overrides that shrink it (same code path, fewer and smaller runs)
    "table1": ["seed=0,1", "workload.num_requests=150"],
    "table1_fixed_set": ["seed=0,1", "workload.num_requests=150"],
    "fig3": ["+algo=mcsf,mc_benchmark,a030,a010_b010", "workload.num_requests=100,200"],
    "fig5": ["seed=0", "workload.num_requests=150"],
    "fig5_reference": ["seed=0", "workload.num_requests=150"],
    "fig5_remedy": ["seed=0", "workload.num_requests=150"],
    "alpha_beta_sweep": ["policy.alpha=0.1,0.2", "policy.beta=0.1,0.2", "seed=0", "workload.num_requests=150"],
    "rr_sjf_policies": ["workload.num_requests=60", "memory.capacity_tokens=4000", "seed=0,1"],
    "rr_sjf_quantum": ["policy.steps_before_preemption=5,50", "workload.num_requests=60", "memory.capacity_tokens=4000"],
    "rr_sjf_noise": ["predictor.sigma=0,100", "seed=0,1", "workload.num_requests=60", "memory.capacity_tokens=4000"],
    "rr_sjf_rate": ["demand.rate=10,50", "seed=0,1", "workload.num_requests=60", "memory.capacity_tokens=4000"],
    "three_papers": ["seed=0", "+demand=high", "workload.num_requests=60"],
}
#: where an experiment's sweep goes under the results root (default: its name)
FOLDER = {f"rr_sjf_{part}": f"rr_sjf/llama32_1b_l4_tp1/{part}" for part in ("policies", "quantum", "noise", "rate")}


def run(args, **kw):
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="session")
def small_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for name, overrides in SMALL.items():
        run(["kvstudy", f"+experiment={name}", *overrides, f"hydra.sweep.dir={root / FOLDER.get(name, name)}"])
    for demand in ("high", "low"):
        run(["kvstudy.studies", "alpha-search", f"+demand={demand}", "workload.num_requests=150",
             f"out={root / 'alpha_search'}"])
    for model in (1, 2):
        run(["kvstudy.optimum", "study", "--model", str(model), "--trials", "2", "--time-limit", "1", "--lns", "1",
             "--out", str(root / "optimum" / f"model{model}.parquet")])
    cut = ["kvstudy.optimum", "study", "--model", "1", "--trials", "2", "--cut", "8", "--lns", "1"]
    run([*cut, "--time-limit", "5", "--solver", "branch", "--out", str(root / "optimum" / "model1_cut8.parquet")])
    run([*cut, "--time-limit", "0", "--lp", "--out", str(root / "optimum" / "model1_lp.parquet")])
    return root


def test_committed_notebooks_have_no_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs committed"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, small_results, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("KVSTUDY_RESULTS", str(small_results))
    monkeypatch.setenv("KVSTUDY_SCALE_N", "300")  # notebook 02: the at-scale bound on a smaller workload
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "no results at" not in text and "no " + str(small_results) not in text, text[:2000]
    assert any((small_results / "figures").glob("*.png"))
