"""kvstudy's sweep launcher (``hydra/launcher=kvstudy``, the default for ``-m``): many runs per worker process.

A run of the papers' sweeps simulates in 0.02-0.2 s, while Hydra's per-job machinery (composing the config,
``run_job``'s logging and ``.hydra/`` files, joblib's dispatch) cost 0.3-0.5 s each (issue 27). This launcher
keeps the results identical and drops the overhead:

* one Hydra composition per distinct choice of config groups (``+algo=mcsf``, ``hardware=...``): the plain
  ``key=value`` overrides of each job are then applied to a copy as Hydra applies them (``OmegaConf.update``
  with merge, values parsed by Hydra's override parser), and ``hydra.job.override_dirname`` is computed by
  Hydra's own function, so every run lands in the folder and gets the config the other launchers give it (a
  test compares both for every job of a sweep);
* ``n_jobs`` forked worker processes (null, the default: one per core; a whole number >= 1 otherwise) each run a
  share of the jobs in turn, with the modules and the predictor tables already loaded;
* a finished run is recognised from its ``summary.json`` and resolved config (``api.run``), in milliseconds.

What a sweep prints: one line per run as it finishes (``#<job> <folder>: <status>, <completed>/<requests> requests,
mean e2e ...``, its warnings under it), no per-run progress bar (``engine.progress`` is off in a sweep's runs: the
bars of several workers would interleave with these lines), and at the end ``sweep done: N runs, C completed, S
skipped (already finished), F failed (error.txt in each), in T s: <sweep dir>``. The submitit launchers
(``hydra/launcher=local_submitit``, ``slurm``: ``hydra_plugins/kvstudy_sweeps/submitit_launchers.py``) print each
run's line and the same summary when their jobs are done.

Per run it writes what ``python -m kvstudy`` writes (``resolved_config.yaml``, the parquet tables,
``summary.json``), not Hydra's ``.hydra/`` folder or log file. A user error fails its own run (``error.txt``)
and the sweep goes on (``sweep_callback.FailedRuns`` counts them at the end). ``hydra/launcher=joblib``,
``basic`` and the submitit launchers remain available.
"""
from __future__ import annotations

import copy
import functools
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from kvstudy.errors import ConfigError
from kvstudy.running.folder_lock import BUSY_TEXT
from kvstudy.running.paths import CONF_DIR

#: compositions by the group-choosing overrides (filled before the workers fork, so they inherit them): the
#: task config (no ``hydra`` node) and the unresolved sweep dir, subdir and override_dirname settings
_BASES: Dict[Tuple[str, ...], Tuple[DictConfig, dict]] = {}
_PARSER = None


def _parser():
    global _PARSER
    if _PARSER is None:
        _PARSER = OverridesParser.create()
    return _PARSER


def _is_plain(o: Override) -> bool:
    """A ``key=value`` change of an existing key: applied after composition, as Hydra applies it."""
    key = o.key_or_group
    return (o.type == OverrideType.CHANGE and o.package is None and not o.is_sweep_override()
            and not key.startswith("hydra") and "/" not in key and not (CONF_DIR / key).is_dir())


def _is_policy_key(o: Override) -> bool:
    """``++policy.K=V``: a policy key on a sweep that chooses the policy (kvstudy/config/cli_overrides.py), set in the runs
    whose policy has the key."""
    return o.type == OverrideType.FORCE_ADD and o.package is None and not o.is_sweep_override() \
        and o.key_or_group.startswith("policy.")


@functools.lru_cache(maxsize=1 << 16)
def _composed_part(line: str):
    """One override's text as Hydra's parser gives it when it needs Hydra's composition, else None. Memoised per
    override text: a sweep's jobs share most of their overrides (``seed=0`` .. ``seed=9`` beside the same choices),
    and Hydra's parser costs ~1 ms per override (the reproduce pre-check asks this of ~4,000 jobs of one paper)."""
    o = _parser().parse_overrides([line])[0]
    return o.input_line if not _is_plain(o) and not _is_policy_key(o) else None


def signature(overrides: List[str]) -> Tuple[str, ...]:
    """The overrides that need Hydra's composition (group choices, additions, deletions, hydra.*)."""
    return tuple(part for part in map(_composed_part, overrides) if part is not None)


_ABSENT = object()


def remember(full: DictConfig, sig: Tuple[str, ...]) -> None:
    """Keep one composition (a full config from Hydra's loader) for every job with these group choices."""
    hydra_node = OmegaConf.to_container(full.hydra, resolve=False)
    _BASES[sig] = (task_config(full), {"sweep": hydra_node["sweep"],
                                       "dirname": hydra_node["job"]["config"]["override_dirname"]})


def job_config(sig: Tuple[str, ...], overrides: List[str], idx: int) -> Tuple[DictConfig, Path]:
    """The job's task config and run folder from the composition of its group choices: the plain overrides
    applied as Hydra applies them (``OmegaConf.update`` with merge, values parsed by Hydra's parser), the folder
    from the sweep dir and subdir with ``hydra.job.override_dirname`` computed by Hydra's function."""
    task, folder, _ = _job_paths(sig, overrides, idx)
    return task, folder


def _job_paths(sig: Tuple[str, ...], overrides: List[str], idx: int) -> Tuple[DictConfig, Path, Path]:
    """``job_config``, and the job's sweep dir."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    base, hyd = _BASES[sig]
    parsed = _parser().parse_overrides(list(overrides))
    task = copy.deepcopy(base)
    named = []  # the overrides the folder is named by: a policy key as the user wrote it, and only where it applies
    for o in parsed:
        if _is_policy_key(o):
            if OmegaConf.select(task, o.key_or_group, default=_ABSENT) is _ABSENT:
                continue  # this run's policy has no such setting: it runs, and is named, without it
            OmegaConf.update(task, o.key_or_group, o.value(), merge=True)
            o = _parser().parse_overrides([o.input_line[2:]])[0]
        elif _is_plain(o):
            try:
                OmegaConf.update(task, o.key_or_group, o.value(), merge=True)
            except OmegaConfBaseException:  # the run's option lacks the key (demand=high, an experiment's demand.load)
                group, _, rel = o.key_or_group.partition(".")
                option = OmegaConf.select(task, f"{group}.name", default=None)
                raise ConfigError(f"{o.input_line}: {group} '{option}' of this run has no {rel}; allowed: a key its "
                                  f"option has (a sweep's key=value sets a key, it adds none)") from None
        named.append(o)
    d = hyd["dirname"]
    dirname = get_overrides_dirname(overrides=named, exclude_keys=list(d["exclude_keys"]), item_sep=d["item_sep"],
                                     kv_sep=d["kv_sep"])
    # the sweep dir may interpolate the task (outputs/table1/${hardware.name}): resolve it against this job's task
    with open_dict(task):
        task.hydra = {"sweep": dict(hyd["sweep"]), "job": {"override_dirname": dirname, "id": idx, "num": idx}}
        sweep_dir = Path(str(task.hydra.sweep.dir))
        folder = sweep_dir / str(task.hydra.sweep.subdir)
        del task["hydra"]
    return task, folder, sweep_dir


def task_config(cfg: DictConfig) -> DictConfig:
    """What Hydra hands the task function: the config without its ``hydra`` node."""
    task = copy.deepcopy(cfg)
    with open_dict(task):
        del task["hydra"]
    return task


#: what became of a run, as the sweep's last line counts it
COMPLETED, SKIPPED, FAILED, UNFINISHED = "completed", "skipped", "failed", "unfinished"


def result_line(summary: dict) -> Tuple[str, str]:
    """(kind, the one line a sweep prints for a run) from its summary."""
    if summary.get("skipped"):
        return SKIPPED, "complete already, skipped"
    mean = (summary.get("e2e_latency") or {}).get("mean")
    line = f"{summary['status']}, {summary['completed']}/{summary['num_requests']} requests" + (
        f", mean e2e {mean:.4g}" if mean is not None else "")
    return (COMPLETED if summary["status"] == "completed" else UNFINISHED), line


def _run(job: Tuple[int, List[str], Tuple[str, ...]]) -> Tuple[int, str, str, str, str, List[str]]:
    """One run in a worker: (job index, run folder, sweep dir, kind, its line, its warnings). No progress bar (module
    docstring); the run's warnings are returned, to be printed under its line instead of across other lines."""
    from kvstudy.errors import KvStudyError
    from kvstudy.running.sweep_callback import ERROR_FILE, internal_error_text, record_error, run_recording_errors

    idx, overrides, sig = job
    folder = sweep_dir = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            task, folder, sweep_dir = _job_paths(sig, overrides, idx)
            if OmegaConf.select(task, "engine.progress", default=None) is not None:
                task.engine.progress = False  # the bars of several workers would interleave with the result lines
            summary = run_recording_errors(task, folder)
        except KvStudyError as exc:  # a bad composition (no folder yet) is said here; a run's error is in its folder
            kind, line = FAILED, f"error: {exc}"
        except KeyboardInterrupt:  # Ctrl-C outside a run's engine (training): in the launcher's own process, the
            if mp.parent_process() is None:  # launcher stops the sweep; in a worker, below
                raise
            summary = {"status": "interrupted"}
            kind, line = UNFINISHED, "interrupted (Ctrl-C) before the run started; nothing of it was written"
        except Exception as exc:  # not a user error: recorded with its traceback, the sweep goes on
            if folder is not None:
                record_error(folder, internal_error_text(exc))
            kind, line = FAILED, f"error: internal error {exc!r} (traceback in {ERROR_FILE})"
        else:
            kind, line = result_line(summary)
    notes = list(dict.fromkeys(str(w.message).strip() for w in caught))
    if kind == UNFINISHED and summary.get("status") == "interrupted" and mp.parent_process() is not None:
        # Ctrl-C reached this worker: its run is written (status interrupted); it takes no further job. A worker that
        # went on would block on the job queue the launcher holds while it stops the pool (Pool.terminate)
        sys.stdout.flush()
        os._exit(130)
    return idx, str(folder), str(sweep_dir), kind, line, notes


def summary_line(kinds: List[str], seconds: float, sweep_dirs, of: Optional[int] = None) -> str:
    """The sweep's last line: how many runs completed, were skipped, failed, ended otherwise; its folder(s).
    ``of``: the sweep was interrupted with that many runs in it (the count is of those that ended)."""
    count = {k: kinds.count(k) for k in (COMPLETED, SKIPPED, FAILED, UNFINISHED)}
    from kvstudy.running.paths import shown_path

    dirs = sorted({shown_path(d) for d in sweep_dirs if d and str(d) != "None"})
    ended = (f", {count[UNFINISHED]} ended without completing (their summary.json says why)"
             if count[UNFINISHED] else "")
    head = f"sweep done: {len(kinds)} runs" if of is None else f"sweep interrupted: {len(kinds)} of {of} runs ended"
    return (f"{head}, {count[COMPLETED]} completed, {count[SKIPPED]} skipped (already "
            f"finished), {count[FAILED]} failed (error.txt in each){ended}, in {seconds:.1f} s: "
            f"{', '.join(dirs) if dirs else '(no run ended, so no folder to name)'}")


def say_run(idx, folder: str, line: str, notes=()) -> None:
    from kvstudy.running.paths import shown_path

    print(f"#{idx} {shown_path(folder) if folder and folder != 'None' else folder}: {line}", flush=True)
    for note in notes:
        print(f"  warning: {note}", file=sys.stderr, flush=True)


def sweep_dir_of(run_folder, subdir: str) -> Path:
    """The sweep folder a run's folder is in: the run's folder without its ``hydra.sweep.subdir`` part. What a job
    reports as ``hydra.sweep.dir`` is not that folder: its ``${now:...}`` is resolved again when the launcher reads
    the job's config, seconds after the runs were placed (issue 54: ``sweep done`` named a folder that did not
    exist)."""
    run, depth = Path(run_folder), len(Path(str(subdir)).parts) if str(subdir) not in ("", ".") else 0
    if depth and run.parts[-depth:] == Path(str(subdir)).parts:
        return Path(*run.parts[:-depth])
    return run.parent


def folder_result(folder: Path, started: float) -> Tuple[str, str]:
    """(kind, line) of a run another launcher ran (submitit), read from its folder: ``error.txt``, or ``summary.json``
    (written before ``started``: a finished run the sweep skipped)."""
    from kvstudy.running.sweep_callback import ERROR_FILE

    error, summary_file = folder / ERROR_FILE, folder / "summary.json"
    if error.is_file():
        first = (error.read_text(errors="replace").strip().splitlines() or ["(empty error.txt)"])[0]
        return FAILED, f"error: {first}"
    if summary_file.is_file():
        try:
            summary = json.loads(summary_file.read_text())
        except ValueError:
            return FAILED, "error: summary.json cannot be read"
        if summary_file.stat().st_mtime < started:
            summary = {**summary, "skipped": True}
        return result_line(summary)
    return FAILED, "error: no summary.json and no error.txt (see the job's log)"


def _say_policy_keys(jobs) -> None:
    """Once per sweep: policy keys that some swept policies have no setting for (kvstudy/config/cli_overrides.py)."""
    missing: Dict[str, set] = {}
    having: Dict[str, set] = {}
    for _, overrides, sig in jobs:
        base = _BASES[sig][0]
        name = str(OmegaConf.select(base, "policy.name", default="?"))
        for o in _parser().parse_overrides(list(overrides)):
            if _is_policy_key(o):
                lacks = OmegaConf.select(base, o.key_or_group, default=_ABSENT) is _ABSENT
                (missing if lacks else having).setdefault(o.key_or_group, set()).add(name)
    for key, names in sorted(missing.items()):
        if not having.get(key):
            raise ConfigError(f"{key}: not a setting of any policy of this sweep ({', '.join(sorted(names))})")
        print(f"[kvstudy launcher] {key} applies to {', '.join(sorted(having[key]))}; "
              f"{', '.join(sorted(names))}: no such setting, run without it", flush=True)


def _distinct(jobs):
    """One job per run folder: a policy key swept over values its policy lacks (``-m +policy=vllm,rr
    policy.steps_before_preemption=5,10``) gives the same run twice; it runs once (said once)."""
    seen, kept, dropped = set(), [], 0
    for job in jobs:
        folder = job_config(job[2], job[1], job[0])[1]
        if folder in seen:
            dropped += 1
            continue
        seen.add(folder)
        kept.append(job)
    if dropped:
        print(f"[kvstudy launcher] {dropped} run(s) left out: the same config as another run of this sweep (a swept "
              f"policy key their policy has no setting for)", flush=True)
    return kept


def _count(key: str, value, null: str = "") -> Optional[int]:
    """A launcher setting that counts (``hydra.launcher.n_jobs``): a whole number >= 1 (or null where ``null`` says
    what it means), else one ``error:`` line and status 2 from here (Hydra would print the constructor's text)."""
    if value is None and null:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    from kvstudy.config.schema import show
    from kvstudy.errors import report

    allowed = "a whole number >= 1" + (f", or null ({null})" if null else "")
    sys.exit(report(ConfigError(f"hydra.launcher.{key}={show(value)}: allowed {allowed}")))


class BatchLauncher(Launcher):
    def __init__(self, n_jobs: Optional[int] = None, chunksize: int = 1) -> None:
        super().__init__()
        self.n_jobs = _count("n_jobs", n_jobs, null="one worker process per core")
        self.chunksize = _count("chunksize", chunksize)
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        start = time.monotonic()
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        jobs = []
        for k, overrides in enumerate(job_overrides):
            overrides = list(overrides)
            sig = signature(overrides)
            if sig not in _BASES:
                remember(self.hydra_context.config_loader.load_sweep_config(self.config, list(sig)), sig)
            jobs.append((initial_job_idx + k, overrides, sig))
        if any(o.startswith("++policy.") for _, overrides, _ in jobs for o in overrides):  # cli_overrides.py
            _say_policy_keys(jobs)
            jobs = _distinct(jobs)
        by_index = {job[0]: job[1] for job in jobs}
        workers = (os.cpu_count() or 1) if self.n_jobs is None else self.n_jobs
        workers = max(1, min(workers, len(jobs)))
        print(f"[kvstudy launcher] {len(jobs)} runs, {workers} worker process(es), "
              f"{len(_BASES)} composition(s)", flush=True)
        if workers == 1:
            results = map(_run, jobs)
        else:  # each run's line as it finishes
            pool = mp.get_context("fork").Pool(workers)
            results = pool.imap_unordered(_run, jobs, chunksize=self.chunksize)
        done: List[JobReturn] = []
        kinds, sweep_dirs = [], set()
        try:
            for idx, folder, sweep_dir, kind, line, notes in results:
                say_run(idx, folder, line, notes)
                kinds.append(kind)
                sweep_dirs.add(sweep_dir)
                ret = JobReturn(overrides=by_index[idx], cfg=None, hydra_cfg=None,
                                working_dir=os.getcwd(), task_name="kvstudy", status=JobStatus.COMPLETED,
                                _return_value=line)
                done.append((idx, ret))
        except KeyboardInterrupt:  # Ctrl-C: the runs under way stop (theirs: status interrupted), one line, 130
            print(summary_line(kinds, time.monotonic() - start, sweep_dirs, of=len(jobs)), flush=True)
            print(f"error: interrupted (Ctrl-C) after {len(kinds)} of {len(jobs)} runs; finished runs are kept, and "
                  f"the same command runs the rest (finished ones are skipped)", file=sys.stderr, flush=True)
            sys.exit(130)
        finally:
            if workers > 1:
                pool.terminate()
                pool.join()
        print(summary_line(kinds, time.monotonic() - start, sweep_dirs), flush=True)
        sys.stdout.flush()
        busy = sum(BUSY_TEXT in ret.return_value for _, ret in done)
        if busy:  # refused by a folder's lock: no error.txt (the folder is another command's), so said here
            print(f"error: {busy} run(s) not run: another process is writing their folders (the lines above); run "
                  f"the sweep again once it is done (finished runs are skipped)", file=sys.stderr, flush=True)
            sys.exit(2)
        return [ret for _, ret in sorted(done, key=lambda pair: pair[0])]


class LightSweeper(BasicSweeper):
    """Hydra's basic sweeper, whose check before launching composes every job's config (Table 1: 400 of them,
    ~0.3 s each, one after another). This one composes one job per distinct choice of config groups, which
    catches the same composition errors (an unknown option, a missing group); a plain ``key=value`` that does
    not apply fails its own run in the launcher. The compositions are kept for the launcher."""

    def sweep(self, arguments: List[str]):
        # a policy key given on the command line (``++policy.K=V``, kvstudy/config/cli_overrides.py) replaces the same key
        # in the experiment's sweep, as any command-line key replaces a sweep parameter in Hydra
        self._command_line_keys = {a.split("=", 1)[0].lstrip("+") for a in arguments if a.startswith("++policy.")}
        return super().sweep(arguments)

    def _parse_config(self) -> List[str]:
        keys = getattr(self, "_command_line_keys", set())
        return [f"{k}={v}" for k, v in self.params.items() if str(k).lstrip("+") not in keys]

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        assert self.config is not None and self.hydra_context is not None
        for overrides in batch:
            sig = signature(list(overrides))
            if sig not in _BASES:
                remember(self.hydra_context.config_loader.load_sweep_config(self.config, list(sig)), sig)
