"""The synthetic study of Jaillet et al. Sec. 5.1 against the hindsight IP, one seeded trial at a time.

Per trial: MC-SF's total latency, the best schedule large-neighbourhood search finds from it (``lns_passes``),
then CP-SAT from that one (``cpsat``; where CP-SAT proves optimality the exact method is skipped), the exact
method's status, incumbent, bound and gap (best schedule as warm start), the volume and block bounds,
optionally the LP relaxation with block rows (``lp``), and the solve times. A ratio MC-SF / OPT is exact only
where the exact method proved optimality; elsewhere it lies in [MC-SF / incumbent, MC-SF / best bound].

Trial i's instance depends only on (seed, model, i) (child i of ``SeedSequence([seed, model])``), so any
subset of trials (``only``) reproduces the same draws as the full study.

With ``out`` the rows are written after *every* trial, atomically (``kvstudy.running.atomic``): a study stopped or
crashed at trial k keeps trials 0..k-1 on disk. ``resume=True`` keeps the rows already in ``out`` and runs only
the missing trials, after checking that they were made with the same settings (the ``SETTINGS`` columns each
row carries); rows of other settings are refused with the field named, never mixed in. Each row also holds
the best schedule found (``start``, one start round per request) so it can be re-checked or reused.

``jobs > 1`` runs trials in a pool of spawned worker processes. A failed trial, Ctrl-C or SIGTERM terminates
the pool at once (queued and running trials stop; the finished ones are on disk) and SIGTERM surfaces as
``StudyStopped``, so nothing is left running when the study ends.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from kvstudy.running.atomic import write_atomic
from kvstudy.errors import ConfigError
from kvstudy.optimum.cpsat import DEFAULT_FORMULATION  # a name only: OR-Tools loads in CP-SAT's child process

# The arguments that change a trial's result, stored in every row (argument -> column) so a resumed file is
# never a mix. The CP-SAT budget is column "cpsat_work": column "cpsat" holds CP-SAT's schedule value.
SETTINGS = {"seed": "seed", "time_limit": "time_limit", "lns_passes": "lns_passes", "lns_window": "lns_window",
            "lns_span": "lns_span", "solver": "solver", "cut": "cut", "lp": "lp", "exact_max_n": "exact_max_n",
            "cpsat": "cpsat_work", "cpsat_formulation": "cpsat_formulation", "warm_start": "warm_start"}
# What files written before a setting existed ran (the only choice then); --resume reads them so.
_BEFORE = {"cpsat_formulation": "cumulative", "warm_start": ""}


def study(model: int, trials: int, time_limit: float, seed: int = 0, lns_passes: int = 0,
          lns_window: int = 5, solver: str = "highs", cut: int = 0, lp: bool = False,
          exact_max_n: int = 0, lns_span: int = 0, cpsat: float = 0.0, out: Optional[Path] = None,
          resume: bool = False, only: Optional[Iterable[int]] = None, jobs: int = 1,
          cpsat_formulation: str = DEFAULT_FORMULATION, warm_start: Optional[Path] = None) -> pd.DataFrame:
    """Run trials ``only`` (default 0..trials-1), ``jobs`` at a time in worker processes, and return one row
    per trial, sorted by trial. Rows do not depend on ``jobs`` except through wall-clock limits: LNS, CP-SAT
    (deterministic work budget) and the bounds give the same rows for any ``jobs``; the exact method's
    ``time_limit`` is in wall seconds, so where it stops can change when trials share the cores.
    ``warm_start``: a study file whose stored schedules (``warm_starts``) CP-SAT and the exact method start
    from where they beat LNS's (e.g. a long run on chosen draws from the best schedule any study found)."""
    settings = {"seed": int(seed), "time_limit": float(time_limit), "lns_passes": int(lns_passes),
                "lns_window": int(lns_window), "lns_span": int(lns_span), "solver": str(solver), "cut": int(cut),
                "lp": bool(lp), "exact_max_n": int(exact_max_n), "cpsat": float(cpsat),
                "cpsat_formulation": str(cpsat_formulation), "warm_start": str(warm_start or "")}
    wanted = _trial_list(trials, only)
    if solver not in ("highs", "gurobi", "branch"):
        raise ConfigError(f"study: solver={solver!r}; allowed 'highs', 'gurobi' or 'branch'")
    if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
        raise ConfigError(f"study: jobs={jobs!r}; allowed a whole number >= 1 (worker processes)")
    from kvstudy.optimum.cpsat import FORMULATIONS, require

    if cpsat_formulation not in FORMULATIONS:
        raise ConfigError(f"study: cpsat_formulation={cpsat_formulation!r}; allowed {', '.join(FORMULATIONS)}")
    if cpsat:  # settings refused before the first trial: below, a ConfigError from CP-SAT costs one trial only
        require(cpsat, "study --cpsat")
    if warm_start:  # every schedule re-checked now, so a bad file stops the study before its first trial
        warm_starts(Path(warm_start), model, seed, cut, wanted)
    rows = _resumed(out, model, settings) if resume else []
    done = {int(r["trial"]) for r in rows}
    todo = [t for t in wanted if t not in done]
    if jobs == 1 or len(todo) <= 1:
        for trial in todo:
            _keep(rows, run_trial(model, trial, **settings), settings, out)
        return pd.DataFrame(rows)
    import multiprocessing

    # spawn, not fork: forking a process that may already run HiGHS or OR-Tools threads is unsafe
    pool = multiprocessing.get_context("spawn").Pool(min(jobs, len(todo)))
    try:
        with _sigterm_stops():
            for row in pool.imap_unordered(_run_trial, [(model, t, settings) for t in todo]):
                _keep(rows, row, settings, out)
    except BaseException:  # a failed trial, Ctrl-C or SIGTERM: finished rows are on disk; the rest stop now
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
    return pd.DataFrame(rows)


class StudyStopped(BaseException):
    """SIGTERM reached a study running trials in worker processes. A BaseException, like KeyboardInterrupt, so
    no ``except Exception`` on the way swallows it; the command line reports it and exits with status 143."""


@contextmanager
def _sigterm_stops():
    """While trials run in workers, SIGTERM (``kill``, a cluster scheduler's stop) raises ``StudyStopped`` in
    this process instead of ending it at once, so ``study`` can terminate the workers. Ended outright, the
    parent leaves them orphaned, still working through the trials already queued to them. Only the main thread
    can set a handler; elsewhere SIGTERM keeps its default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise StudyStopped("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_trial(args: tuple) -> dict:
    """``run_trial`` for a worker process (``Pool.imap_unordered`` passes one argument)."""
    model, trial, settings = args
    return run_trial(model, trial, **settings)


def _keep(rows: list, row: dict, settings: dict, out: Optional[Path]) -> None:
    """Add a finished trial, with the settings that made it, and rewrite ``out`` atomically with every trial
    so far."""
    rows.append({**row, **{SETTINGS[k]: v for k, v in settings.items()}})
    rows.sort(key=lambda r: r["trial"])
    if out is not None:
        frame = pd.DataFrame(rows)
        write_atomic(out, lambda tmp: frame.to_parquet(tmp, index=False))


def has_schedule(start) -> bool:
    """Whether a row stores its schedule (files written before the ``start`` column hold None or NaN)."""
    return start is not None and not (isinstance(start, float) and np.isnan(start))


def seconds_spent(df: pd.DataFrame) -> pd.Series:
    """Per row, the seconds of every method the study ran (LNS, CP-SAT, the exact method, the LP)."""
    return sum(df[c].fillna(0.0) for c in ("lns_seconds", "cpsat_seconds", "seconds", "lp_seconds") if c in df)


def instance(model: int, trial: int, seed: int = 0, cut: int = 0):
    """Trial ``trial``'s Sec. 5.1 draw (first ``cut`` requests in arrival order if cut > 0)."""
    from kvstudy.optimum.instance import synthetic

    child = np.random.SeedSequence([seed, model], n_children_spawned=trial).spawn(1)[0]
    inst = synthetic(model, np.random.default_rng(child))
    if cut:  # the first `cut` requests in arrival order: Sec. 5.1's distribution at a size the IP can prove
        inst = type(inst)(inst.arrival[:cut], inst.prompt[:cut], inst.output[:cut], inst.capacity)
    return inst


def run_trial(model: int, trial: int, seed: int, time_limit: float, lns_passes: int, lns_window: int,
              lns_span: int, solver: str, cut: int, lp: bool, exact_max_n: int, cpsat: float,
              cpsat_formulation: str = DEFAULT_FORMULATION, warm_start: str = "") -> dict:
    from kvstudy.optimum.bounds import block_bound, volume_bound
    from kvstudy.optimum.branch import solve_instance
    from kvstudy.optimum.checker import check, total_latency
    from kvstudy.optimum.ip import solve
    from kvstudy.optimum.lns import improve
    from kvstudy.optimum.lp_bound import lp_bound
    from kvstudy.optimum.online import starts
    from kvstudy.policies.mcsf import MCSF

    inst = instance(model, trial, seed, cut)
    mcsf_start = starts(inst, MCSF())
    mcsf = check(inst, mcsf_start)
    best, best_start = mcsf, mcsf_start
    row = {"model": model, "trial": trial, "n": inst.n, "M": inst.capacity, "mcsf": mcsf}
    if lns_passes > 0:
        lns = improve(inst, mcsf_start, window=lns_window, max_passes=lns_passes, span=lns_span)
        row.update(lns=lns.objective, lns_moves=lns.moves, lns_seconds=lns.seconds)
        best, best_start = lns.objective, lns.start
    if warm_start:  # a stored schedule (checked by warm_starts) replaces LNS's when better; column "warm": its value
        stored = warm_starts(Path(warm_start), model, seed, cut, [trial]).get(trial)
        row["warm"] = total_latency(inst, stored) if stored is not None else np.nan
        if stored is not None and row["warm"] < best:
            best, best_start = int(row["warm"]), stored
    cp_proven = False
    small = exact_max_n <= 0 or inst.n <= exact_max_n
    if cpsat and small:  # CP-SAT from the best schedule so far (cpsat.py); a proof there skips the exact method
        from kvstudy.optimum.cpsat import improve as cp_improve

        try:
            cp = cp_improve(inst, best_start, cpsat, seed=seed, formulation=cpsat_formulation)
        except ConfigError as exc:  # one failed child (killed, out of memory) costs this trial's CP-SAT only
            row.update(cpsat=best, cpsat_status=f"error: {exc}", cpsat_bound=0.0, cpsat_seconds=np.nan)
            print(f"model {model} trial {trial:3d}: CP-SAT skipped, {exc}", flush=True)
        else:
            row.update(cpsat=cp.objective, cpsat_status=cp.status, cpsat_bound=cp.bound, cpsat_seconds=cp.seconds)
            best, best_start, cp_proven = cp.objective, cp.start, cp.proven_optimal
    row.update(volume_bound=volume_bound(inst), block_bound=block_bound(inst))
    bound = max(row["volume_bound"], row["block_bound"])
    if lp:  # LP relaxation with block rows; the best schedule's makespan is a valid horizon (lp_bound.py)
        res = lp_bound(inst, horizon=int((best_start + inst.output).max()))
        row.update(lp_bound=res.value, lp_seconds=res.seconds)
        bound = max(bound, res.value)
    if "cpsat_bound" in row:
        bound = max(bound, row["cpsat_bound"])
    status, proven, seconds = "skipped", False, 0.0
    if cp_proven:
        status, proven = "optimal (cpsat)", True
    elif time_limit > 0 and small:
        if solver == "branch":
            res = solve_instance(inst, warm_start=best_start, time_limit=time_limit)
        else:
            res = solve(inst, warm_start=best_start, time_limit=time_limit, solver=solver)
        status, proven, seconds = res.status, res.proven_optimal, res.seconds
        bound = max(bound, res.bound)
        if res.objective is not None and res.objective < best:
            best, best_start = res.objective, np.asarray(res.start)
    if proven:
        bound = best
    if check(inst, best_start) != best:  # every stored schedule is re-checked independently (checker.py)
        raise AssertionError(f"model {model} trial {trial}: stored schedule does not have latency {best}")
    row.update(ip_status=status, incumbent=best, bound=bound, proven_optimal=proven, seconds=seconds,
               ratio_low=mcsf / best, ratio_high=mcsf / bound if bound > 0 else np.inf,
               start=[int(x) for x in best_start])
    print(f"model {model} trial {trial:3d}: n={inst.n} M={inst.capacity} MC-SF {mcsf} "
          f"{'OPT' if proven else 'best'} {best} bound {bound:.0f} (IP {status}, {seconds:.1f} s; "
          f"LNS {row.get('lns_seconds', 0.0):.1f} s, CP-SAT {row.get('cpsat_seconds', 0.0):.1f} s)", flush=True)
    return row


def warm_starts(path: Path, model: int, seed: int, cut: int, trials: Iterable[int]) -> dict:
    """Trial -> start rounds, from the study file ``path`` (any study's ``--out``), for those of ``trials`` it
    holds a schedule for (files written before studies stored ``start`` hold none). The file must be of the same
    model, seed and cut (columns ``seed`` and ``cut`` where it has them), and every schedule is re-checked
    against the regenerated draw (``checker.check``): anything else is refused with the file, trial and field
    named, never used."""
    path = Path(path)
    where = f"study --warm-start {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file (allowed: a parquet file written by a study's --out)")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise ConfigError(f"{where}: cannot read it as parquet ({type(exc).__name__}: {exc})") from None
    missing = [c for c in ("model", "trial", "start") if c not in df.columns]
    if missing:
        raise ConfigError(f"{where}: no column(s) {missing}; allowed: a study file that stores schedules "
                          f"(column 'start', written since studies store them)")
    for field, value in (("model", model), ("seed", seed), ("cut", cut)):
        if field in df.columns and df[field].unique().tolist() != [value]:
            raise ConfigError(f"{where}: made with {field}={df[field].unique().tolist()}, this study has "
                              f"{field}={value}; allowed only a file of the same model, seed and cut")
    from kvstudy.optimum.checker import InfeasibleSchedule, check

    found = {}
    for trial in trials:
        rows = df[df["trial"] == trial]
        if len(rows) > 1:
            raise ConfigError(f"{where}: {len(rows)} rows for trial {trial}; allowed one per trial")
        if rows.empty or not has_schedule(rows.iloc[0]["start"]):
            continue
        start = np.asarray(rows.iloc[0]["start"], dtype=np.int64)
        try:
            check(instance(model, trial, seed, cut), start)
        except InfeasibleSchedule as exc:
            raise ConfigError(f"{where}: the schedule of trial {trial} does not fit its draw: {exc}") from None
        found[trial] = start
    return found


def _trial_list(trials: int, only: Optional[Iterable[int]]) -> list:
    if only is None:
        if trials < 1:
            raise ConfigError(f"study: trials={trials}; allowed a positive number")
        return list(range(trials))
    wanted = sorted({int(t) for t in only})
    bad = [t for t in wanted if t < 0]
    if not wanted or bad:
        raise ConfigError(f"study: only={list(only)}; allowed a non-empty list of trial numbers >= 0")
    return wanted


def _resumed(out: Optional[Path], model: int, settings: dict) -> list:
    """Rows already in ``out`` made with ``settings`` (none if the file does not exist yet)."""
    if out is None:
        raise ConfigError("study: resume needs an output file (--out) to resume from")
    out = Path(out)
    if not out.exists():
        return []
    try:
        old = pd.read_parquet(out)
    except Exception as exc:  # a file that is not ours: say which and why, do not overwrite it silently
        raise ConfigError(f"study --resume: cannot read {out} as parquet ({type(exc).__name__}: {exc})") from None
    for column, value in _BEFORE.items():
        if column not in old.columns:
            old[column] = value
    missing = [c for c in ("model", "trial", *SETTINGS.values()) if c not in old.columns]
    if missing:
        raise ConfigError(f"study --resume: {out} has no column(s) {missing} (written by an older kvstudy or "
                          f"another tool); rerun without --resume or choose another --out")
    for field, value in [("model", model), *((SETTINGS[k], v) for k, v in settings.items())]:
        stored = old[field].unique().tolist()
        if stored != [value]:
            raise ConfigError(f"study --resume: {out} was made with {field}={stored}, this run has "
                              f"{field}={value!r}; rerun with the same settings or choose another --out")
    return old.to_dict("records")


__all__ = ["SETTINGS", "StudyStopped", "instance", "run_trial", "seconds_spent", "study", "warm_starts"]
