"""``python -m kvstudy.reproduce mcsf|rr_sjf|cacheopt|prefix|cluster|hardware|disaggregation|offload|search|all [--dry-run] [--figures-only] [--jobs N] [--gallery]
[-- OVERRIDES]``

One command per paper: every experiment of the paper (the table ``PAPERS`` below, the one list of them), one after
another, then the paper's notebooks executed headless to HTML.

* Each experiment is a command of the README's "The papers' experiments" (``python -m kvstudy +experiment=... -m``
  sweeps, the α search, the hindsight-optimum study, ...). Re-running is cheap: a sweep skips its finished runs, the
  optimum study resumes (``--resume``), and a command whose output file exists is not run again. So a stopped
  reproduction (Ctrl-C, a crash, a killed job) goes on where it stopped when the same command is given again.
  A sweep skips a finished run only if kvstudy's code is the code that made it (``resume=code``,
  kvstudy/running/provenance.py); ``-- resume=config`` keeps every finished run of the same config whatever the code.
* Progress: one line per experiment, ``[k/N] <command>`` then its wall time (and how many of its runs were done
  before). Each command's own output goes to ``outputs/reproduce/<paper>/logs/``.
* The notebooks (``notebooks/``) then run headless on the results and are written as HTML to
  ``outputs/reproduce/<paper>/<notebook>.html``; their figures go to ``outputs/figures/`` as always.
  ``--gallery`` also copies the paper's key figures, shrunk, to ``docs/gallery/`` (docs/gallery.md shows them).
* ``--dry-run`` prints the commands and exits; ``--figures-only`` runs no experiment, only the notebooks on the
  results there are; ``--jobs N`` is each sweep's ``hydra.launcher.n_jobs=N`` (and the optimum study's ``--jobs``);
  Hydra overrides after ``--`` are added to every ``python -m kvstudy`` command and α search (an override of a key
  the command sets itself replaces it), e.g. ``-- hardware=a100_vidur_default``.

Everything runs in the current directory, as the README's commands do: results under ``./outputs``.
A failing experiment stops the reproduction with one ``error:`` line naming it, why (its first ``error:`` line),
its command and its log (exit 1); a bad argument, or an override after ``--`` that an experiment's command would
refuse (checked for every experiment before anything runs, ``--dry-run`` too), gives one ``error:`` line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from kvstudy.errors import ConfigError, report
from kvstudy.running.paths import REPO_ROOT, prepare_dir

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
GALLERY_DIR = REPO_ROOT / "docs" / "gallery"
INSTALL_NOTEBOOKS = 'pip install -e ".[notebooks]"'


@dataclass(frozen=True)
class Step:
    """One experiment: ``python -m <module> <args...>``."""

    module: str
    args: Tuple[str, ...]
    item: str                       # what of the paper it produces
    seconds: float                  # wall time on 2 cores, warm predictor cache (docs/benchmarks.md; rounded)
    output: Optional[str] = None    # a file it writes last (relative to the working directory): present -> done

    @property
    def hydra(self) -> bool:
        """Takes Hydra overrides (a sweep, or the α search)."""
        return self.module in ("kvstudy", "kvstudy.studies")

    @property
    def sweep(self) -> bool:
        return self.module == "kvstudy"

    def command(self) -> str:
        return " ".join(["python", "-m", self.module, *self.args])


@dataclass(frozen=True)
class Paper:
    title: str
    steps: Tuple[Step, ...]
    notebooks: Tuple[str, ...]                  # file names in notebooks/
    gallery: Tuple[str, ...] = field(default=())  # figures (paths under the results folder) for docs/gallery/


def _sweep(experiment: str, *overrides: str, item: str, seconds: float) -> Step:
    return Step("kvstudy", (f"+experiment={experiment}", *overrides), item, seconds)


def _alpha_search(demand: str, *overrides: str, folder: str, seconds: float) -> Step:
    return Step("kvstudy.studies", ("alpha-search", f"+demand={demand}", *overrides),
                "smallest terminating alpha", seconds, output=f"outputs/alpha_search/{folder}/{demand}.json")


def _mcsf() -> Tuple[Step, ...]:
    # Notebook 01 shows three regimes side by side (docs/findings.md): kvstudy's default (Vidur, a100_tp2), what
    # the authors' scripts ran (regime=authors) and one A100 timing all layers (hardware=a100_vidur_default).
    # Seconds: docs/benchmarks.md (2026-11-24 and, for regime=authors, 2026-11-25).
    sweeps = [("table1", "Table 1, Figs. 4, 7"), ("table1_fixed_set", "Table 1, one fixed request set"),
              ("fig3", "Fig. 3, Figs. 8, 11"), ("fig5", "Fig. 5"), ("fig5_remedy", "Fig. 5, remedy"),
              ("fig5_reference", "Fig. 5, oracle reference"), ("alpha_beta_sweep", "Figs. 9, 10, 12, 13")]
    default_s = {"table1": 15, "table1_fixed_set": 14, "fig3": 22, "fig5": 13, "fig5_remedy": 8, "fig5_reference": 5,
                 "alpha_beta_sweep": 28}
    authors_s = {"table1": 36, "table1_fixed_set": 31, "fig3": 91, "fig5": 19, "fig5_remedy": 7, "fig5_reference": 4,
                 "alpha_beta_sweep": 34}
    steps = [_sweep(name, item=item, seconds=default_s[name]) for name, item in sweeps]
    steps += [_alpha_search("high", folder="a100_tp2", seconds=4), _alpha_search("low", folder="a100_tp2", seconds=1)]
    steps += [_sweep(name, "regime=authors", item=f"{item} (authors' regime)", seconds=authors_s[name])
              for name, item in sweeps]
    steps.append(_sweep("table1_batch_cap", item="Table 1's alpha-benchmarks under batch caps 64, 128, 256",
                        seconds=32))
    steps += [_alpha_search(d, "regime=authors", folder="authors", seconds=s) for d, s in (("high", 10), ("low", 1))]
    for cap in (64, 128, 256):
        folder = f"authors_B{cap}"
        steps += [_alpha_search(d, "regime=authors", f"engine.max_batch={cap}", f"out=outputs/alpha_search/{folder}",
                                folder=folder, seconds=5) for d in ("high", "low")]
    steps += [_sweep(name, "hardware=a100_vidur_default", item=f"{item} (one A100 timing all layers)",
                     seconds=default_s[name]) for name, item in sweeps]
    steps += [_alpha_search(d, "hardware=a100_vidur_default", folder="a100_vidur_default", seconds=s)
              for d, s in (("high", 4), ("low", 1))]
    # Sec. 5.1, Fig. 2: MC-SF against the hindsight optimum (notebook 02); --resume finishes a stopped study
    steps += [Step("kvstudy.optimum", ("study", "--model", str(m), "--trials", "200", "--time-limit", "0", "--lns", "2",
                                       "--resume"), f"Sec. 5.1, Fig. 2, Arrival Model {m}", 600) for m in (1, 2)]
    return tuple(steps)


def _rr_sjf() -> Tuple[Step, ...]:
    steps = [_sweep("rr_sjf_policies", item="Figs. 3, 4, 9", seconds=8),
             _sweep("rr_sjf_quantum", item="Fig. 2", seconds=33),
             _sweep("rr_sjf_noise", item="Figs. 5, 6", seconds=51),
             _sweep("rr_sjf_rate", item="Figs. 7, 8", seconds=50)]
    # notebook 03's other setups (seconds: measured 2026-11-26 with one worker, the others on two)
    other = (("llama32_1b", "a100_tp1", 15), ("llama2_70b", "a100_tp2", 80), ("opt_13b", "a100_tp1", 20))
    steps += [_sweep("rr_sjf_policies", f"model={m}", f"hardware={h}", item="Figs. 3, 4, 9 on another setup", seconds=s)
              for m, h, s in other]
    steps.append(_sweep("three_papers", item="all three papers' schedulers on one paged memory", seconds=62))
    return tuple(steps)


def _cacheopt() -> Tuple[Step, ...]:
    # The whole study of issues 25 and 33 (docs/cacheopt.md), about an hour on 2 cores; scripts/cacheopt_study.sh
    # runs this list. Rates dense across each trace's knee in this simulator.
    opt175 = ("model=opt_175b", "hardware=a100_tp8")
    main = {"sharegpt": "0.18,0.2,0.21,0.22,0.23,0.24,0.25", "alpaca": "1.5,2,2.25,2.5,2.75,3",
            "bookcorpus": "0.75,0.8,0.85,0.9,0.95,1.0"}
    ablation = {"sharegpt": "0.22", "alpaca": "2.5", "bookcorpus": "0.9"}
    main175 = {"sharegpt": "0.09,0.1,0.11,0.115,0.12,0.125", "alpaca": "0.5,0.6,0.7,0.8,0.9,1.0",
               "bookcorpus": "0.45,0.5,0.55,0.6,0.65,0.7"}
    ablation175 = {"sharegpt": "0.115", "alpaca": "1.0", "bookcorpus": "0.5"}
    knobs = [("policy.slo.scale=0.5,1.0,1.5,2.0,2.5",), ("memory.block_size=4,8,16,32",), ("policy.m=0,1,2,4,8",),
             ("policy.reserve_blocks=0,2,4,8,16",), ("policy.adaptive=true", "policy.alpha=0.5,0.6,0.7,0.8,0.9,1.0"),
             ("policy.adaptive=true", "policy.beta=0.001,0.01,0.1,1.0"), ("policy.confidence=0.5,0.8,0.9,0.95,0.99",)]
    steps = [_sweep("cacheopt_main", f"workload={w}", f"demand.scale={s}", item=f"Figs. 12-13, {w}, OPT-13B",
                    seconds=600) for w, s in main.items()]
    steps += [_sweep("cacheopt_ablation", f"workload={w}", f"demand.scale={s}", item=f"Figs. 14-15, {w}, OPT-13B",
                     seconds=60) for w, s in ablation.items()]
    steps += [_sweep("cacheopt_sensitivity", *k, item="Fig. 17", seconds=60) for k in knobs]
    steps += [_sweep("cacheopt_main", *opt175, f"workload={w}", f"demand.scale={s}", item=f"Figs. 12-13, {w}, OPT-175B",
                     seconds=400) for w, s in main175.items()]
    steps += [_sweep("cacheopt_ablation", *opt175, f"workload={w}", f"demand.scale={s}",
                     item=f"Figs. 14-15, {w}, OPT-175B", seconds=60) for w, s in ablation175.items()]
    steps.append(_sweep("cacheopt_motivation", item="motivation study, Figs. 1-3", seconds=18))
    steps.append(Step("kvstudy.preemption_cost", ("model=opt_13b", "hardware=a100_tp1"),
                      "swap vs recompute cost, Fig. 8", 3, output="outputs/preemption_cost/opt_13b_a100_tp1_pcie.png"))
    return tuple(steps)


def _prefix() -> Tuple[Step, ...]:
    # issue 36's study (docs/prefix_caching.md); seconds measured 2026-11-26 with two workers
    return (_sweep("prefix_mooncake", item="Mooncake's conversation trace: capacity x load x policy", seconds=1500),
            _sweep("prefix_mooncake", "+policy=vllm", "memory.prefix_caching=false", item="the same without a cache",
                   seconds=400),
            _sweep("prefix_mooncake", "+policy=sarathi,sarathi_lpm", item="the same with chunked prefill, FCFS and LPM",
                   seconds=900),
            _sweep("prefix_sessions", item="real multi-turn conversations: capacity x session rate x policy",
                   seconds=300),
            _sweep("prefix_sessions", "+policy=vllm", "memory.prefix_caching=false", item="the same without a cache",
                   seconds=100))


def _cluster() -> Tuple[Step, ...]:
    # issue 37's study (docs/cluster.md); seconds measured 2026-11-26 with two workers
    return (_sweep("cluster_lmsys", item="LMSYS-like, MC-SF setting: policy x router x 4/8 replicas", seconds=70),
            _sweep("cluster_mooncake", item="Mooncake with prefix caching: policy x router x 4/8 replicas",
                   seconds=1000))


def _disaggregation() -> Tuple[Step, ...]:
    # issue 57's studies (docs/disaggregation_findings.md, notebook 09); seconds measured 2026-11-29, one worker
    return (_sweep("disaggregation", item="prefill/decode pools vs co-located: policy x deployment x rate", seconds=30),
            _sweep("disaggregation_hardware", item="A100 and H100, conversation and code: policy x deployment x rate",
                   seconds=170),
            _sweep("disaggregation_hardware", "+deployment=ha_p1d3,ha_p2d2,ha_p3d1", "hardware=a100_tp2",
                   item="H100 prefill, A100 decode (Splitwise-HA): policy x deployment x rate", seconds=80),
            _sweep("disaggregation_link", item="the KV link from 1 to 50 GB/s per GPU (vLLM, 1P:3D)", seconds=10))


#: issue 58's study: one grid per model and workload (kvstudy/search/specs/study_*.yaml, notebook 10)
SEARCH_SPECS = ("study_llama2_70b_splitwise_conv", "study_llama2_70b_lmsys", "study_llama31_8b_splitwise_conv",
                "study_llama31_8b_lmsys")


def _search() -> Tuple[Step, ...]:
    # seconds: the grids with --jobs 2 on this machine, 2026-11-29 (docs/search.md)
    seconds = {"study_llama2_70b_splitwise_conv": 515, "study_llama2_70b_lmsys": 355,
               "study_llama31_8b_splitwise_conv": 405, "study_llama31_8b_lmsys": 214}
    return tuple(Step("kvstudy.search", ("grid", spec, "--prices", "runpod", "--out", f"outputs/search/{spec}"),
                      f"the deployment search: {spec[len('study_'):]}", seconds[spec],
                      output=f"outputs/search/{spec}/results.parquet") for spec in SEARCH_SPECS)


def _hardware() -> Tuple[Step, ...]:
    # issue 48's study (docs/findings.md "GPUs beyond the A100", notebook 07); seconds measured 2026-11-28 with two
    # workers, warm predictor cache (a cold one adds a training per model and GPU: docs/findings.md)
    return (_sweep("hardware_rr_sjf", item="RR-SJF vs FCFS on four GPUs", seconds=6),
            _sweep("hardware_table1", item="Table 1's MC-SF vs MC-Benchmark on four GPUs", seconds=12),
            _sweep("hardware", item="three_papers' like-for-like table on four GPUs", seconds=29),
            _sweep("hardware_cacheopt", item="CacheOPT vs vLLM and Sarathi on four GPUs", seconds=31))


def _offload() -> Tuple[Step, ...]:
    # issue 49's study (docs/prefix_caching.md "Offload tier", notebook 08); seconds measured 2026-11-28, two workers
    return (_sweep("offload_mooncake", item="host tier x load mode x policy, one A100", seconds=200),
            _sweep("offload_mooncake_cluster", item="own tiers or a shared pool, four A100s", seconds=200))


#: The papers' experiments: the one list (the README and scripts/cacheopt_study.sh point here).
PAPERS: Dict[str, Paper] = {
    "mcsf": Paper("MC-SF (Jaillet et al.)", _mcsf(), ("01_mcsf_paper.ipynb", "02_hindsight_optimum.ipynb"),
                  ("figures/fig3_latency_vs_volume_authors.png", "figures/fig3_latency_vs_volume_a100_tp2.png",
                   "figures/fig4_throughput_authors.png", "figures/fig5_prediction_error.png",
                   "figures/fig9_10_12_13_alpha_beta_authors.png",
                   "figures/fig2_ratio_histograms.png")),
    "rr_sjf": Paper("RR-SJF (Gogineni et al.)", _rr_sjf(), ("03_rr_sjf.ipynb",),
                    ("figures/rr_sjf_fig3_ttft.png", "figures/rr_sjf_fig2_quantum.png",
                     "figures/rr_sjf_fig5_6_noise.png", "figures/rr_sjf_fig7_8_rate.png")),
    "cacheopt": Paper("CacheOPT (Shen et al.)", _cacheopt(), ("04_cacheopt.ipynb",),
                      ("figures/cacheopt_fig1_time_split.png", "figures/cacheopt_fig12_13_opt_13b_a100_tp1.png",
                       "figures/cacheopt_fig14_15_opt_13b_a100_tp1.png", "figures/cacheopt_fig17_opt_13b_a100_tp1.png",
                       "preemption_cost/opt_13b_a100_tp1_pcie.png")),
    "prefix": Paper("Prefix caching (issue 36; beyond the papers)", _prefix(), ("05_prefix_caching.ipynb",),
                    ("figures/prefix_sessions.png",)),
    "cluster": Paper("Several replicas behind a router (issue 37; beyond the papers)", _cluster(),
                     ("06_cluster.ipynb",)),
    "hardware": Paper("GPUs beyond the A100 (issue 48; beyond the papers)", _hardware(), ("07_hardware.ipynb",)),
    "disaggregation": Paper("Prefill/decode disaggregation (issue 57; beyond the papers)", _disaggregation(),
                            ("09_disaggregation.ipynb",)),
    "search": Paper("The deployment search (issue 58; beyond the papers)", _search(), ("10_deployment_search.ipynb",)),
    "offload": Paper("A KV offload tier behind the prefix cache (issue 49; beyond the papers)", _offload(),
                     ("08_offload.ipynb",)),
}


def _parser() -> argparse.ArgumentParser:
    from kvstudy.config.validate import one_line_parser  # usage errors in one line, as every kvstudy command's

    p = one_line_parser()(prog="python -m kvstudy.reproduce",
                description="Run a paper's experiments (resumable), then execute its notebooks to HTML.")
    p.add_argument("paper", help=f"{', '.join(PAPERS)} or all")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every kvstudy command (after --)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("--figures-only", action="store_true", help="run no experiment; execute the notebooks only")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes per sweep (hydra.launcher.n_jobs)")
    p.add_argument("--gallery", action="store_true", help="copy the paper's key figures, shrunk, to docs/gallery/")
    return p


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def command_args(step: Step, jobs: Optional[int] = None, overrides: Sequence[str] = ()) -> List[str]:
    """The step's arguments after ``python -m <module>``, with --jobs and the extra overrides applied."""
    args = list(step.args)
    if step.hydra and overrides:
        keys = {_key(o) for o in overrides}
        args = [a for a in args if "=" not in a or _key(a) not in keys] + list(overrides)
    if jobs is not None:
        if step.sweep:
            args.append(f"hydra.launcher.n_jobs={jobs}")
        elif step.module in ("kvstudy.optimum", "kvstudy.search"):
            args += ["--jobs", str(jobs)]
    return args


def plan(paper: str, jobs: Optional[int] = None, overrides: Sequence[str] = ()) -> List[Tuple[Step, List[str]]]:
    """(step, arguments) of a paper, in order, without repeats (extra overrides can make two steps one)."""
    out, seen = [], set()
    for step in PAPERS[paper].steps:
        args = command_args(step, jobs, overrides)
        key = (step.module, tuple(args))
        if key not in seen:
            seen.add(key)
            out.append((step, args))
    return out


def _shown(module: str, args: Sequence[str]) -> str:
    import shlex

    return " ".join(["python", "-m", module, *(shlex.quote(a) for a in args)])


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


_LAUNCHED = re.compile(r"^\[kvstudy launcher\] (\d+) runs", re.M)
_SKIPPED = re.compile(r": complete already, skipped$", re.M)
_STALE = "a finished run of this config was made by other code"  # kvstudy/running/execute.py's warning (resume=code)


def _sweep_note(log: Path) -> str:
    """', N runs (K done before, S re-run: made by other code)' from a sweep's log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    runs = sum(int(n) for n in _LAUNCHED.findall(text))
    if not runs:
        return ""
    skipped, stale = len(_SKIPPED.findall(text)), text.count(_STALE)
    notes = ([f"{skipped} done before"] if skipped else []) + \
        ([f"{stale} re-run: finished by other code, see resume=config"] if stale else [])
    return f", {runs} runs" + (f" ({'; '.join(notes)})" if notes else "")


def failure_reason(log: Path) -> str:
    """Why a command failed, from its log: its first ``error:`` line (and how many more there are), else the log's
    last line (a traceback's exception), so the terminal says it and not only the log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]  # the first line is the command
    errors = [ln[len("error: "):] for ln in lines if ln.startswith("error: ")]
    if errors:
        return errors[0] + (f" (and {len(errors) - 1} more error line(s) in the log)" if len(errors) > 1 else "")
    return lines[-1] if lines else ""


def check_step_overrides(papers: Sequence[str], jobs: Optional[int], overrides: Sequence[str]) -> None:
    """The overrides after ``--`` in every experiment's command line, checked as ``python -m kvstudy`` checks its own
    (kvstudy/config/validate.py ``check_overrides``: a key no chosen option has or takes, a group chosen twice, ...),
    before anything runs, with or without --dry-run: one error line naming the experiment. Then their values: every
    experiment composed with them and each of its runs checked (kvstudy/running/precheck.py ``check_runs``), so a value
    every run would refuse (``memory.offload.host_gb=-1``, ``cluster.replicas=2`` on a study of one replica's load)
    stops here, not in each run."""
    if not overrides:
        return
    from kvstudy.config.validate import check_overrides
    from kvstudy.running.precheck import check_runs

    todo = []
    for paper in papers:
        steps = plan(paper, jobs, overrides)
        for k, (step, args) in enumerate(steps, 1):
            if step.module == "kvstudy":
                argv = list(args)
            elif step.module == "kvstudy.studies":  # the alpha search composes +policy=alpha_greedy with them
                argv = ["+policy=alpha_greedy"] + [a for a in args[1:] if not a.startswith("out=")]
            else:
                continue
            where = (f" (-- {' '.join(overrides)}, in experiment {k}/{len(steps)} of {paper}: "
                     f"{_shown(step.module, args)})")
            try:
                check_overrides(argv)
            except ConfigError as exc:
                raise ConfigError(f"{exc}{where}") from None
            todo.append((argv, where))
    print(f"checking the overrides' values in every run of {len(todo)} experiment(s) ...", file=sys.stderr, flush=True)
    for argv, where in todo:
        try:
            check_runs(argv)
        except ConfigError as exc:
            raise ConfigError(f"{exc}{where}") from None


def run_steps(paper: str, results: Path, jobs: Optional[int], overrides: Sequence[str]) -> Optional[str]:
    """Run a paper's experiments in order; None, or the one-line error of the first that failed."""
    steps = plan(paper, jobs, overrides)
    logs = results / "reproduce" / paper / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{PAPERS[paper].title}: {len(steps)} experiments (each command's output: {logs})", flush=True)
    width = len(str(len(steps)))
    start_all = time.monotonic()
    for k, (step, args) in enumerate(steps, 1):
        shown = _shown(step.module, args)
        head = f"[{k:>{width}}/{len(steps)}] {shown}"
        if step.output and not overrides and Path(step.output).exists():
            print(f"{head}  done before ({step.output})", flush=True)
            continue
        print(head, end="  ", flush=True)
        log = logs / f"{k:02d}-{re.sub(r'[^A-Za-z0-9_.=+-]+', '_', ' '.join(args))[:80]}.log"
        start = time.monotonic()
        with open(log, "w") as fh:
            fh.write(f"$ {shown}\n")
            fh.flush()
            try:
                proc = subprocess.run([sys.executable, "-m", step.module, *args], stdout=fh, stderr=subprocess.STDOUT)
            except KeyboardInterrupt:
                print(flush=True)
                return (f"interrupted at [{k}/{len(steps)}] {shown}; run the same command again to go on "
                        f"(finished runs are kept)")
        elapsed = time.monotonic() - start
        if proc.returncode != 0:
            print(f"failed after {_duration(elapsed)}", flush=True)
            reason = failure_reason(log)
            return (f"experiment {k}/{len(steps)} of {paper} ({step.item}) failed with status {proc.returncode}: "
                    f"{reason + '; command: ' if reason else ''}{shown} (log: {log})")
        print(f"{_duration(elapsed)}{_sweep_note(log) if step.sweep else ''}", flush=True)
    print(f"{PAPERS[paper].title}: experiments done in {_duration(time.monotonic() - start_all)}", flush=True)
    return None


def missing_notebook_packages() -> List[str]:
    return [name for name in ("nbformat", "nbclient", "nbconvert", "ipykernel")
            if importlib.util.find_spec(name) is None]


def _jupyter_path_with_base_prefix() -> None:
    """A virtual environment made with ``--system-site-packages`` imports nbconvert from the base Python, whose
    ``share/jupyter`` (nbconvert's HTML templates) Jupyter's search path leaves out: add it (``JUPYTER_PATH``)."""
    base = Path(sys.base_prefix) / "share" / "jupyter"
    if sys.base_prefix == sys.prefix or not (base / "nbconvert" / "templates").is_dir():
        return
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if str(base) not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join(paths + [str(base)])


def execute_notebook(path: Path, html: Path, results: Path, timeout: Optional[int] = None,
                     kernel_log: Optional[Path] = None) -> Tuple[Optional[str], List[str]]:
    """Execute a notebook headless on ``results`` and write it as HTML (also when a cell fails); the kernel's own
    output (not the cells') goes to ``kernel_log``. Returns (the failing cell's error or None, the notebook's lines
    saying results are missing)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbconvert import HTMLExporter

    with warnings.catch_warnings():  # notebooks written before nbformat 4.5 have no cell ids; nbclient adds none
        warnings.filterwarnings("ignore", message="Cell is missing an id field")
        nb = nbformat.read(path, as_version=4)
    previous = os.environ.get("KVSTUDY_RESULTS")
    os.environ["KVSTUDY_RESULTS"] = str(results.resolve())  # the kernel inherits it
    error = None
    if kernel_log is not None:
        kernel_log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(kernel_log or os.devnull, "w") as log:  # the kernel's own output (solver banners, warnings)
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute(stdout=log, stderr=log)
    except CellExecutionError as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        error = lines[-1] if lines else repr(exc)
    finally:
        if previous is None:
            os.environ.pop("KVSTUDY_RESULTS", None)
        else:
            os.environ["KVSTUDY_RESULTS"] = previous
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Cell is missing an id field")
        _jupyter_path_with_base_prefix()
        body, _ = HTMLExporter().from_notebook_node(nb)
    html.parent.mkdir(parents=True, exist_ok=True)
    tmp = html.with_suffix(".html.tmp")
    tmp.write_text(body)
    tmp.replace(html)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    missing = sorted({ln.strip() for ln in text.splitlines() if "no results at" in ln or "not run (" in ln
                      or "no paper-size study" in ln})
    return error, missing


def run_notebooks(paper: str, results: Path) -> Optional[str]:
    names = PAPERS[paper].notebooks
    out = results / "reproduce" / paper
    for k, name in enumerate(names, 1):
        html = out / (Path(name).stem + ".html")
        print(f"[notebook {k}/{len(names)}] notebooks/{name} -> {html}", end="  ", flush=True)
        start = time.monotonic()
        try:
            error, missing = execute_notebook(NOTEBOOKS_DIR / name, html, results,
                                              kernel_log=out / "logs" / (Path(name).stem + ".kernel.log"))
        except KeyboardInterrupt:
            print(flush=True)
            return f"interrupted while executing notebooks/{name}"
        elapsed = time.monotonic() - start
        if error:
            print(f"failed after {_duration(elapsed)}", flush=True)
            return f"notebook notebooks/{name} failed on the results in {results}: {error} (partial HTML: {html})"
        print(_duration(elapsed), flush=True)
        for line in missing:
            print(f"  note: {line}", flush=True)
    return None


def shrink_figure(src: Path, dst: Path, dpi: float = 90, max_width: int = 1400) -> None:
    """A copy of a matplotlib PNG at about ``dpi`` (its own dpi read from the file), at most ``max_width``
    pixels wide, in a 256-colour palette: small enough for a docs page."""
    from PIL import Image

    with Image.open(src) as im:
        source_dpi = float(im.info.get("dpi", (110, 110))[0]) or 110.0
        im = im.convert("RGB")
        scale = min(1.0, dpi / source_dpi, max_width / im.width)
        if scale < 1.0:
            im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.LANCZOS)
        im = im.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".png.tmp")
        im.save(tmp, format="PNG", optimize=True, dpi=(dpi, dpi))
        tmp.replace(dst)


def copy_gallery(paper: str, results: Path) -> List[str]:
    """Copy the paper's gallery figures to GALLERY_DIR; the ones not found."""
    missing = []
    for rel in PAPERS[paper].gallery:
        src = results / rel
        if not src.exists():
            missing.append(str(src))
            continue
        shrink_figure(src, GALLERY_DIR / src.name)
    found = len(PAPERS[paper].gallery) - len(missing)
    print(f"gallery: {found} figure(s) of {paper} -> {GALLERY_DIR}", flush=True)
    return missing


def _chosen(module: str, args: Sequence[str]) -> List[Dict[str, List[str]]]:
    """The model, hardware and latency options one step runs (each a list: a sweep may choose several), read from
    conf/config.yaml's defaults, its experiment's ``override /group`` lines and sweeper params, a regime's latency
    override (conf/regime/), and its own arguments (a later one wins)."""
    import yaml

    groups = ("model", "hardware", "latency")
    out = {"model": ["llama2_70b"], "hardware": ["a100_tp2"], "latency": ["vidur"]}  # conf/config.yaml's defaults

    def apply(defaults, params):
        for entry in defaults or ():
            for k, v in (entry.items() if isinstance(entry, dict) else ()):
                g = str(k).replace("override", "").strip().lstrip("/")
                if g in groups:
                    out[g] = [str(v)]
        for k, v in (params or {}).items():
            if str(k).lstrip("+") in groups:
                out[str(k).lstrip("+")] = [x.strip() for x in str(v).split(",")]

    for arg in args:
        key, _, value = arg.partition("=")
        key = key.lstrip("+")
        if key in ("experiment", "regime"):
            path = REPO_ROOT / "conf" / key / f"{value}.yaml"
            doc = yaml.safe_load(path.read_text()) if path.exists() else {}
            apply(doc.get("defaults"), ((doc.get("hydra") or {}).get("sweeper") or {}).get("params"))
        elif key in groups:
            out[key] = [x.strip() for x in value.split(",")]
    return out


def predictor_pairs(steps) -> List[Tuple[str, str]]:
    """The (model, hardware) pairs whose Vidur predictor the steps use (latency=vidur): what a cold predictor cache
    trains first, once each (``kvstudy.optimum``'s study runs the paper's unit-time model and trains none)."""
    pairs = set()
    for step, args in steps:
        if step.module == "kvstudy.optimum":
            continue
        chosen = _chosen(step.module, args)
        if "vidur" in chosen["latency"]:
            pairs |= {(m, h) for m in chosen["model"] for h in chosen["hardware"]}
    return sorted(pairs)


def dry_run(papers: Sequence[str], jobs: Optional[int], overrides: Sequence[str], figures_only: bool) -> None:
    for paper in papers:
        steps = plan(paper, jobs, overrides)
        total = sum(s.seconds for s, _ in steps)
        pairs = predictor_pairs(steps)
        # the steps' seconds are measured with a warm predictor cache (Step.seconds); a cold cache first trains one
        # predictor per model and hardware: 20-90 s each on 2 cores (kvstudy/latency/models.py ``_train``'s estimate)
        cold = (f"; a cold predictor cache first trains {len(pairs)} predictor(s), 20-90 s each, longer for a "
                f"long-context model ({', '.join(f'{m} on {h}' for m, h in pairs)})") if pairs else ""
        print(f"# {PAPERS[paper].title}: {len(steps)} experiments, about {_duration(total)} on 2 cores with a warm "
              f"predictor cache{cold}" + (" (not run: --figures-only)" if figures_only else ""))
        for step, args in steps:
            print(("# " if figures_only else "") + _shown(step.module, args))
        for name in PAPERS[paper].notebooks:
            print(f"# then notebooks/{name} -> outputs/reproduce/{paper}/{Path(name).stem}.html")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    after = argv.index("--") if "--" in argv else len(argv)  # Hydra overrides follow --
    try:
        args = _parser().parse_args(argv[:after])
        args.overrides += argv[after + 1:]
        if args.paper != "all" and args.paper not in PAPERS:
            raise ConfigError(f"unknown paper '{args.paper}'; allowed: {', '.join(PAPERS)}, all")
        bad = [o for o in args.overrides if "=" not in o]
        if bad:
            raise ConfigError(f"'{bad[0]}' is not a Hydra override (key=value); overrides go after --, "
                             f"e.g. -- hardware=a100_vidur_default")
        if args.jobs is not None and args.jobs < 1:
            raise ConfigError(f"--jobs {args.jobs}: allowed a positive number of worker processes")
        check_step_overrides(list(PAPERS) if args.paper == "all" else [args.paper], args.jobs, args.overrides)
        prepare_dir("outputs", fix="run it from a folder where it can write outputs/", create=False)  # all goes there
    except ConfigError as exc:
        return report(exc)
    papers = list(PAPERS) if args.paper == "all" else [args.paper]
    if args.dry_run:
        dry_run(papers, args.jobs, args.overrides, args.figures_only)
        return 0
    missing = missing_notebook_packages()
    if missing:  # said before hours of experiments, not after
        print(f"error: executing the notebooks needs {', '.join(missing)} (not installed): {INSTALL_NOTEBOOKS}",
              file=sys.stderr)
        return 2
    gone = [NOTEBOOKS_DIR / n for paper in papers for n in PAPERS[paper].notebooks if not (NOTEBOOKS_DIR / n).is_file()]
    if gone:  # said before the experiments too: the notebooks come with the repository, not with the package
        print(f"error: {gone[0]}: no such notebook ({len(gone)} of the papers' notebooks missing); the notebooks are "
              f"in a clone of the repository (notebooks/): run from a clone with kvstudy installed from it "
              f"(pip install -e .)", file=sys.stderr)
        return 2
    results = Path("outputs")
    absent = []
    for paper in papers:
        if not args.figures_only:
            error = run_steps(paper, results, args.jobs, args.overrides)
            if error:
                print(f"error: {error}", file=sys.stderr)
                return 130 if error.startswith("interrupted") else 1
        error = run_notebooks(paper, results)
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 130 if error.startswith("interrupted") else 1
        if args.gallery:
            absent += copy_gallery(paper, results)
    for path in absent:
        print(f"note: gallery figure not found: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
